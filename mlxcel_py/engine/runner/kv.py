"""KV storage types (--cache-type-k / --cache-type-v) and the caches that hold them.

The model's own dtype ("native", the default) keeps mlx-lm's KVCache / BatchKVCache, which
the CPU decode step writes into. Any other type uses the two classes here: one row while a
sequence prefills (`TypedKVCache`) and the left-padded decode batch (`TypedBatchKVCache`),
with the same bookkeeping as mlx-lm's BatchKVCache. Each K or V is stored as a tuple of
arrays: one cast array for f32/f16/bf16, (packed, scales, biases) for q8_0/q4_0 (group 32,
mx.quantize's affine format); attention then goes through mlx-lm's quantized SDPA, which
it picks for any cache with a `bits` attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache, dynamic_roll, make_prompt_cache

from ...errors import ConfigError

FLOAT_TYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
QUANT_BITS = {"q8_0": 8, "q4_0": 4}
KV_TYPES = tuple(FLOAT_TYPES) + tuple(QUANT_BITS)
GROUP_SIZE = 32  # llama.cpp's q8_0/q4_0 block; mx.quantize's smallest group
STEP = 256  # capacity grows in these steps, as mlx-lm's caches


@dataclass(frozen=True, slots=True)
class Codec:
    """How one of K or V is stored: cast to `dtype`, or quantized to `bits` (scales in the activations' dtype)."""

    name: str
    dtype: Optional[mx.Dtype] = None
    bits: int = 0

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        if self.bits:
            return tuple(mx.quantize(x, group_size=GROUP_SIZE, bits=self.bits))
        return (x.astype(self.dtype),)

    def view(self, parts: tuple[mx.array, ...]):
        """What attention reads: the array, or the (packed, scales, biases) triple."""
        return parts if self.bits else parts[0]

    def bytes_per_element(self, act: mx.Dtype) -> float:
        if self.bits:
            return self.bits / 8 + 2 * act.size / GROUP_SIZE
        return self.dtype.size


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


# -- the arrays of a cache, whatever its type ------------------------------------------------
def _parts(x) -> tuple[mx.array, ...]:
    return x if isinstance(x, tuple) else (x,)


def _slice(parts, start: int, end: int) -> tuple[mx.array, ...]:
    return tuple(mx.contiguous(p[..., start:end, :]) for p in parts)


def _zeros(codec: Codec, like: mx.array, batch: int, length: int) -> tuple[mx.array, ...]:
    return codec.encode(mx.zeros((batch, like.shape[1], length, like.shape[3]), like.dtype))


def _grow(parts, codec: Codec, like: mx.array, used: int, need: int):
    """Room for `need` positions after `used` (a new tuple; never writes into shared arrays)."""
    if parts is not None and used + need <= parts[0].shape[2]:
        return parts
    new = _zeros(codec, like, like.shape[0], (need + STEP - 1) // STEP * STEP)
    if parts is None:
        return new
    return tuple(mx.concatenate([p[..., :used, :], n], axis=2) for p, n in zip(parts, new))


def _write(parts, encoded, start: int, end: int) -> None:
    for p, e in zip(parts, encoded):
        p[..., start:end, :] = e


def snapshot(layer, length: int):
    """An independent copy of a row cache's first `length` positions (a prompt-cache entry)."""
    if isinstance(layer, TypedKVCache):
        out = type(layer)(layer.k_codec, layer.v_codec)
        out.keys, out.values = _slice(layer.keys, 0, length), _slice(layer.values, 0, length)
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


def arrays(layer) -> tuple[mx.array, ...]:
    """Every array a cache holds (to evaluate it, or to count its bytes)."""
    if isinstance(layer, (TypedKVCache, TypedBatchKVCache)):
        return (layer.keys or ()) + (layer.values or ())
    return tuple(a for a in (layer.keys, layer.values) if a is not None)


class TypedKVCache:
    """One sequence's KV in a storage type other than the model's (mlx-lm's KVCache contract)."""

    def __init__(self, k_codec: Codec, v_codec: Codec):
        self.k_codec, self.v_codec = k_codec, v_codec
        self.keys: Optional[tuple] = None
        self.values: Optional[tuple] = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, n = self.offset, keys.shape[2]
        self.keys = _grow(self.keys, self.k_codec, keys, prev, n)
        self.values = _grow(self.values, self.v_codec, values, prev, n)
        self.offset += n
        _write(self.keys, self.k_codec.encode(keys), prev, self.offset)
        _write(self.values, self.v_codec.encode(values), prev, self.offset)
        return self.k_codec.view(self._fetch(self.keys)), self.v_codec.view(self._fetch(self.values))

    def _fetch(self, parts):
        return tuple(p[..., : self.offset, :] for p in parts)

    def make_mask(self, n: int, return_array: bool = False, window_size: Optional[int] = None):
        if window_size is not None or return_array:
            return create_causal_mask(n, self.offset, window_size=window_size)
        return "causal" if n > 1 else None

    def merge(self, caches: list) -> "TypedBatchKVCache":
        return (QuantizedKVBatch if self.k_codec.bits else TypedBatchKVCache).merge(caches)

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self):
        return arrays(self)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in arrays(self))

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


