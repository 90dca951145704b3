"""Block layers repacked eight rows at a time (kquant_r8: Q4_K, Q6_K, Q5_0, Q8_0) for the models the fused
step does not run (gemma3, qwen3, phi3: arch.llama_like is False): their prompts' products
(gguf_blocks.BlockLinear, through mlx-lm's forward) and their decode step's (native.NativeDecoder) read
the repacked rows with int8 activations (per 256 for the K-quants, kblock.quantize; per 32 for Q5_0 and
Q8_0, Q8_0's rule) instead of dequantizing the file's blocks into float32 tiles for BLAS.

One layer of the 262k-vocabulary Gemma 3 270M, 2,048 rows, 2 threads (AMD EPYC Zen 4, avx512_vnni):
200-350 GFLOP/s against the tiles' 140-210 (docs/CPU_DECODE.md). Each repacked matrix's file pages are
dropped (they come back only if something reads the file's layout): gguf_blocks.repack_block_layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numba
import numpy as np

from . import kblock
from .blocks import QuantWeight
from .kernels import quantize_rows_q8
from .kquant_r8 import AVAILABLE, R8_TYPES, ROWS, VALUES, repack, stream_r8


@dataclass(frozen=True, slots=True)
class R8Weight:
    """A Q4_K, Q6_K, Q5_0 or Q8_0 matrix (qtype the GGUF type, shape (rows, columns)) as `repack` lays it out."""

    qtype: int
    shape: tuple[int, int]
    raw: np.ndarray  # (rows / 8, blocks a row * GROUP_BYTES[qtype]) uint8


def repacked(w: QuantWeight) -> Optional[R8Weight]:
    """w repacked, or None: not one of R8_TYPES, not whole groups of 8 rows, or not this CPU's."""
    if not AVAILABLE or int(w.qtype) not in R8_TYPES or w.shape[0] % ROWS:
        return None
    return R8Weight(int(w.qtype), w.shape, repack(np.ascontiguousarray(w.blocks), int(w.qtype)))


def linear(x: np.ndarray, w: R8Weight, out: Optional[np.ndarray] = None, threads: Optional[int] = None) -> np.ndarray:
    """x (M, columns) float32 @ W.T -> (M, rows): x quantized per 256 (kblock) for the K-quants, per 32
    (Q8_0's rule) for Q5_0 and Q8_0, then the repacked product over numba's threads (each row's sum the
    same bits in any batch or thread count)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x of shape {x.shape} does not multiply a weight of shape {w.shape}")
    out = np.empty((x.shape[0], w.shape[0]), np.float32) if out is None else out
    threads = max(1, min(threads or numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    values = VALUES[w.qtype]
    if values == 256:
        xq, xd, xs = kblock.quantize(x)
    else:
        xq, xd, xs = np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // 32), np.float32), \
            np.empty((x.shape[0], x.shape[1] // 16), np.int32)
        quantize_rows_q8(x, xq, xd, xs)
    stream_r8(w.qtype, xq, xd, xs, w.raw, out, threads, w.shape[1] // values)
    return out


__all__ = ["R8Weight", "linear", "repacked"]
