"""The caches of a KV storage type other than the model's (engine/runner/kv.py chooses them).

Each of K and V is a tuple of arrays: one cast array for f32/f16/bf16, (packed, scales, biases)
for q8_0/q4_0 (mx.quantize's affine format, group 32). `TypedKVCache` is one sequence's row while
it prefills; `TypedBatchKVCache` the left-padded decode batch, with mlx-lm's BatchKVCache
bookkeeping (offsets, left padding, filter, extend, extract, trim, right-padding roll). The
quantized variants carry `bits`, which makes mlx-lm's attention use mx.quantized_matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import dynamic_roll

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


def _parts(x) -> tuple[mx.array, ...]:
    return x if isinstance(x, tuple) else (x,)


def slice_parts(parts, start: int, end: int) -> tuple[mx.array, ...]:
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


def arrays(layer) -> tuple[mx.array, ...]:
    """Every array a cache holds (to evaluate it, or to count its bytes)."""
    if isinstance(layer, (TypedKVCache, TypedBatchKVCache)):
        return (layer.keys or ()) + (layer.values or ())
    return tuple(a for a in (layer.keys, layer.values) if a is not None)


class _Held:
    """What mlx-lm asks of any cache about the arrays it holds (shared by the row and batch caches)."""

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


class TypedKVCache(_Held):
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

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


class _QuantizedAttention:
    """`bits` and `group_size` make mlx-lm's attention use mx.quantized_matmul on these caches."""

    @property
    def bits(self) -> int:
        return self.k_codec.bits

    @property
    def group_size(self) -> int:
        return GROUP_SIZE


class QuantizedKVRow(_QuantizedAttention, TypedKVCache):
    """A quantized row."""


def _pad(parts, left: int, right: int):
    if not (left or right):
        return parts
    return tuple(mx.pad(p, [(0, 0), (0, 0), (left, right), (0, 0)]) for p in parts)


class TypedBatchKVCache(_Held):
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



class QuantizedKVBatch(_QuantizedAttention, TypedBatchKVCache):
    """A quantized decode batch."""
