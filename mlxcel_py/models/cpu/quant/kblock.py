"""The K-quant decode products over super-block activations (kblock_ir.py): the activations'
quantizer (llama.cpp's Q8_K rule), the intrinsics, and the loops over a product's weight rows.

A product's input rows are quantized once per phase (`quantize_rows_q8k`); a weight row is then
read against up to 4 input rows in one call, or two short weight rows against one input row (their
integer chains interleave; vector.PAIR_ROW_BYTES), each sum the same bits whichever call computed it."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .kblock_ir import KBLOCK_TYPES, Q4_K, Q6_K, emit_kdots
from .kernels import quantize_groups
from .vector import _rows_loop
from .vector_intrinsics import _int8_intrinsic, _int8_pair_intrinsic

MAX_ROWS = 4  # input rows a call (vector._rows_loop's passes)


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_rows_q8k(x, xq, xd, xs):  # pragma: no cover - jitted
    """x (B, K), K a multiple of 256 -> int8 codes xq (B, K), a scale per 256 xd (B, K/256) and code
    sums per 16 xs (B, K/16, int16): int8_ir's rule (kernels.quantize_groups) over 256 values, not 32."""
    quantize_groups(x, xq, xd, xs, 256)


def activations(rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (codes, scales, sums) buffers for `rows` input rows of k values."""
    return np.empty((rows, k), np.int8), np.empty((rows, k // 256), np.float32), np.empty((rows, k // 16), np.int16)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (B, K) float32 -> (codes, scales, sums) of quantize_rows_q8k."""
    q = activations(*x.shape)
    quantize_rows_q8k(np.ascontiguousarray(x, dtype=np.float32), *q)
    return q


# d's and its pair's calls (vector_intrinsics) over kblock_ir's sums: `dot(row, xq, xd, xs, b, count, out, n,
# units)`, a weight row against input rows b..b+count; `dot2(raw, n, xq, xd, xs, b, out, col, units)`, two
# weight rows against input row b
_d_q4_k, _d_q6_k = (_int8_intrinsic(t, emit_kdots) for t in (Q4_K, Q6_K))
_e_q4_k, _e_q6_k = (_int8_pair_intrinsic(t, emit_kdots) for t in (Q4_K, Q6_K))


# Each type's loop over a product's weight rows: vector's, so short rows go two a call and long ones one
_rows_q4_k, _rows_q6_k = _rows_loop(_d_q4_k, _e_q4_k), _rows_loop(_d_q6_k, _e_q6_k)


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
