"""The prompt cache's index in plain Python: which token prefixes have a KV snapshot, under which id.

The KV arrays themselves live in the runner, under the ids handed out here, so the
scheduler can be tested with lists.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A KV snapshot of `tokens`, stored by the runner under `snapshot_id`."""

    tokens: tuple[int, ...]
    snapshot_id: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheHit:
    snapshot_id: int
    length: int  # prompt tokens adopted from the snapshot


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
    """An LRU index of KV snapshots, bounded in bytes and entries, matched by longest prefix.

    Plain Python: the runner stores each snapshot under the id `insert` hands out, and frees
    the ids that `take_dropped` returns (evicted or superseded entries). `reach` (the runner's
    `prefix_reach`): a snapshot serves prefixes at most that many tokens shorter than itself (its
    sliding-window layers keep no older positions); None: any prefix.
    """

    def __init__(self, max_bytes: int, max_entries: int, min_prefix: int, bytes_per_token: int,
                 reach: Optional[int] = None, window: tuple[int, int] = (0, 0)):
        self.reach = reach
        self.window = window  # (bytes per token, positions) of layers that keep at most that many
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.min_prefix = max(1, min_prefix)
        self.bytes_per_token = bytes_per_token
        self._entries: "OrderedDict[tuple[int, ...], CacheEntry]" = OrderedDict()
        self._dropped: list[int] = []
        self._next_id = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: tuple[int, ...]) -> Optional[CacheHit]:
        """The entry sharing the longest prefix with `prompt`, capped so one token is left to forward."""
        best: Optional[CacheEntry] = None
        best_len = 0
        limit = len(prompt) - 1
        for entry in self._entries.values():
            n = min(common_prefix_len(entry.tokens, prompt), limit)
            if self.reach is not None and n < len(entry.tokens) - self.reach:
                continue  # its windowed layers no longer hold what a prefix this short needs
            if n >= self.min_prefix and n > best_len:
                best, best_len = entry, n
        if best is None:
            return None
        self._entries.move_to_end(best.tokens)
        return CacheHit(best.snapshot_id, best_len)

    def insert(self, tokens: tuple[int, ...]) -> Optional[int]:
        """Index a snapshot of `tokens`; its id, or None when it is too short or larger than the whole cache."""
        nbytes = len(tokens) * self.bytes_per_token + min(len(tokens), self.window[1]) * self.window[0]
        if len(tokens) < self.min_prefix or nbytes > self.max_bytes or self.max_entries <= 0:
            return None
        self._drop_covered(tokens)
        self._next_id += 1
        self._entries[tokens] = CacheEntry(tokens, self._next_id, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes or len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
        return self._next_id

    def covering(self, tokens: tuple[int, ...]) -> Optional[CacheEntry]:
        """An entry whose tokens start with `tokens` (itself, or a longer one that superseded it)."""
        if tokens in self._entries:
            return self._entries[tokens]
        n = len(tokens)
        return next((e for k, e in self._entries.items() if len(k) > n and k[:n] == tokens), None)

    def remove(self, tokens: tuple[int, ...]) -> bool:
        """Drop the entry of exactly `tokens`; whether there was one."""
        if tokens not in self._entries:
            return False
        self._drop(tokens)
        return True

    def take_dropped(self) -> tuple[int, ...]:
        """Snapshot ids no longer indexed, for the runner to free."""
        dropped, self._dropped = tuple(self._dropped), []
        return dropped

    def _drop_covered(self, tokens: tuple[int, ...]) -> None:
        # An entry that is a prefix of the new one (or equal) can never be the longest match again.
        for key in [k for k in self._entries if len(k) <= len(tokens) and tokens[: len(k)] == k]:
            self._drop(key)

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        self._dropped.append(entry.snapshot_id)
