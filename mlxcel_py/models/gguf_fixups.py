"""Adjustments to a built mlx-lm model that its config dict cannot express.

- llama3 RoPE: llama.cpp's converter stores the per-frequency factors as a `rope_freqs`
  tensor (the config's low/high frequency factors are not kept), so the rope takes them
  from the tensor directly, as llama.cpp does.
- gemma3: plain KV caches for every layer (the sliding window is applied by the mask), so
  the engine's batching and prompt-cache snapshots, which expect `KVCache`, work unchanged.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from .gguf_tensors import dense
from .gguf_arch import Arch
from .gguf_file import GGUFFile
from ..errors import ModelLoadError


class FactorRoPE(nn.Module):
    """RoPE (NEOX layout, as mlx-lm's llama) with llama.cpp's per-frequency divisors."""

    def __init__(self, dims: int, base: float, factors: np.ndarray):
        super().__init__()
        self.dims = dims
        self._freqs = mx.array((base ** (np.arange(0, dims, 2) / dims)) * factors, dtype=mx.float32)

    def __call__(self, x, offset=0):
        return mx.fast.rope(x, self.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=self._freqs)


def _rope_freqs(model, gguf: GGUFFile, args) -> None:
    info = gguf.tensors["rope_freqs.weight"]
    factors = np.asarray(dense(info)).reshape(-1)
    head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
    if factors.size != head_dim // 2:
        raise ModelLoadError(f"rope_freqs has {factors.size} factors, expected {head_dim // 2} in {gguf.path.name}")
    if args.rope_scaling:
        raise ModelLoadError(f"both rope_freqs and rope scaling {args.rope_scaling['type']!r} in {gguf.path.name}")
    rope = FactorRoPE(head_dim, float(args.rope_theta), factors)
    for layer in model.layers:
        layer.self_attn.rope = rope


def _full_kv_caches(model) -> None:
    num_layers = len(model.layers)
    # Instance attributes: the class stays mlx-lm's, so its module (and our CPU kernels) apply.
    model.make_cache = lambda: [KVCache() for _ in range(num_layers)]
    # Gemma3 always ties its head; the runner projects prefill logits through embed_tokens then.
    model.args.tie_word_embeddings = getattr(model, "tie_word_embeddings", False)


def apply_fixups(model, gguf: GGUFFile, arch: Arch, args) -> None:
    if "rope_freqs.weight" in gguf.tensors:
        if arch.name != "llama":
            raise ModelLoadError(f"unsupported tensor 'rope_freqs.weight' in {gguf.path.name} ({arch.name})")
        _rope_freqs(model, gguf, args)
    if "rope_factors_long.weight" in gguf.tensors and arch.name != "phi3":
        raise ModelLoadError(f"unsupported tensor 'rope_factors_long.weight' in {gguf.path.name} ({arch.name})")
    if arch.name == "gemma3":
        _full_kv_caches(model)
