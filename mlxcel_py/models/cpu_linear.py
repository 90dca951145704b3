"""Decode-shaped products for the CPU: `x @ w.T` for a few rows of x, streaming w once.

A decode step multiplies 1-8 rows by each weight matrix. OpenBLAS (through MLX or numpy)
packs the whole weight for such a GEMM and reads it two or three times; a GEMV streams it
once, but only for one row. This kernel reads each weight row once and dots it with every
input row while it is in L1, so the cost is the weight's bytes at the memory bus's speed.
Each output is one dot product in a fixed order: the result of a row does not depend on
the batch it is in (batched == single, bit for bit).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Rows above which OpenBLAS's GEMM (its packing amortized) beats streaming the weight per row.
MAX_STREAM_ROWS = 8


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _stream(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - jitted
    rows, k_dim = x.shape
    for n in prange(w.shape[0]):
        for b in range(rows):
            acc = np.float32(0.0)
            for k in range(k_dim):
                acc += x[b, k] * w[n, k]
            out[b, n] = acc


def linear(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`x @ w.T` for float32 x (B, K) and a C-contiguous w (N, K); returns (B, N)."""
    if x.shape[0] > MAX_STREAM_ROWS:
        return np.matmul(x, w.T, out=out)
    if out is None:
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    _stream(np.ascontiguousarray(x), w, out)
    return out
