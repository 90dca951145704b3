"""The K-quant decode products over super-block activations (kblock_ir.py): the activations'
quantizer (llama.cpp's Q8_K rule), the intrinsics, and the loops over a product's weight rows.

A product's input rows are quantized once per phase (`quantize_rows_q8k`); a weight row is then
read against up to 4 input rows in one call, or two short weight rows against one input row (their
integer chains interleave; vector.PAIR_ROW_BYTES), each sum the same bits whichever call computed it."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kblock_ir import KBLOCK_TYPES, Q4_K, Q6_K, emit_kdots
from .vector import PAIR_ROW_BYTES
from .vector_intrinsics import _contiguous, _rows_switch

MAX_ROWS = 4


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_rows_q8k(x, xq, xd, xs):  # pragma: no cover - jitted
    """x (B, K), K a multiple of 256 -> int8 codes xq (B, K), a scale per 256 xd (B, K/256) and
    code sums per 16 xs (B, K/16, int16): d = max|x| / 127, q = round half away from 0 of x / d
    (int8_ir's rule over 256 values instead of 32), so |q| <= 127."""
    for b in range(x.shape[0]):
        for j in range(x.shape[1] // 256):
            amax = np.float32(0.0)
            for i in range(256):
                amax = max(amax, abs(x[b, j * 256 + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            xd[b, j] = d
            for g in range(16):
                total = 0
                for i in range(16):
                    v = x[b, j * 256 + g * 16 + i] * inv
                    q = np.int32(v + np.float32(0.5)) if v >= 0 else -np.int32(np.float32(0.5) - v)
                    xq[b, j * 256 + g * 16 + i] = q
                    total += q
                xs[b, j * 16 + g] = total


def activations(rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (codes, scales, sums) buffers for `rows` input rows of k values."""
    return np.empty((rows, k), np.int8), np.empty((rows, k // 256), np.float32), np.empty((rows, k // 16), np.int16)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (B, K) float32 -> (codes, scales, sums) of quantize_rows_q8k."""
    q = activations(*x.shape)
    quantize_rows_q8k(np.ascontiguousarray(x, dtype=np.float32), *q)
    return q


def _width(builder, a):
    return cgutils.unpack_tuple(builder, a.shape, 2)[1]


def _dot_intrinsic(qtype):
    """`dot(row, xq, xd, xs, b, count, out, n, units)`: out[b:b+count, n] = input rows b.. . W row."""

    @intrinsic
    def dot(typingctx, row, xq, xd, xs, b, count, out, n, units):
        if not _contiguous(row, xq, xd, xs, out):
            return None

        def codegen(context, builder, signature, args):
            row_a, xq_a, xd_a, xs_a, out_a = (context.make_array(signature.args[i])(context, builder, args[i])
                                              for i in (0, 1, 2, 3, 6))
            b, count, n = args[4], args[5], args[7]

            def emit(rows):
                firsts = [builder.add(b, ir.Constant(b.type, r)) for r in range(rows)]
                ptrs = [[builder.gep(a.data, [builder.mul(f, _width(builder, a))]) for f in firsts] for a in (xq_a, xd_a, xs_a)]
                for f, value in zip(firsts, emit_kdots(builder, qtype, [row_a.data], *ptrs, args[8])):
                    builder.store(value, builder.gep(out_a.data, [builder.add(builder.mul(f, _width(builder, out_a)), n)]))

            return _rows_switch(context, builder, count, emit, MAX_ROWS)

        return types.void(row, xq, xd, xs, b, count, out, n, units), codegen

    return dot


def _pair_intrinsic(qtype):
    """`dot2(raw, n, xq, xd, xs, b, out, col, units)`: out[b, col + k] = x[b] . raw[n + k], k = 0, 1."""

    @intrinsic
    def dot2(typingctx, raw, n, xq, xd, xs, b, out, col, units):
        if not _contiguous(raw, xq, xd, xs, out):
            return None

        def codegen(context, builder, signature, args):
            raw_a, xq_a, xd_a, xs_a, out_a = (context.make_array(signature.args[i])(context, builder, args[i])
                                              for i in (0, 2, 3, 4, 6))
            n, b, col = args[1], args[5], args[7]
            rows = [builder.gep(raw_a.data, [builder.mul(builder.add(n, ir.Constant(n.type, k)), _width(builder, raw_a))])
                    for k in (0, 1)]
            xs = [[builder.gep(a.data, [builder.mul(b, _width(builder, a))])] for a in (xq_a, xd_a, xs_a)]
            for k, value in enumerate(emit_kdots(builder, qtype, rows, *xs, args[8])):
                at = builder.add(builder.mul(b, _width(builder, out_a)), builder.add(col, ir.Constant(col.type, k)))
                builder.store(value, builder.gep(out_a.data, [at]))
            return context.get_dummy_value()

        return types.void(raw, n, xq, xd, xs, b, out, col, units), codegen

    return dot2


_d_q4_k, _d_q6_k = _dot_intrinsic(Q4_K), _dot_intrinsic(Q6_K)
_e_q4_k, _e_q6_k = _pair_intrinsic(Q4_K), _pair_intrinsic(Q6_K)


@njit(nogil=True, inline="always")
def _rows_q4_k(raw, r0, r1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    count = xq.shape[0]
    if count == 1 and raw.shape[1] > PAIR_ROW_BYTES:
        for n in range(r0, r1):
            _d_q4_k(raw[n], xq, xd, xs, 0, 1, out, col + n, units)
        return
    if count == 1:
        for n in range(r0, r1 - 1, 2):
            _e_q4_k(raw, n, xq, xd, xs, 0, out, col + n, units)
        if (r1 - r0) % 2:
            _d_q4_k(raw[r1 - 1], xq, xd, xs, 0, 1, out, col + r1 - 1, units)
        return
    for n in range(r0, r1):
        for b in range(0, count, MAX_ROWS):
            _d_q4_k(raw[n], xq, xd, xs, b, min(MAX_ROWS, count - b), out, col + n, units)


@njit(nogil=True, inline="always")
def _rows_q6_k(raw, r0, r1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    count = xq.shape[0]
    if count == 1 and raw.shape[1] > PAIR_ROW_BYTES:
        for n in range(r0, r1):
            _d_q6_k(raw[n], xq, xd, xs, 0, 1, out, col + n, units)
        return
    if count == 1:
        for n in range(r0, r1 - 1, 2):
            _e_q6_k(raw, n, xq, xd, xs, 0, out, col + n, units)
        if (r1 - r0) % 2:
            _d_q6_k(raw[r1 - 1], xq, xd, xs, 0, 1, out, col + r1 - 1, units)
        return
    for n in range(r0, r1):
        for b in range(0, count, MAX_ROWS):
            _d_q6_k(raw[n], xq, xd, xs, b, min(MAX_ROWS, count - b), out, col + n, units)


@njit(cache=True, nogil=True, inline="always")
def kblock_rows(qtype, raw, r0, r1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    """out[:, col + r0 .. col + r1] = quantize_rows_q8k's rows . weight rows r0..r1 of W's blocks raw."""
    if qtype == Q4_K:
        _rows_q4_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q6_K:
        _rows_q6_k(raw, r0, r1, xq, xd, xs, out, col, units)


@njit(cache=True, nogil=True, parallel=True)
def stream_kblock(qtype, xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """out (B, N) from quantize_rows_q8k's rows and W's blocks raw (N, row bytes), rows split over threads."""
    n_rows = raw.shape[0]
    for t in prange(threads):
        kblock_rows(qtype, raw, t * n_rows // threads, (t + 1) * n_rows // threads, xq, xd, xs, out, 0, units)


__all__ = ["KBLOCK_TYPES", "activations", "kblock_rows", "quantize", "quantize_rows_q8k", "stream_kblock"]
