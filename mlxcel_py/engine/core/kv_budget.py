"""Tokens of KV in use per sequence, against the slots' capacity (plain Python; the arrays live in the runner)."""

from __future__ import annotations


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

    def release(self, seq_id: int) -> None:
        self.num_used -= self._used.pop(seq_id, 0)

    def give_back(self, seq_id: int, num_tokens: int) -> None:
        """Return part of a reservation (a verify step's rejected draft positions)."""
        held = self._used.get(seq_id, 0)
        num_tokens = min(num_tokens, held)
        self._used[seq_id] = held - num_tokens
        self.num_used -= num_tokens
