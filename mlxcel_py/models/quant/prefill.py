"""Prefill over quantized weights: x @ W.T for many rows, one dequantized tile of W at a time.

Each tile of `tile_rows` weight rows is dequantized (exactly, products.dequantize_into) into one
reused float32 scratch buffer and multiplied with numpy's BLAS, so no float32 copy of W stays
resident: the extra memory is the scratch, tile_rows x in_features x 4 bytes (256 rows:
576 KiB for 576 columns, 2 MiB for 2,048, 8 MiB for 8,192), plus BLAS's own packing."""

from __future__ import annotations

import numba
import numpy as np

from . import products
from .blocks import QuantWeight

TILE_ROWS = 256


def scratch_bytes(w: QuantWeight, tile_rows: int = TILE_ROWS) -> int:
    """The float32 scratch `matmul_tiled` uses for `w`."""
    return min(tile_rows, w.shape[0]) * w.shape[1] * 4


def matmul_tiled(x: np.ndarray, w: QuantWeight, out: np.ndarray | None = None, tile_rows: int = TILE_ROWS,
                 scratch: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """x (M, K) float32 @ W.T -> (M, N) float32; `scratch` (tile_rows, K) float32 may be passed to reuse."""
    rows, k = w.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x of shape {x.shape} does not multiply a weight of shape {w.shape}")
    tile_rows = min(tile_rows, rows)
    if scratch is None or scratch.shape[0] < tile_rows or scratch.shape[1] != k:
        scratch = np.empty((tile_rows, k), np.float32)
    out = np.empty((x.shape[0], rows), np.float32) if out is None else out
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_threads = numba.get_num_threads() if threads is None else threads
    for start in range(0, rows, tile_rows):
        stop = min(start + tile_rows, rows)
        tile = scratch[: stop - start]
        products.dequantize_into(w.blocks[start:stop], w.qtype, tile, n_threads)
        np.matmul(x, tile.T, out=out[:, start:stop])
    return out
