"""Prefill over quantized weights: x @ W.T for many rows, one dequantized tile of W at a time.

Each tile of weight rows is dequantized (exactly, products.dequantize_serial, on the calling thread:
numba's pool would fight BLAS's threads between tiles) into one reused float32 scratch buffer and
multiplied with the preloaded OpenBLAS (MLX's, models/cpu/blas.py; numpy's own where none is),
so no float32 copy of W stays resident: the extra memory is the scratch, at most TILE_BYTES
(16 MiB: all of a 1536x576 or 2048x2048 matrix, 2,048 rows of 2,048 columns, 512 of 8,192) for a
thread that calls this, plus BLAS's own packing. A matrix that fits one tile gives the f32 path's
result bit for bit; OpenBLAS rounds a split N differently (~1e-5 of the products)"""

from __future__ import annotations

import threading

import numpy as np

from . import products
from .blocks import QuantWeight
from ..blas import sgemm_nt

TILE_BYTES = 16 << 20
_local = threading.local()  # each engine thread its own scratch, reused across products


def tile_rows(w: QuantWeight, tile_bytes: int = TILE_BYTES) -> int:
    """Weight rows a tile holds: as many as fit `tile_bytes` of float32 (at least 16)."""
    return max(16, min(w.shape[0], tile_bytes // (4 * w.shape[1])))


def scratch_bytes(w: QuantWeight, tile_bytes: int = TILE_BYTES) -> int:
    """The float32 scratch `matmul_tiled` uses for `w`."""
    return tile_rows(w, tile_bytes) * w.shape[1] * 4


def _scratch(size: int) -> np.ndarray:
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(size, np.float32)
    return buf


FEW_ROWS = 8  # at most this many input rows over a matrix of several tiles: the streaming float kernel


def matmul(x: np.ndarray, w: QuantWeight) -> np.ndarray:
    """x (M, K) @ W.T: `matmul_tiled`, except a few rows against a matrix of several tiles (a 262k-row
    tied LM head for a prompt's last position), which the float vector kernel streams once (float
    activations, within 1e-6 of the tiles) instead of dequantizing every tile: Gemma 3 270M's head for
    one row 48 -> 8.6 ms (Zen 4, 2 threads). A matrix of one tile keeps the tiles' bits (the f32 path's)."""
    if x.shape[0] <= FEW_ROWS and tile_rows(w) < w.shape[0] and products._vector_reads(w.qtype, w.shape[1]):
        try:
            return products.linear_vector(np.ascontiguousarray(x, dtype=np.float32), w)
        except ValueError:  # a type the vector kernel does not read here
            pass
    return matmul_tiled(x, w)


def matmul_tiled(x: np.ndarray, w: QuantWeight, out: np.ndarray | None = None,
                 tile_bytes: int = TILE_BYTES) -> np.ndarray:
    """x (M, K) float32 @ W.T -> (M, N) float32, equal to x @ dequantize(W).T up to BLAS's summation order."""
    rows, k = w.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x of shape {x.shape} does not multiply a weight of shape {w.shape}")
    step = tile_rows(w, tile_bytes)
    scratch = _scratch(step * k)
    out = np.empty((x.shape[0], rows), np.float32) if out is None else out
    x = np.ascontiguousarray(x, dtype=np.float32)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        tile = scratch[: (stop - start) * k].reshape(stop - start, k)
        products.dequantize_serial(w.blocks[start:stop], w.qtype, tile)
        if not sgemm_nt(x, tile, out[:, start:stop]):
            np.matmul(x, tile.T, out=out[:, start:stop])
    return out
