"""Context shift on the decode batch's KV (`Step.shift`, planned by engine/core/context_shift.py).

The batch is mlx-lm's left-padded BatchKVCache with keys stored after RoPE. A shift of row r
drops its positions [n_keep, n_keep + n_discard): the row is rebuilt right-aligned at the
batch's index, so the kept head moves right by n_discard, the row's left padding grows by
n_discard and its offset (the next token's position) falls by n_discard. The tail's keys must
then sit at positions n_discard lower. Two ways (docs/KV_CACHE.md, "Context shift", measured):

- "rotate": re-rotate the tail keys by -n_discard with the layer's own RoPE (llama.cpp's way;
  only for pure-rotation RoPE modules). The tail's deeper-layer K/V still carry what the dropped
  tokens contributed, so the next logits differ from a fresh prefill of the kept tokens.
- "prefill": forward the kept tokens (the record's `tokens`) into a fresh cache and put that
  in the row: the KV is exactly a fresh prefill's; costs a prefill of about half the slot.

Rows are replaced by new arrays, never written in place: the CPU decode step (models/cpu/decoder.py)
notices its held buffer is gone and copies the new one into a buffer of its own.
"""

from __future__ import annotations

from typing import Any, ContextManager, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from ..core.step import Shift

MODES = ("prefill", "rotate")
PURE_ROPES = ("RoPE", "Llama3RoPE", "FactorRoPE")  # rotations only: no scaling of the input (YaRN's mscale)
PREFILL_CHUNK = 512  # tokens per forward when rebuilding a row (bounds the attention scores' memory)


def shift_support(model) -> Optional[str]:
    """None when every layer's KV is a plain KVCache (so a row can be rebuilt); else why not."""
    for layer in make_prompt_cache(model):
        if type(layer) is not KVCache:
            return (f"its {type(layer).__name__} layers (a sliding window or a recurrent state) cannot be "
                    "shifted; run without --context-shift")
    return None


