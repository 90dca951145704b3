"""The decode batch's KV as the engine owns it, for the CPU decode step (issue 26).

mlx-lm's BatchKVCache keeps the batch left-padded to its longest row: a sequence joining the
batch re-pads and copies every row (merge + extend), and the CPU decode step then copies them
again into buffers it can write. Here each layer has one float32 buffer (slots, kv_heads,
capacity, dim); a batch row lives in one slot with its own length, so a join copies only the
new sequence's tokens, a leave copies nothing and a rejected draft's trim is a length change.
The buffers are anonymous memory maps (`_zeros`): pages nobody wrote stay unmapped, so the resident
size grows with the tokens stored, not with the capacity. Growing the capacity copies only the
rows in use. The decoder reads and writes them through `models/cpu_decode_rows.forward_rows`.
"""

from __future__ import annotations

import mmap
from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

FIRST_SLOTS = 4
FIRST_CAPACITY = 1024  # positions; doubled as rows grow past it


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 zero buffer whose untouched pages are not resident. np.zeros (calloc) is not that
    once glibc has raised its mmap threshold past the buffer's size (after freeing one as large):
    calloc then clears reused heap pages, and every page of the capacity becomes resident."""
    count = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(4 * count, 1)), np.float32, count).reshape(shape)


class RowKV:
    """Per-layer (slots, kv_heads, capacity, dim) buffers, batch row i in slot `slots[i]` holding
    `lengths[i]` positions (its next token's position)."""

    def __init__(self, layers: int, kv_heads: int, dim: int, slots: int = FIRST_SLOTS,
                 capacity: int = FIRST_CAPACITY):
        self.shape = (kv_heads, dim)
        self.keys = [_zeros((slots, kv_heads, capacity, dim)) for _ in range(layers)]
        self.values = [_zeros((slots, kv_heads, capacity, dim)) for _ in range(layers)]
        self.slots: list[int] = []
        self.lengths: list[int] = []

    @classmethod
    def like(cls, caches: Sequence[KVCache]) -> "RowKV":
        """An empty RowKV shaped for these row caches (one per layer)."""
        _, heads, _, dim = caches[0].keys.shape
        return cls(len(caches), heads, dim)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def __len__(self) -> int:
        return len(self.slots)

    # -- joining and leaving ------------------------------------------------------------------
    def add(self, caches: Sequence[KVCache]) -> None:
        """Append a row: copy a prefilled sequence's `offset` positions (every layer) into a free slot."""
        length = caches[0].offset
        slot = self._free_slot()
        self.reserve(length + 1)
        for layer, cache in enumerate(caches):
            self.keys[layer][slot, :, :length] = np.asarray(cache.keys[0, :, :length])
            self.values[layer][slot, :, :length] = np.asarray(cache.values[0, :, :length])
        self.slots.append(slot)
        self.lengths.append(length)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep these rows in this order (a leave or a reorder): nothing is copied."""
        self.slots = [self.slots[i] for i in rows]
        self.lengths = [self.lengths[i] for i in rows]

    def trim(self, row: int, n: int) -> None:
        """Forget a row's last `n` positions (a verify's rejected draft tokens)."""
        self.lengths[row] -= n

    def extract(self, row: int, length: int) -> list[KVCache]:
        """Private mlx-lm row caches of the row's first `length` positions (a prompt-cache snapshot)."""
        if self.lengths[row] < length:  # the scheduler's count and the KV disagree: a bug, not bad input
            raise RuntimeError(f"snapshot of {length} tokens asked, but the row holds {self.lengths[row]}")
        slot, out = self.slots[row], []
        for keys, values in zip(self.keys, self.values):
            cache = KVCache()
            cache.keys = mx.array(keys[slot : slot + 1, :, :length])
            cache.values = mx.array(values[slot : slot + 1, :, :length])
            cache.offset = length
            out.append(cache)
        return out

    def set_row(self, row: int, layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Replace a row's KV with (keys, values) (kv_heads, L, dim) per layer (a context shift)."""
        length = layers[0][0].shape[1]
        self.reserve(length + 1)
        slot = self.slots[row]
        for layer, (keys, values) in enumerate(layers):
            self.keys[layer][slot, :, :length] = keys
            self.values[layer][slot, :, :length] = values
        self.lengths[row] = length

    def row_kv(self, row: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Views of a row's (keys, values) (kv_heads, length, dim) per layer."""
        slot, length = self.slots[row], self.lengths[row]
        return [(k[slot, :, :length], v[slot, :, :length]) for k, v in zip(self.keys, self.values)]

    # -- a forward's arrays -------------------------------------------------------------------
    def step_arrays(self, width: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, start, position) per row for a forward of `width` new tokens per row, with room for them."""
        self.reserve(max(self.lengths) + width)
        slots = np.asarray(self.slots, np.int64)
        return slots, np.zeros_like(slots), np.asarray(self.lengths, np.int64)

    def advance(self, width: int = 1) -> None:
        """Every row holds `width` more positions (the forward wrote them)."""
        self.lengths = [n + width for n in self.lengths]

    def reserve(self, positions: int) -> None:
        """Room for `positions` per slot: double the capacity, copying only the rows in use."""
        if positions <= self.capacity:
            return
        capacity = self.capacity
        while capacity < positions:
            capacity *= 2
        self._regrow(self.keys[0].shape[0], capacity)

    def _free_slot(self) -> int:
        used = set(self.slots)
        free = [s for s in range(self.keys[0].shape[0]) if s not in used]
        if free:
            return free[0]
        slots = self.keys[0].shape[0]
        self._regrow(2 * slots, self.capacity)
        return slots

    def _regrow(self, slots: int, capacity: int) -> None:
        kv_heads, dim = self.shape
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                new = _zeros((slots, kv_heads, capacity, dim))
                for slot, length in zip(self.slots, self.lengths):
                    new[slot, :, :length] = old[slot, :, :length]
                buffers[layer] = new
