"""KV storage types (--cache-type-k / --cache-type-v): which caches a model gets, what a token costs.

The model's own dtype ("native", the default) keeps mlx-lm's KVCache / BatchKVCache, which
the CPU decode step writes into. Any other type uses kv_cache.py's typed and quantized caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ...errors import ConfigError
from .kv_cache import (
    GROUP_SIZE, Codec, QuantizedKVBatch, QuantizedKVRow, TypedBatchKVCache, TypedKVCache, slice_parts, arrays,
)

__all__ = ["KV_TYPES", "KVLayout", "QuantizedKVBatch", "TypedBatchKVCache", "adopt", "arrays", "bytes_per_token",
           "make_cache", "resolve_layout", "snapshot"]

FLOAT_TYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
QUANT_BITS = {"q8_0": 8, "q4_0": 4}
KV_TYPES = tuple(FLOAT_TYPES) + tuple(QUANT_BITS)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The resolved KV storage of one model: K's and V's codecs, and whether they are its own dtype."""

    k: Codec
    v: Codec
    native: bool  # both in the activations' dtype: mlx-lm's plain caches (and the CPU decode step)
    act: mx.Dtype

    @property
    def quantized(self) -> bool:
        return bool(self.k.bits)

    def describe(self) -> str:
        return f"K {self.k.name}, V {self.v.name}" + (" (the model's dtype)" if self.native else "")


def _act_dtype(model) -> mx.Dtype:
    norm = getattr(getattr(model, "model", None), "norm", None)
    return norm.weight.dtype if norm is not None else mx.float32  # K and V are in the activations' dtype


def _head_dims(model) -> tuple[int, int]:
    args = model.args
    heads = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    return heads, head_dim


def _codec(name: str) -> Codec:
    if name in QUANT_BITS:
        return Codec(name, bits=QUANT_BITS[name])
    return Codec(name, dtype=FLOAT_TYPES[name])


def resolve_layout(model, type_k: Optional[str] = None, type_v: Optional[str] = None) -> KVLayout:
    """The KV layout for `model`; None keeps the model's dtype. ConfigError for what cannot be stored."""
    act = _act_dtype(model)
    own = next((n for n, d in FLOAT_TYPES.items() if d == act), "f32")
    k, v = _codec(type_k or own), _codec(type_v or own)
    native = k.name == own and v.name == own
    if native:
        return KVLayout(k, v, True, act)
    if (k.bits or v.bits) and k.bits != v.bits:
        raise ConfigError(f"--cache-type-k {k.name} with --cache-type-v {v.name}: quantized KV needs K and V in "
                          "the same quantized type (mlx-lm's quantized attention reads both with one bit width)",
                          flag="--cache-type-k")
    _, head_dim = _head_dims(model)
    if k.bits and head_dim % GROUP_SIZE:
        raise ConfigError(f"--cache-type-k {k.name}: this model's head dim {head_dim} is not a multiple of the "
                          f"quantization group {GROUP_SIZE}", flag="--cache-type-k")
    kinds = {type(c).__name__ for c in make_prompt_cache(model)}
    if kinds != {"KVCache"}:
        raise ConfigError(f"--cache-type-k/-v {k.name}/{v.name}: this model's cache has {', '.join(sorted(kinds))} "
                          "layers; only plain KV layers can be stored in another type", flag="--cache-type-k")
    return KVLayout(k, v, False, act)


def make_cache(model, layout: Optional[KVLayout]) -> list:
    """A fresh per-layer cache for one sequence's prefill."""
    if layout is None or layout.native:
        return make_prompt_cache(model)
    cls = QuantizedKVRow if layout.quantized else TypedKVCache
    return [cls(layout.k, layout.v) for _ in range(len(model.layers))]


def bytes_per_token(model, layout: Optional[KVLayout] = None) -> int:
    """Bytes of K and V one token adds over all layers (what a prompt-cache entry costs per token)."""
    layout = layout or resolve_layout(model)
    heads, head_dim = _head_dims(model)
    per_layer = heads * head_dim * (layout.k.bytes_per_element(layout.act) + layout.v.bytes_per_element(layout.act))
    return int(round(len(make_prompt_cache(model)) * per_layer))


def snapshot(layer, length: int):
    """An independent copy of a row cache's first `length` positions (a prompt-cache entry)."""
    if isinstance(layer, TypedKVCache):
        out = type(layer)(layer.k_codec, layer.v_codec)
        out.keys, out.values = slice_parts(layer.keys, 0, length), slice_parts(layer.values, 0, length)
    else:
        out = KVCache()
        out.keys = mx.contiguous(layer.keys[..., :length, :])
        out.values = mx.contiguous(layer.values[..., :length, :])
    out.offset = length
    return out


def adopt(layer, snap, length: int) -> None:
    """Let a fresh row cache start from a snapshot's first `length` positions, sharing its arrays."""
    if isinstance(layer, TypedKVCache):
        layer.keys = tuple(p[..., :length, :] for p in snap.keys)
        layer.values = tuple(p[..., :length, :] for p in snap.values)
    else:
        layer.keys, layer.values = snap.keys[..., :length, :], snap.values[..., :length, :]
    layer.offset = length
