"""Candidate c: decode products whose block loops are explicit LLVM vectors (vector_ir).

Per weight row, numba computes the float32 scale and offset of each 16 weights (scalar: one or
two per 32 weights, from the f16 and 6-bit fields), then one intrinsic call per 4 input rows
unpacks every 32 codes with vector ops straight from the file's blocks, dequantizes them in
registers and takes FMA dot products with the input rows. Types: VECTOR_TYPES.

numba caches a kernel by this file's source: after editing vector_ir, touch this file."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir

from . import int8_ir, vector_ir
from .kernels import quantize_rows_q8
from .unpack import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, _scale_min_k4, f16

VECTOR_TYPES = tuple(vector_ir.UNITS)  # GGUF type ids: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K


def _array(context, builder, aryty, value):
    return context.make_array(aryty)(context, builder, value)


def _dot_intrinsic(qtype):
    """`dot(row, scale, offset, x, b, count, out, n, units)`: out[b:b+count, n] = x[b:b+count] . row."""

    @intrinsic
    def dot(typingctx, row, scale, offset, x, b, count, out, n, units):
        if any(a.layout != "C" for a in (row, scale, offset, x, out)):
            return None  # the IR indexes rows as contiguous runs
        sig = types.void(row, scale, offset, x, b, count, out, n, units)

        def codegen(context, builder, signature, args):
            row_a, scale_a, offset_a, x_a, b_v, count_v, out_a, n_v, units_v = args
            aty = signature.args
            w = _array(context, builder, aty[0], row_a).data
            sc = _array(context, builder, aty[1], scale_a).data
            of = _array(context, builder, aty[2], offset_a).data
            xarr, oarr = _array(context, builder, aty[3], x_a), _array(context, builder, aty[6], out_a)
            k = cgutils.unpack_tuple(builder, xarr.shape, 2)[1]
            n_out = cgutils.unpack_tuple(builder, oarr.shape, 2)[1]
            end = builder.append_basic_block("dot_end")
            switch = builder.switch(count_v, end)
            for rows in range(1, vector_ir.MAX_ROWS + 1):
                block = builder.append_basic_block(f"rows{rows}")
                switch.add_case(ir.Constant(count_v.type, rows), block)
                builder.position_at_end(block)
                firsts = [builder.add(b_v, ir.Constant(b_v.type, r)) for r in range(rows)]
                xs = [builder.gep(xarr.data, [builder.mul(f, k)]) for f in firsts]
                sums = vector_ir.emit_row_dots(builder, qtype, rows, w, sc, of, xs, units_v)
                for f, value in zip(firsts, sums):
                    builder.store(value, builder.gep(oarr.data, [builder.add(builder.mul(f, n_out), n_v)]))
                builder.branch(end)
            builder.position_at_end(end)
            return context.get_dummy_value()

        return sig, codegen

    return dot


def _dot8_intrinsic(qtype):
    """`dot8(row, scale, offset, xq, xd, xs, b, count, out, n, units)`: candidate d (int8_ir) on
    the quantized rows b..b+count of x (quantize_x)."""

    @intrinsic
    def dot8(typingctx, row, scale, offset, xq, xd, xs, b, count, out, n, units):
        if any(a.layout != "C" for a in (row, scale, offset, xq, xd, xs, out)):
            return None
        sig = types.void(row, scale, offset, xq, xd, xs, b, count, out, n, units)

        def codegen(context, builder, signature, args):
            aty = signature.args
            w, sc, of = (_array(context, builder, aty[i], args[i]).data for i in range(3))
            xq_a, xd_a, xs_a = (_array(context, builder, aty[i], args[i]) for i in (3, 4, 5))
            b_v, count_v, oarr, n_v, units_v = args[6], args[7], _array(context, builder, aty[8], args[8]), args[9], args[10]
            strides = [cgutils.unpack_tuple(builder, a.shape, 2)[1] for a in (xq_a, xd_a, xs_a, oarr)]
            end = builder.append_basic_block("dot8_end")
            switch = builder.switch(count_v, end)
            for rows in range(1, vector_ir.MAX_ROWS + 1):
                block = builder.append_basic_block(f"rows{rows}")
                switch.add_case(ir.Constant(count_v.type, rows), block)
                builder.position_at_end(block)
                firsts = [builder.add(b_v, ir.Constant(b_v.type, r)) for r in range(rows)]
                ptrs = [[builder.gep(a.data, [builder.mul(f, k)]) for f in firsts] for a, k in zip((xq_a, xd_a, xs_a), strides)]
                sums = int8_ir.emit_row_dots(builder, qtype, rows, w, sc, of, *ptrs, units_v)
                for f, value in zip(firsts, sums):
                    builder.store(value, builder.gep(oarr.data, [builder.add(builder.mul(f, strides[3]), n_v)]))
                builder.branch(end)
            builder.position_at_end(end)
            return context.get_dummy_value()

        return sig, codegen

    return dot8


_dot_q4_0, _dot_q4_1, _dot_q8_0 = _dot_intrinsic(Q4_0), _dot_intrinsic(Q4_1), _dot_intrinsic(Q8_0)
_dot_q4_k, _dot_q6_k = _dot_intrinsic(Q4_K), _dot_intrinsic(Q6_K)
_dot8_q4_0, _dot8_q4_1, _dot8_q8_0 = _dot8_intrinsic(Q4_0), _dot8_intrinsic(Q4_1), _dot8_intrinsic(Q8_0)
_dot8_q4_k, _dot8_q6_k = _dot8_intrinsic(Q4_K), _dot8_intrinsic(Q6_K)


@njit(cache=True, nogil=True)
def row_scales(qtype, r, scale, offset):  # pragma: no cover - jitted
    """The float32 scale and offset of each 16 weights of a K-quant row r (as unpack.unpack_row's);
    the legacy types' f16 scales are read in the vector loop itself."""
    if qtype == Q4_K:
        for sb in range(scale.shape[0] // 16):
            base = sb * 144
            d, dmin = f16(r, base), f16(r, base + 2)
            for j in range(8):
                sc, m = _scale_min_k4(r, base + 4, j)
                scale[sb * 16 + 2 * j] = scale[sb * 16 + 2 * j + 1] = d * np.float32(sc)
                offset[sb * 16 + 2 * j] = offset[sb * 16 + 2 * j + 1] = -(dmin * np.float32(m))
    elif qtype == Q6_K:
        for sb in range(scale.shape[0] // 16):
            d = f16(r, sb * 210 + 208)
            for g in range(16):
                sc = np.int32(r[sb * 210 + 192 + g])
                scale[sb * 16 + g] = d * np.float32(sc - ((sc >> 7) << 8))



@njit(cache=True, nogil=True, inline="always")
def _row(qtype, r, scale, offset, x, b, count, out, n, units):  # pragma: no cover - jitted
    if qtype == Q4_0:
        _dot_q4_0(r, scale, offset, x, b, count, out, n, units)
    elif qtype == Q4_1:
        _dot_q4_1(r, scale, offset, x, b, count, out, n, units)
    elif qtype == Q8_0:
        _dot_q8_0(r, scale, offset, x, b, count, out, n, units)
    elif qtype == Q4_K:
        _dot_q4_k(r, scale, offset, x, b, count, out, n, units)
    elif qtype == Q6_K:
        _dot_q6_k(r, scale, offset, x, b, count, out, n, units)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_vector(qtype, x, raw, out, threads, units):  # pragma: no cover - jitted
    """out (B, N) = x (B, K) @ W.T for W's blocks raw (N, row bytes); `units` loop units per row."""
    n_rows, k, rows = raw.shape[0], x.shape[1], x.shape[0]
    for t in prange(threads):
        scale, offset = np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            r = raw[n]
            row_scales(qtype, r, scale, offset)
            for b in range(0, rows, 4):
                _row(qtype, r, scale, offset, x, b, min(4, rows - b), out, n, units)


@njit(cache=True, nogil=True)
def quantize_x(x):  # pragma: no cover - jitted
    """x (B, K) -> int8 codes (B, K), scales per 32 (B, K/32), d_x * sum(codes) per 16 (B, K/16)."""
    rows, k = x.shape
    xq, xd = np.empty((rows, k), np.int8), np.empty((rows, k // 32), np.float32)
    xsum, xs = np.empty((rows, k // 16), np.int32), np.empty((rows, k // 16), np.float32)
    quantize_rows_q8(x, xq, xd, xsum)
    for b in range(rows):
        for g in range(k // 16):
            xs[b, g] = xd[b, g >> 1] * np.float32(xsum[b, g])
    return xq, xd, xs


@njit(cache=True, nogil=True, inline="always")
def _row8(qtype, r, scale, offset, xq, xd, xs, b, count, out, n, units):  # pragma: no cover - jitted
    if qtype == Q4_0:
        _dot8_q4_0(r, scale, offset, xq, xd, xs, b, count, out, n, units)
    elif qtype == Q4_1:
        _dot8_q4_1(r, scale, offset, xq, xd, xs, b, count, out, n, units)
    elif qtype == Q8_0:
        _dot8_q8_0(r, scale, offset, xq, xd, xs, b, count, out, n, units)
    elif qtype == Q4_K:
        _dot8_q4_k(r, scale, offset, xq, xd, xs, b, count, out, n, units)
    elif qtype == Q6_K:
        _dot8_q6_k(r, scale, offset, xq, xd, xs, b, count, out, n, units)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_int8(qtype, xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """Candidate d: out (B, N) from quantize_x's rows and W's blocks raw (N, row bytes); AVX2 only."""
    n_rows, k, rows = raw.shape[0], xq.shape[1], xq.shape[0]
    for t in prange(threads):
        scale, offset = np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            r = raw[n]
            row_scales(qtype, r, scale, offset)
            for b in range(0, rows, 4):
                _row8(qtype, r, scale, offset, xq, xd, xs, b, min(4, rows - b), out, n, units)