class QuantizedKVRow(TypedKVCache):
    """A quantized row: `bits` makes mlx-lm's attention use mx.quantized_matmul."""

    @property
    def bits(self) -> int:
        return self.k_codec.bits

    @property
    def group_size(self) -> int:
        return GROUP_SIZE


def _pad(parts, left: int, right: int):
    if not (left or right):
        return parts
    return tuple(mx.pad(p, [(0, 0), (0, 0), (left, right), (0, 0)]) for p in parts)


class TypedBatchKVCache:
    """The left-padded decode batch in a storage type (mlx-lm's BatchKVCache bookkeeping)."""

    def __init__(self, k_codec: Codec, v_codec: Codec, left_padding: list[int]):
        self.k_codec, self.v_codec = k_codec, v_codec
        self.keys: Optional[tuple] = None
        self.values: Optional[tuple] = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: Optional[mx.array] = None

    @classmethod
    def merge(cls, caches: list) -> "TypedBatchKVCache":
        longest = max(c.offset for c in caches)
        first = caches[0]
        batch = cls(first.k_codec, first.v_codec, [longest - c.offset for c in caches])
        rows = [(_pad(c._fetch(c.keys), longest - c.offset, 0), _pad(c._fetch(c.values), longest - c.offset, 0))
                for c in caches]
        batch.keys = tuple(mx.concatenate(p, axis=0) for p in zip(*(k for k, _ in rows)))
        batch.values = tuple(mx.concatenate(p, axis=0) for p in zip(*(v for _, v in rows)))
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, n = self._idx, keys.shape[2]
        self.keys = _grow(self.keys, self.k_codec, keys, prev, n)
        self.values = _grow(self.values, self.v_codec, values, prev, n)
        self.offset = self.offset + n
        self._idx += n
        _write(self.keys, self.k_codec.encode(keys), prev, self._idx)
        _write(self.values, self.v_codec.encode(values), prev, self._idx)
        fetch = lambda parts: tuple(p[..., : self._idx, :] for p in parts)  # noqa: E731
        return self.k_codec.view(fetch(self.keys)), self.v_codec.view(fetch(self.values))

    def make_mask(self, n: int, return_array: bool = False, **kwargs):
        return create_causal_mask(n, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices) -> None:
        """Keep the given rows, in that order, and drop the left padding every row shares."""
        index = mx.array(batch_indices)
        self.keys = tuple(p[index] for p in self.keys)
        self.values = tuple(p[index] for p in self.values)
        self.offset, self.left_padding = self.offset[index], self.left_padding[index]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            self.keys = tuple(p[..., shared:, :] for p in self.keys)
            self.values = tuple(p[..., shared:, :] for p in self.values)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: "TypedBatchKVCache") -> None:
        """Append `other`'s rows, right-justified at the longer of the two positions."""
        idx = max(self._idx, other._idx)
        size = max(self.keys[0].shape[2], other.keys[0].shape[2])

        def fit(c):
            left = idx - c._idx
            right = size - c.keys[0].shape[2] - left
            keys, values = c.keys, c.values
            if right < 0:
                keys, values = tuple(p[..., :right, :] for p in keys), tuple(p[..., :right, :] for p in values)
                right = 0
            return _pad(keys, left, right), _pad(values, left, right), c.left_padding + left

        (k1, v1, l1), (k2, v2, l2) = fit(self), fit(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2))
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([l1, l2])
        self._idx = idx

    def extract(self, row: int) -> TypedKVCache:
        """One row's positions as a row cache of its own (contiguous copies)."""
        pad = self.left_padding.tolist()[row]
        out = (QuantizedKVRow if self.k_codec.bits else TypedKVCache)(self.k_codec, self.v_codec)
        out.keys = tuple(mx.contiguous(p[row : row + 1, :, pad : self._idx]) for p in self.keys)
        out.values = tuple(mx.contiguous(p[row : row + 1, :, pad : self._idx]) for p in self.values)
        out.offset = self._idx - pad
        return out

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def prepare(self, *, right_padding=None, **_) -> None:
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """Shift right-padded rows into their left padding (a verify step's rejected positions)."""
        if self._right_padding is None:
            return
        shift = self._right_padding[:, None]
        self.keys = tuple(dynamic_roll(p, shift, axis=2) for p in self.keys)
        self.values = tuple(dynamic_roll(p, shift, axis=2) for p in self.values)
        self.offset = self.offset - self._right_padding
        self.left_padding = self.left_padding + self._right_padding
        self._right_padding = None

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self):
        return arrays(self)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in arrays(self))

    def is_trimmable(self) -> bool:
        return True


class QuantizedKVBatch(TypedBatchKVCache):
    """A quantized decode batch: `bits` makes mlx-lm's attention use mx.quantized_matmul."""

    @property
    def bits(self) -> int:
        return self.k_codec.bits

    @property
    def group_size(self) -> int:
        return GROUP_SIZE