def layer_ropes(model) -> Optional[list]:
    """Each layer's RoPE module when all are pure rotations (so "rotate" applies); else None."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    ropes = [getattr(getattr(layer, "self_attn", None), "rope", None) for layer in layers]
    if not ropes or any(type(r).__name__ not in PURE_ROPES for r in ropes):
        return None
    if len(ropes) != len(make_prompt_cache(model)):
        return None
    return ropes


class ContextShifter:
    """Executes `Shift` records on the decode batch, by `mode` ("rotate" falls back to "prefill"
    for a model whose RoPE is not a pure rotation)."""

    def __init__(self, model, kernels: ContextManager[Any], mode: str = "prefill"):
        if mode not in MODES:
            raise ValueError(f"context shift mode must be one of {', '.join(MODES)} (got {mode!r})")
        self.model, self._kernels = model, kernels
        self._ropes = layer_ropes(model) if mode == "rotate" else None
        self.mode = "rotate" if self._ropes is not None else "prefill"

    def apply(self, batch: list, row: int, shift: Shift) -> None:
        """Shift one row of the batch (every layer) as the record says."""
        pad = int(batch[0].left_padding[row].item())
        length = batch[0]._idx - pad - shift.n_discard  # the row's KV length after the shift
        if self._ropes is not None:
            rows = [_rotated(layer, row, pad, shift, rope) for layer, rope in zip(batch, self._ropes)]
        else:
            if len(shift.tokens) != length:
                raise RuntimeError(f"shift of seq {shift.seq_id}: {len(shift.tokens)} tokens for {length} positions")
            rows = [(c.keys[..., :length, :], c.values[..., :length, :]) for c in self._prefill(shift.tokens)]
        for layer, (keys, values) in zip(batch, rows):
            set_row(layer, row, keys, values)
        mx.eval([(c.keys, c.values, c.offset, c.left_padding) for c in batch])

    def apply_rows(self, kv, row: int, shift: Shift) -> None:
        """The same shift on the engine's own rows (engine/runner/kv_rows.py): the row keeps its
        slot, its KV is rewritten from position 0 and its length falls by n_discard."""
        length = kv.lengths[row] - shift.n_discard
        if self._ropes is not None:
            layers = [_rotated_row(keys, values, shift, rope) for (keys, values), rope in zip(kv.row_kv(row), self._ropes)]
        else:
            if len(shift.tokens) != length:
                raise RuntimeError(f"shift of seq {shift.seq_id}: {len(shift.tokens)} tokens for {length} positions")
            fresh = self._prefill(shift.tokens)
            layers = [(np.asarray(c.keys[0, :, :length]), np.asarray(c.values[0, :, :length])) for c in fresh]
        kv.set_row(row, layers)

    def _prefill(self, tokens: tuple[int, ...]) -> list[KVCache]:
        cache = make_prompt_cache(self.model)
        forward = getattr(self.model, "model", self.model)  # hidden states only: no LM head
        with self._kernels:
            for start in range(0, len(tokens), PREFILL_CHUNK):
                forward(mx.array(tokens[start : start + PREFILL_CHUNK])[None], cache=cache)
                mx.eval([c.state for c in cache])
        return cache


def _rotated(layer: BatchKVCache, row: int, pad: int, shift: Shift, rope) -> tuple[mx.array, mx.array]:
    """The row's kept head and its tail, the tail's keys rotated back by n_discard positions."""
    keep, cut, end = pad + shift.n_keep, pad + shift.n_keep + shift.n_discard, layer._idx
    tail = layer.keys[row : row + 1, :, cut:end, :]
    _, heads, length, dim = tail.shape
    # One position per (head, token): every key gets the same rotation by -n_discard.
    turned = rope(tail.reshape(1, heads * length, 1, dim), offset=-shift.n_discard).reshape(tail.shape)
    keys = mx.concatenate([layer.keys[row : row + 1, :, pad:keep, :], turned], axis=2)
    values = mx.concatenate([layer.values[row : row + 1, :, pad:keep, :],
                             layer.values[row : row + 1, :, cut:end, :]], axis=2)
    return keys, values


def _rotated_row(keys: np.ndarray, values: np.ndarray, shift: Shift, rope) -> tuple[np.ndarray, np.ndarray]:
    """A row's (kv_heads, L, dim) K/V without [n_keep, n_keep + n_discard), the tail's keys rotated back."""
    keep, cut = shift.n_keep, shift.n_keep + shift.n_discard
    tail = mx.array(np.ascontiguousarray(keys[None, :, cut:]))
    _, heads, length, dim = tail.shape
    turned = rope(tail.reshape(1, heads * length, 1, dim), offset=-shift.n_discard).reshape(tail.shape)
    new_keys = np.concatenate([keys[:, :keep], np.asarray(turned[0])], axis=1)
    return new_keys, np.concatenate([values[:, :keep], values[:, cut:]], axis=1)


def set_row(layer: BatchKVCache, row: int, keys: mx.array, values: mx.array) -> None:
    """Put `keys`/`values` (1, H, L, D) into the row right-aligned at the batch's index, as new arrays."""
    idx, length = layer._idx, keys.shape[2]

    def rebuilt(buffer: mx.array, new: mx.array) -> mx.array:
        _, heads, capacity, dim = buffer.shape
        lead = mx.zeros((1, heads, idx - length, dim), buffer.dtype)
        line = mx.concatenate([lead, new.astype(buffer.dtype), buffer[row : row + 1, :, idx:, :]], axis=2)
        return mx.concatenate([buffer[:row], line, buffer[row + 1 :]], axis=0)

    layer.keys, layer.values = rebuilt(layer.keys, keys), rebuilt(layer.values, values)
    pads, offsets = layer.left_padding.tolist(), layer.offset.tolist()
    pads[row], offsets[row] = idx - length, length
    layer.left_padding = mx.array(pads, dtype=layer.left_padding.dtype)
    layer.offset = mx.array(offsets, dtype=layer.offset.dtype)
