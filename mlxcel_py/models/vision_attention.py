"""The vision tower's attention through numpy on the CPU (the CPU path's float32 towers only).

A SigLIP encoder layer attends over all of an image's patches, both ways: at Gemma 3's 4,096 patches and
16 heads, MLX's CPU attention spends its time in a scalar softmax over 16 x 4,096 x 4,096 scores. The
text model's prefill attention kernel (models/cpu/prefill_attention.py: tiles of queries over their
keys, in parallel, numpy's vectorized exp) runs it over every key instead; measured in docs/VISION.md.
Each encoder layer's attention module is wrapped in place (per model, no global state); a masked call
goes to the wrapped module unchanged."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cpu.prefill_attention import run_tiles, tile_queries


class NumpyAttention(nn.Module):
    """mlx-vlm's VisionAttention (q/k/v/out projections, `num_heads`, `scale`) with numpy's attention."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: Any = None) -> mx.array:
        a = self.inner
        if mask is not None:
            return a(x, mask)
        batch, length, _ = x.shape
        heads = [p(x).reshape(batch, length, a.num_heads, -1).transpose(0, 2, 1, 3)
                 for p in (a.q_proj, a.k_proj, a.v_proj)]
        q, k, v = (np.ascontiguousarray(np.asarray(h.astype(mx.float32))) for h in heads)
        tiles = full_tiles(length)
        out = np.stack([run_tiles(q[b], k[b], v[b], float(a.scale), tiles) for b in range(batch)])
        return a.out_proj(mx.array(out).astype(x.dtype).transpose(0, 2, 1, 3).reshape(batch, length, -1))


def full_tiles(length: int) -> list:
    """run_tiles' tiles for every query over every key (no mask)."""
    step = tile_queries(length, 1)
    return [(q0, min(length, q0 + step), 0, length, np.zeros(min(length, q0 + step) - q0, np.int64),
             np.full(min(length, q0 + step) - q0, length, np.int64)) for q0 in range(0, length, step)]


def install(tower: Any) -> int:
    """Wrap each encoder layer's attention of an mlx-vlm SigLIP tower; returns how many were wrapped."""
    layers = getattr(getattr(getattr(tower, "vision_model", None), "encoder", None), "layers", [])
    wrapped = 0
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if attention is not None and not isinstance(attention, NumpyAttention) and hasattr(attention, "q_proj"):
            layer.self_attn = NumpyAttention(attention)
            wrapped += 1
    return wrapped
