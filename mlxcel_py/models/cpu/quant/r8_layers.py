"""Q4_K and Q6_K block layers repacked eight rows at a time (kquant_r8) for the models the fused step does
not run (gemma3, qwen3, phi3: arch.llama_like is False): their prompts' products (gguf_blocks.BlockLinear,
through mlx-lm's forward) and their decode step's (native.NativeDecoder) read the repacked rows with int8
activations (kblock.quantize) instead of dequantizing the file's blocks into float32 tiles for BLAS.

Measured on one layer of the 262k-vocabulary Gemma 3 270M, 2,048 rows, 2 threads (AMD EPYC Zen 4, avx512f
avx512_vnni): Q6_K 640 x 2,048 25.8 -> 18.8 ms (quantizing the input included), Q4_K 640 x 1,024
13.1 -> 8.5 ms; at 64 rows 1.5 -> 0.5 and 0.7 -> 0.2 ms. Each repacked matrix's file pages are dropped
(they come back only if something reads the file's layout): gguf_blocks.repack_block_layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numba
import numpy as np

from . import kblock
from .blocks import QuantWeight
from .kquant_r8 import AVAILABLE, REPACKED, ROWS, repack, stream_r8


@dataclass(frozen=True, slots=True)
class R8Weight:
    """A Q4_K or Q6_K matrix (qtype the GGUF type, shape (rows, columns)) as `repack` lays it out."""

    qtype: int
    shape: tuple[int, int]
    raw: np.ndarray  # (rows / 8, columns / 256 * GROUP_BYTES[qtype]) uint8


def repacked(w: QuantWeight) -> Optional[R8Weight]:
    """w repacked, or None: not Q4_K or Q6_K, not whole groups of 8 rows, or not this CPU's."""
    if not AVAILABLE or int(w.qtype) not in REPACKED or w.shape[0] % ROWS:
        return None
    return R8Weight(int(w.qtype), w.shape, repack(np.ascontiguousarray(w.blocks), int(w.qtype)))


def linear(x: np.ndarray, w: R8Weight, out: Optional[np.ndarray] = None, threads: Optional[int] = None) -> np.ndarray:
    """x (M, columns) float32 @ W.T -> (M, rows): x quantized per 256 (kblock), then the repacked product
    over numba's threads (each row's sum the same bits in any batch or thread count)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x of shape {x.shape} does not multiply a weight of shape {w.shape}")
    out = np.empty((x.shape[0], w.shape[0]), np.float32) if out is None else out
    threads = max(1, min(threads or numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    xq, xd, xs = kblock.quantize(x)
    stream_r8(w.qtype, xq, xd, xs, w.raw, out, threads, w.shape[1] // 256)
    return out


__all__ = ["R8Weight", "linear", "repacked"]
