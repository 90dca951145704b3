"""KV bookkeeping in plain Python: the prompt cache index and the token budget.

The KV arrays themselves are opaque here (the runner makes and reads them), so the
scheduler can be tested with lists.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A KV snapshot of `tokens` (opaque `kv`, owned by the runner)."""

    tokens: tuple[int, ...]
    kv: Any
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheHit:
    entry: CacheEntry
    length: int  # prompt tokens adopted from the entry


def common_prefix_len(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Longest common prefix by binary search on C-speed slice comparisons."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptCache:
    """An LRU of KV snapshots, bounded in bytes and entries, matched by longest prefix."""

    def __init__(self, max_bytes: int, max_entries: int, min_prefix: int):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.min_prefix = max(1, min_prefix)
        self._entries: "OrderedDict[tuple[int, ...], CacheEntry]" = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: tuple[int, ...]) -> Optional[CacheHit]:
        """The entry sharing the longest prefix with `prompt`, capped so one token is left to forward."""
        best: Optional[CacheHit] = None
        limit = len(prompt) - 1
        for entry in self._entries.values():
            n = min(common_prefix_len(entry.tokens, prompt), limit)
            if n >= self.min_prefix and (best is None or n > best.length):
                best = CacheHit(entry, n)
        if best is not None:
            self._entries.move_to_end(best.entry.tokens)
        return best

    def insert(self, tokens: tuple[int, ...], kv: Any, nbytes: int) -> bool:
        """Store a snapshot; returns False when it is too short or larger than the whole cache."""
        if len(tokens) < self.min_prefix or nbytes > self.max_bytes or self.max_entries <= 0:
            return False
        old = self._entries.pop(tokens, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._drop_covered(tokens)
        self._entries[tokens] = CacheEntry(tokens, kv, nbytes)
        self.nbytes += nbytes
        while self._entries and (self.nbytes > self.max_bytes or len(self._entries) > self.max_entries):
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        return True

    def _drop_covered(self, tokens: tuple[int, ...]) -> None:
        # An entry that is a prefix of the new one can never be the longest match again.
        for key in [k for k in self._entries if len(k) <= len(tokens) and tokens[: len(k)] == k]:
            self.nbytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0


class KVBudget:
    """Tokens of KV in use, per sequence, against a fixed capacity."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._used: dict[int, int] = {}
        self.num_used = 0

    def reserve(self, seq_id: int, num_tokens: int) -> bool:
        """Reserve before a forward; False (nothing reserved) when it would not fit."""
        if self.num_used + num_tokens > self.capacity:
            return False
        self._used[seq_id] = self._used.get(seq_id, 0) + num_tokens
        self.num_used += num_tokens
        return True

    def give_back(self, seq_id: int, num_tokens: int) -> None:
        """Return part of a reservation (the pad positions trimmed after a padded piece)."""
        num_tokens = min(num_tokens, self._used.get(seq_id, 0))
        self._used[seq_id] -= num_tokens
        self.num_used -= num_tokens

    def release(self, seq_id: int) -> None:
        self.num_used -= self._used.pop(seq_id, 0)

    def used_by(self, seq_id: int) -> int:
        return self._used.get(seq_id, 0)
