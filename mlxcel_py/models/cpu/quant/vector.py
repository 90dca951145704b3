"""Candidates c and d: decode products whose block loops are explicit LLVM vectors.

One intrinsic call per weight row and up to 4 input rows unpacks every 32 codes with vector ops
straight from the file's blocks (scales included: f16, Q4_K's 6-bit pairs, Q6_K's int8), then
c (vector_ir) dequantizes them in registers and takes float FMA dot products with the input
rows, and d (int8_ir, AVX2) takes integer dot products with the rows quantized to int8.
Types: VECTOR_TYPES. Output rows are split over the threads in contiguous ranges. The intrinsics'
IR is built in vector_intrinsics.py; here each is dispatched on its type and driven."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import affine_ir, float_ir, kquant2, vector_ir  # these register Q5_0 .. Q5_K, A8, F16/BF16
from .kernels import quantize_rows_q8
from .vector_intrinsics import _dequant_intrinsic, _float_intrinsic, _int8_intrinsic, _int8_pair_intrinsic

from .affine_ir import A8
from .unpack import BF16, F16, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0

_REGISTERED = (kquant2, affine_ir, float_ir)  # imported for their types' registration with vector_ir
# Types with codes: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, then kquant2's, A8. F16/BF16 (float_ir) run through the
# same kernels but stay off this list, by which the native decode step picks its block products.
VECTOR_TYPES = tuple(t for t in vector_ir.UNITS if t not in float_ir.FLOAT_UNITS)

_c_q4_0, _c_q4_1, _c_q8_0, _c_q4_k, _c_q6_k = (_float_intrinsic(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K))
_d_q4_0, _d_q4_1, _d_q8_0, _d_q4_k, _d_q6_k = (_int8_intrinsic(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K))
_c_q5_0, _c_q5_1, _c_q2_k, _c_q3_k, _c_q5_k = (_float_intrinsic(t) for t in (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K))
_d_q5_0, _d_q5_1, _d_q2_k, _d_q3_k, _d_q5_k = (_int8_intrinsic(t) for t in (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K))
_c_a8, _d_a8 = _float_intrinsic(A8), _int8_intrinsic(A8)
_c_f16, _c_bf16 = _float_intrinsic(F16), _float_intrinsic(BF16)

# The per-type chains (_row_c, product_rows, _dequant_row, span._tile) stay written out: numba reaches an
# intrinsic from a runtime qtype only by such a chain; one table would need a switch intrinsic, not yet measured.


@njit(cache=True, nogil=True, inline="always")
def _row_c(qtype, r, x, b, count, out, n, units):  # pragma: no cover - jitted
    if qtype == Q4_0:
        _c_q4_0(r, x, b, count, out, n, units)
    elif qtype == Q4_1:
        _c_q4_1(r, x, b, count, out, n, units)
    elif qtype == Q8_0:
        _c_q8_0(r, x, b, count, out, n, units)
    elif qtype == Q4_K:
        _c_q4_k(r, x, b, count, out, n, units)
    elif qtype == Q6_K:
        _c_q6_k(r, x, b, count, out, n, units)
    elif qtype == Q5_0:
        _c_q5_0(r, x, b, count, out, n, units)
    elif qtype == Q5_1:
        _c_q5_1(r, x, b, count, out, n, units)
    elif qtype == Q2_K:
        _c_q2_k(r, x, b, count, out, n, units)
    elif qtype == Q3_K:
        _c_q3_k(r, x, b, count, out, n, units)
    elif qtype == Q5_K:
        _c_q5_k(r, x, b, count, out, n, units)
    elif qtype == A8:
        _c_a8(r, x, b, count, out, n, units)
    elif qtype == F16:
        _c_f16(r, x, b, count, out, n, units)
    elif qtype == BF16:
        _c_bf16(r, x, b, count, out, n, units)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_vector(qtype, x, raw, out, threads, units):  # pragma: no cover - jitted
    """c: out (B, N) = x (B, K) @ W.T for W's blocks raw (N, row bytes); `units` loop units per row."""
    n_rows, rows = raw.shape[0], x.shape[0]
    for t in prange(threads):
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            for b in range(0, rows, 4):
                _row_c(qtype, raw[n], x, b, min(4, rows - b), out, n, units)


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


