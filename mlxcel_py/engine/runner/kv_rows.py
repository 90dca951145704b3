"""The decode batch's KV as the engine owns it, for the CPU decode step.

mlx-lm's BatchKVCache keeps the batch left-padded to its longest row: a sequence joining the
batch re-pads and copies every row (merge + extend), and the CPU decode step then copies them
again into buffers it can write. Here each layer has one float32 buffer (slots, kv_heads,
capacity, dim); a batch row lives in one slot with its own length, so a join copies only the
new sequence's tokens, a leave copies nothing and a rejected draft's trim is a length change.
The buffers are anonymous memory maps (kv_pages.zeros): pages nobody wrote stay unmapped, so the resident
size grows with the tokens stored, not with the capacity. Growing the capacity copies only the
rows in use. The decoder reads and writes them through `models/cpu/rows.forward_rows`.
A sequence still prefilling in fused ticks (engine/runner/tick.py) writes into a staged slot, the one
it will join, so its join copies only what those ticks did not write.

Shared prefixes (eight requests with one system prompt store its KV once): a prompt-cache snapshot
is a pinned slot of the same buffers, refcounted, never decoded into. A batch row adopting it
carries (prefix slot, prefix length); its own slot holds only the positions from the prefix length
on (the pages below stay unmapped) and the attention reads the positions below it from the pinned
slot, in the same loop order, so a shared row's logits are bit-equal to a private copy's.

Sliding-window layers (gemma3's: `windows`) keep only what their window reads: as a slot's sequence
grows, the pages of its positions below `floor_for(length)` (the window, WINDOW_SLACK more, in steps
of RELEASE_STEP) are given back in those layers, so a slot costs about window + 512 positions there
however long its context. A pinned prefix keeps the floor it had, so it serves a prefix only down to
PREFIX_REACH positions below its own length (the prompt cache's `reach`); a shorter match recomputes,
as llama.cpp's SWA cache without `--swa-full`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from .kv_pages import PREFIX_REACH, RELEASE_STEP, WINDOW_SLACK, floor_for, release, release_span, windows_of, zeros

__all__ = ["FIRST_CAPACITY", "FIRST_SLOTS", "PREFIX_REACH", "RELEASE_STEP", "WINDOW_SLACK", "PinnedPrefix", "RowKV",
           "floor_for", "windows_of"]

FIRST_SLOTS = 4
FIRST_CAPACITY = 1024  # positions; doubled as rows grow past it


@dataclass(frozen=True, slots=True)
class PinnedPrefix:
    """A prompt-cache snapshot held by reference: the first `length` positions of pinned slot `slot`."""

    slot: int
    length: int


class RowKV:
    """Per-layer (slots, kv_heads, capacity, dim) buffers, batch row i in slot `slots[i]` holding
    `lengths[i]` positions (its next token's position), the first `prefixes[i][1]` of them read from
    pinned slot `prefixes[i][0]`; `pinned` maps a pinned slot to [its length, its references].
    `windows[l]` > 0: layer l attends that many positions back; those layers hold a slot's positions
    from `floors[slot]` on only (the module docstring)."""

    def __init__(self, layers: int, kv_heads: int, dim: int, slots: int = FIRST_SLOTS,
                 capacity: int = FIRST_CAPACITY, windows: Sequence[int] = ()):
        self.shape = (kv_heads, dim)
        self.windows = tuple(windows) or (0,) * layers
        self.window = max(self.windows)  # the floor keeps the widest window's positions
        self.floors: dict[int, int] = {}  # slot -> its windowed layers' lowest position held
        self.keys = [zeros((slots, kv_heads, capacity, dim)) for _ in range(layers)]
        self.values = [zeros((slots, kv_heads, capacity, dim)) for _ in range(layers)]
        self.slots: list[int] = []
        self.lengths: list[int] = []
        self.prefixes: list[tuple[int, int]] = []
        self.pinned: dict[int, list[int]] = {}
        self.staged: dict[int, list[int]] = {}  # a prefilling sequence's future slot -> [lo, hi) written

    @classmethod
    def like(cls, caches: Sequence[KVCache], slots: int = FIRST_SLOTS, capacity: int = FIRST_CAPACITY,
             windows: Sequence[int] = ()) -> "RowKV":
        """An empty RowKV shaped for these row caches (one per layer); `slots` x `capacity` sized up
        front (untouched pages cost no memory) spares the joins a regrow."""
        _, heads, _, dim = caches[0].keys.shape
        return cls(len(caches), heads, dim, max(1, slots), max(1, capacity), windows)

    def _first(self, layer: int, slot: int, first: int) -> int:
        """The first position of `first`.. that layer `layer` holds in `slot`."""
        return max(first, self.floors.get(slot, 0)) if self.windows[layer] else first

    def _raise_floor(self, slot: int, length: int) -> None:
        """Give back the windowed layers' pages of `slot` below `floor_for(length)`."""
        old, new = self.floors.get(slot, 0), floor_for(length, self.window)
        if new > old:
            for layer, window in enumerate(self.windows):
                if window:
                    release_span(self.keys[layer], slot, old, new)
                    release_span(self.values[layer], slot, old, new)
            self.floors[slot] = new

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def __len__(self) -> int:
        return len(self.slots)

    def positions_stored(self) -> int:
        """Positions held in the buffers: each row's own (past its shared prefix), each pinned slot's,
        and what fused ticks wrote into staged slots."""
        own = sum(n - p for n, (_, p) in zip(self.lengths, self.prefixes))
        staged = sum(b - a for a, b in self.staged.values())
        return own + sum(length for length, _ in self.pinned.values()) + staged

    # -- joining and leaving ------------------------------------------------------------------
    def add(self, caches: Sequence[KVCache], prefix: Optional[PinnedPrefix] = None,
            staged: Optional[int] = None) -> None:
        """Append a row: copy a prefilled sequence's `offset` positions (every layer) into a free slot;
        with `prefix` (whose reference the row takes over) only the positions from its length on; into
        its `staged` slot (`stage`) only the positions the fused ticks did not write there."""
        length, cut = caches[0].offset, prefix.length if prefix is not None else 0
        if staged is None:
            slot, spans = self._free_slot(length + 1), [(cut, length)]
        else:
            self.reserve(length + 1)
            slot, (lo, hi) = staged, self.staged.pop(staged)
            spans = [(cut, max(cut, min(lo, length))), (max(cut, hi), length)]
        self._raise_floor(slot, length)
        for layer, cache in enumerate(caches):
            keys, values = np.asarray(cache.keys)[0], np.asarray(cache.values)[0]  # views, not MLX copies
            for a, b in spans:
                a = self._first(layer, slot, a)
                if a < b:
                    self.keys[layer][slot, :, a:b] = keys[:, a:b]
                    self.values[layer][slot, :, a:b] = values[:, a:b]
        self.slots.append(slot)
        self.lengths.append(length)
        self.prefixes.append((prefix.slot, cut) if prefix is not None else (0, 0))

    # -- a prefilling sequence's slot, written by its fused ticks (engine/runner/tick.py) -----------
    def stage(self, positions: int) -> int:
        """A free slot for a sequence still prefilling: its fused pieces write their K/V here as they
        run, so that its join copies only what they did not (`add(staged=)`), not the whole prompt."""
        slot = self._free_slot(positions)
        self.staged[slot] = [0, 0]
        return slot

    def staged_written(self, slot: int, start: int, end: int) -> None:
        """Positions [start, end) of staged `slot` now hold the sequence's K/V (a gap restarts the run)."""
        span = self.staged[slot]
        span[:] = [span[0], end] if start == span[1] else [start, end]

    def unstage(self, slot: int) -> None:
        """The prefilling sequence left before joining: free its slot and give its pages back."""
        del self.staged[slot]
        self._release_slot(slot)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep these rows in this order (a leave or a reorder): nothing is copied; a leaving row's
        prefix reference is dropped and its slot's pages given back (unless it was pinned)."""
        kept = set(rows)
        for i in [i for i in range(len(self.slots)) if i not in kept]:
            self._drop_prefix(i)
            if self.slots[i] not in self.pinned:
                self._release_slot(self.slots[i])
        self.slots = [self.slots[i] for i in rows]
        self.lengths = [self.lengths[i] for i in rows]
        self.prefixes = [self.prefixes[i] for i in rows]

    def trim(self, row: int, n: int) -> None:
        """Forget a row's last `n` positions (a verify's rejected draft tokens)."""
        self.lengths[row] -= n

    # -- pinned prefixes (the prompt cache's snapshots, by reference) -----------------------------
    def pin(self, caches: Sequence[KVCache], length: int) -> PinnedPrefix:
        """A pinned slot holding the first `length` positions of these row caches (one reference)."""
        slot = self._free_slot(length + 1)
        self._raise_floor(slot, length)
        for layer, cache in enumerate(caches):
            a = self._first(layer, slot, 0)
            self.keys[layer][slot, :, a:length] = np.asarray(cache.keys[0, :, a:length])
            self.values[layer][slot, :, a:length] = np.asarray(cache.values[0, :, a:length])
        self.pinned[slot] = [length, 1]
        return PinnedPrefix(slot, length)

    def pin_row(self, row: int, length: int) -> PinnedPrefix:
        """A leaving row's slot pinned in place (its first `length` positions, one reference): only a
        shared prefix is copied in; the row must leave (`keep`) before the next forward."""
        if self.lengths[row] < length:  # the scheduler's count and the KV disagree: a bug, not bad input
            raise RuntimeError(f"snapshot of {length} tokens asked, but the row holds {self.lengths[row]}")
        self.unshare(row)
        slot = self.slots[row]
        self.pinned[slot] = [length, 1]
        return PinnedPrefix(slot, length)

    def ref(self, prefix: PinnedPrefix) -> PinnedPrefix:
        """One more reference to a pinned slot (a sequence adopting it)."""
        self.pinned[prefix.slot][1] += 1
        return prefix

    def unref(self, prefix: PinnedPrefix) -> None:
        """Drop a reference; the last one frees the slot."""
        held = self.pinned[prefix.slot]
        held[1] -= 1
        if held[1] == 0:
            del self.pinned[prefix.slot]
            if prefix.slot not in self.slots:
                self._release_slot(prefix.slot)

    def prefix_caches(self, prefix: PinnedPrefix, length: Optional[int] = None) -> list[KVCache]:
        """Private mlx-lm row caches of a pinned slot's first `length` positions (an adoption's prefill,
        a slot file)."""
        return self._caches(lambda buffer: buffer[prefix.slot, :, : prefix.length if length is None else length])

    def unshare(self, row: int) -> None:
        """Copy a row's shared prefix into its own slot and drop the reference (before its KV is rewritten)."""
        shared, cut = self.prefixes[row]
        if cut:
            slot = self.slots[row]
            self.floors[slot] = max(self.floors.get(slot, 0), self.floors.get(shared, 0))  # what both hold
            for buffers in (self.keys, self.values):
                for layer, buffer in enumerate(buffers):
                    a = self._first(layer, slot, 0)
                    buffer[slot, :, a:cut] = buffer[shared, :, a:cut]
            self._drop_prefix(row)

    def _drop_prefix(self, row: int) -> None:
        shared, cut = self.prefixes[row]
        if cut:
            self.prefixes[row] = (0, 0)
            self.unref(PinnedPrefix(shared, cut))

    # -- a row's contents -----------------------------------------------------------------------
    def extract(self, row: int, length: int) -> list[KVCache]:
        """Private mlx-lm row caches of the row's first `length` positions (a prompt-cache snapshot)."""
        if self.lengths[row] < length:  # the scheduler's count and the KV disagree: a bug, not bad input
            raise RuntimeError(f"snapshot of {length} tokens asked, but the row holds {self.lengths[row]}")
        (shared, cut), slot = self.prefixes[row], self.slots[row]
        cut = min(cut, length)
        return self._caches(lambda b: np.concatenate([b[shared, :, :cut], b[slot, :, cut:length]], axis=1))

    def _caches(self, part) -> list[KVCache]:
        out = []
        for keys, values in zip(self.keys, self.values):
            cache = KVCache()
            cache.keys, cache.values = mx.array(part(keys)[None]), mx.array(part(values)[None])
            cache.offset = cache.keys.shape[2]
            out.append(cache)
        return out

    def set_row(self, row: int, layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Replace a row's KV with (keys, values) (kv_heads, L, dim) per layer (a context shift); a
        shared row stops sharing."""
        length = layers[0][0].shape[1]
        self.reserve(length + 1)
        self._drop_prefix(row)
        slot = self.slots[row]
        self.floors.pop(slot, None)  # the row is rewritten from position 0
        self._raise_floor(slot, length)
        for layer, (keys, values) in enumerate(layers):
            a = self._first(layer, slot, 0)
            self.keys[layer][slot, :, a:length] = keys[:, a:]
            self.values[layer][slot, :, a:length] = values[:, a:]
        self.lengths[row] = length

    def row_kv(self, row: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Views of a row's (keys, values) (kv_heads, length, dim) per layer (a shared row is unshared first)."""
        self.unshare(row)
        slot, length = self.slots[row], self.lengths[row]
        return [(k[slot, :, :length], v[slot, :, :length]) for k, v in zip(self.keys, self.values)]

    # -- a forward's arrays -------------------------------------------------------------------
    def step_arrays(self, width: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(slot, start, position, prefix (B, 2): shared slot and length) per row for a forward of
        `width` new tokens per row, with room for them."""
        self.reserve(max(self.lengths) + width)
        slots = np.asarray(self.slots, np.int64)
        prefix = np.asarray(self.prefixes, np.int64).reshape(len(slots), 2)
        return slots, np.zeros_like(slots), np.asarray(self.lengths, np.int64), prefix

    def advance(self, width: int = 1) -> None:
        """Every row holds `width` more positions (the forward wrote them)."""
        self.lengths = [n + width for n in self.lengths]
        if self.window:
            for slot, length in zip(self.slots, self.lengths):
                self._raise_floor(slot, length)

    def reserve(self, positions: int) -> None:
        """Room for `positions` per slot: double the capacity, copying only the positions in use."""
        if positions > self.capacity:
            self._regrow(self.keys[0].shape[0], self._capacity_for(positions))

    def _capacity_for(self, positions: int) -> int:
        capacity = self.capacity
        while capacity < positions:
            capacity *= 2
        return capacity

    def _free_slot(self, positions: int = 0) -> int:
        """A free slot with room for `positions`: a join needing both more slots and more capacity
        regrows once (each regrow copies every row in use)."""
        used = set(self.slots) | set(self.pinned) | set(self.staged)
        slots = self.keys[0].shape[0]
        free = [s for s in range(slots) if s not in used]
        if free:
            self.reserve(positions)
            return free[0]
        self._regrow(2 * slots, self._capacity_for(positions))
        return slots

    def _release_slot(self, slot: int) -> None:
        self.floors.pop(slot, None)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                release(buffer, slot)

    def _regrow(self, slots: int, capacity: int) -> None:
        kv_heads, dim = self.shape
        spans = [(s, p, n) for s, n, (_, p) in zip(self.slots, self.lengths, self.prefixes)]
        spans += [(s, 0, n) for s, (n, _) in self.pinned.items() if s not in self.slots]
        spans += [(s, lo, hi) for s, (lo, hi) in self.staged.items()]
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                new = zeros((slots, kv_heads, capacity, dim))
                for slot, first, length in spans:  # below a shared prefix's length nothing is stored
                    first = self._first(layer, slot, first)
                    new[slot, :, first:length] = old[slot, :, first:length]
                buffers[layer] = new
