"""A slot's KV to and from a safetensors file (`Step.slot_file`; engine/core/slots.py decides what).

Per layer, K's and V's arrays are named "<layer>.k.<part>" and "<layer>.v.<part>": one part
for a float type, three (packed, scales, biases) for a quantized one. The header metadata is
the scheduler's (model identity, KV types, token ids); it is checked before any array is read.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from .kv import KVLayout, TypedKVCache, make_cache, snapshot


def model_digest(model) -> str:
    """A digest of the model's parameter names and shapes and of a sample of its values (cheap: a
    few hundred numbers), so a slot file of another model, or of other weights, is told apart."""
    h = hashlib.sha256()
    params = tree_flatten(model.parameters())
    for name, p in params:
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
    for _, p in params[:3] + params[-1:]:
        h.update(np.array(p.reshape(-1)[:256].astype(mx.float32)).tobytes())
    return h.hexdigest()[:16]


def _parts(layer, which: str) -> tuple[mx.array, ...]:
    held = getattr(layer, "keys" if which == "k" else "values")
    return held if isinstance(held, tuple) else (held,)


def save(path: str, layers: Optional[list], length: int, metadata: dict[str, str]) -> int:
    """Write the first `length` positions of a snapshot (None: no tokens, the header alone); the file's size."""
    arrays: dict[str, mx.array] = {}
    for i, layer in enumerate(layers or ()):
        cut = snapshot(layer, length) if layer.offset != length else layer
        for which in ("k", "v"):
            for j, part in enumerate(_parts(cut, which)):
                arrays[f"{i}.{which}.{j}"] = part
    partial = f"{path}.partial.safetensors"  # MLX appends the suffix; the rename keeps a reader off half a file
    try:
        mx.save_safetensors(partial, arrays, metadata=metadata)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return os.path.getsize(path)


def load(path: str, model, layout: Optional[KVLayout], length: int) -> tuple[list, int]:
    """A snapshot of `length` positions read from `path`, shaped as this model's cache; ValueError when not."""
    arrays = mx.load(path, format="safetensors")
    template = make_cache(model, layout)
    layers = []
    for i, fresh in enumerate(template):
        held = {which: tuple(arrays.get(f"{i}.{which}.{j}") for j in range(3 if _quantized(fresh) else 1))
                for which in ("k", "v")}
        for which, parts in held.items():
            if any(p is None or p.ndim != 4 or p.shape[0] != 1 or p.shape[2] != length for p in parts):
                raise ValueError(f"layer {i}'s {which.upper()} is not {length} positions of this model's KV")
        layers.append(_row(fresh, held["k"], held["v"], length))
    if len(arrays) != sum(len(_parts(c, w)) for c in layers for w in ("k", "v")):
        raise ValueError("the file holds more layers than this model has")
    return layers, os.path.getsize(path)


def _quantized(layer) -> bool:
    return isinstance(layer, TypedKVCache) and bool(layer.k_codec.bits)


def _row(fresh, keys: tuple, values: tuple, length: int):
    if isinstance(fresh, TypedKVCache):
        fresh.keys, fresh.values = keys, values
    elif isinstance(fresh, KVCache):
        fresh.keys, fresh.values = keys[0], values[0]
    else:
        raise ValueError(f"a {type(fresh).__name__} layer cannot be restored from a slot file")
    fresh.offset = length
    return fresh