# Weight rows of at most this many bytes go two a call at one input row; longer ones one a call. Two
# long rows read side by side stream from DRAM at a fraction of one row's speed (Zen 4, one thread:
# Q4_K rows of 864-1,152 bytes 3.2-5.9 against 12.5 GB/s, Q8_0 of 612-2,176 bytes 10-11 against 25-26),
# while short rows gain from the interleaved chains (Q4_0/Q4_1/Q5_0 rows of 324-396 bytes +15%).
PAIR_ROW_BYTES = 512
INPUT_TILE_BYTES = 64 * 1024  # a prompt's input rows in tiles of about this many bytes of codes (_rows_loop)


def _rows_loop(one, pair):
    """The loop over weight rows r0..r1 of one type (`one`: its d call, `pair`: two weight rows at one
    input row), so that a product branches on its type once, not per row: the chain inside the row
    loop cost 25% of the 1-row product (Q4_1, one thread: 6.9 against 9.1 GB/s; docs/CPU_DECODE.md)."""

    @njit(nogil=True, inline="always")
    def rows_loop(raw, r0, r1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
        count = xq.shape[0]
        if count == 1 and raw.shape[1] > PAIR_ROW_BYTES:
            for n in range(r0, r1):
                one(raw[n], xq, xd, xs, 0, 1, out, col + n, units)
            return
        if count == 1:  # two weight rows a call: their FMA chains interleave, each sum's bits unchanged
            for n in range(r0, r1 - 1, 2):
                pair(raw, n, xq, xd, xs, 0, out, col + n, units)
            if (r1 - r0) % 2:
                one(raw[r1 - 1], xq, xd, xs, 0, 1, out, col + r1 - 1, units)
            return
        # a prompt's many input rows in tiles of about INPUT_TILE_BYTES of codes, each tile against every
        # weight row of the task: the tile stays in L2 while the weight rows are read again per tile (the
        # same groups of 4 input rows per call, so the same sums)
        tile = max(4, INPUT_TILE_BYTES // xq.shape[1] // 4 * 4)
        for b0 in range(0, count, tile):
            b1 = min(count, b0 + tile)
            for n in range(r0, r1):
                for b in range(b0, b1, 4):
                    one(raw[n], xq, xd, xs, b, min(4, b1 - b), out, col + n, units)

    return rows_loop


_e_q4_0, _e_q4_1, _e_q8_0, _e_q4_k = (_int8_pair_intrinsic(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K))
_e_q5_0, _e_q5_1, _e_q2_k, _e_q3_k, _e_q5_k = (_int8_pair_intrinsic(t) for t in (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K))
_e_a8 = _int8_pair_intrinsic(A8)


@njit(nogil=True, inline="always")
def _e_q6_k(raw, n, xq, xd, xs, b, out, col, units):  # pragma: no cover - jitted
    """Q6_K's two rows one at a time: two a call spill registers (measured 16% slower)."""
    _d_q6_k(raw[n], xq, xd, xs, b, 1, out, col, units)
    _d_q6_k(raw[n + 1], xq, xd, xs, b, 1, out, col + 1, units)


_r_q4_0, _r_q4_1, _r_q8_0, _r_q4_k, _r_q6_k = (_rows_loop(*p) for p in (
    (_d_q4_0, _e_q4_0), (_d_q4_1, _e_q4_1), (_d_q8_0, _e_q8_0), (_d_q4_k, _e_q4_k), (_d_q6_k, _e_q6_k)))
_r_q5_0, _r_q5_1, _r_q2_k, _r_q3_k, _r_q5_k, _r_a8 = (_rows_loop(*p) for p in (
    (_d_q5_0, _e_q5_0), (_d_q5_1, _e_q5_1), (_d_q2_k, _e_q2_k), (_d_q3_k, _e_q3_k), (_d_q5_k, _e_q5_k), (_d_a8, _e_a8)))


@njit(cache=True, nogil=True, inline="always")
def product_rows(qtype, raw, r0, r1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    """out[:, col + r0 .. col + r1] = quantize_x's rows . weight rows r0..r1 of W's blocks raw (d)."""
    if qtype == Q4_0:
        _r_q4_0(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q4_1:
        _r_q4_1(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q8_0:
        _r_q8_0(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q4_K:
        _r_q4_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q6_K:
        _r_q6_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q5_0:
        _r_q5_0(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q5_1:
        _r_q5_1(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q2_K:
        _r_q2_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q3_K:
        _r_q3_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == Q5_K:
        _r_q5_k(raw, r0, r1, xq, xd, xs, out, col, units)
    elif qtype == A8:
        _r_a8(raw, r0, r1, xq, xd, xs, out, col, units)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_int8(qtype, xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """d: out (B, N) from quantize_x's rows and W's blocks raw (N, row bytes); AVX2 only."""
    n_rows = raw.shape[0]
    for t in prange(threads):
        product_rows(qtype, raw, t * n_rows // threads, (t + 1) * n_rows // threads, xq, xd, xs, out, 0, units)


_q_q4_0, _q_q4_1, _q_q8_0, _q_q4_k, _q_q6_k = (_dequant_intrinsic(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K))
_q_q5_0, _q_q5_1, _q_q2_k, _q_q3_k, _q_q5_k = (_dequant_intrinsic(t) for t in (Q5_0, Q5_1, Q2_K, Q3_K, Q5_K))
_q_a8 = _dequant_intrinsic(A8)
_q_f16, _q_bf16 = _dequant_intrinsic(F16), _dequant_intrinsic(BF16)


@njit(cache=True, nogil=True, inline="always")
def _dequant_row(qtype, row, out, units):  # pragma: no cover - jitted
    """One weight row's blocks -> out (K,) float32, by type (VECTOR_TYPES and F16/BF16)."""
    if qtype == Q4_0:
        _q_q4_0(row, out, units)
    elif qtype == Q4_1:
        _q_q4_1(row, out, units)
    elif qtype == Q8_0:
        _q_q8_0(row, out, units)
    elif qtype == Q4_K:
        _q_q4_k(row, out, units)
    elif qtype == Q6_K:
        _q_q6_k(row, out, units)
    elif qtype == Q5_0:
        _q_q5_0(row, out, units)
    elif qtype == Q5_1:
        _q_q5_1(row, out, units)
    elif qtype == Q2_K:
        _q_q2_k(row, out, units)
    elif qtype == Q3_K:
        _q_q3_k(row, out, units)
    elif qtype == Q5_K:
        _q_q5_k(row, out, units)
    elif qtype == A8:
        _q_a8(row, out, units)
    elif qtype == F16:
        _q_f16(row, out, units)
    elif qtype == BF16:
        _q_bf16(row, out, units)


@njit(cache=True, nogil=True, parallel=True)
def dequant_rows(qtype, raw, out, threads, units):  # pragma: no cover - jitted
    """raw (N, row bytes) -> out (N, K) float32 for VECTOR_TYPES, rows split over the threads."""
    n_rows = raw.shape[0]
    for t in prange(threads):
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            _dequant_row(qtype, raw[n], out[n], units)


@njit(cache=True, nogil=True)
def dequant_rows_serial(qtype, raw, out, units):  # pragma: no cover - jitted
    """dequant_rows on the calling thread: prefill's tiles alternate with BLAS calls, and waking numba's
    pool between them cost 40x the work (5.7 ms against 0.14 ms for a 1536x576 Q4_1 tile)."""
    for n in range(raw.shape[0]):
        _dequant_row(qtype, raw[n], out[n], units)
