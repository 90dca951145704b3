"""Snapshots of engine state for /slots, /metrics and logs (plain data, copied per tick)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ..chunking.budget import BudgetStats


SlotState = Literal["idle", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class Limits:
    """What an engine can hold: slots, KV tokens per slot, and requests that may wait beyond the slots."""

    num_slots: int
    slot_context: int
    max_queue: int

    @property
    def max_outstanding(self) -> int:
        return self.num_slots + self.max_queue


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot_id: int
    state: SlotState
    request_id: Optional[str] = None
    prompt_tokens: int = 0
    processed: int = 0  # prompt tokens in the KV cache, adopted ones included
    generated: int = 0
    context_shifts: int = 0  # the running sequence's context shifts (--context-shift)


@dataclass(frozen=True, slots=True)
class KVInfo:
    """How the KV is stored (--cache-type-k/-v) and what one token of it costs: `bytes_per_token` over
    the layers that keep every position; sliding-window layers that keep at most `window_positions`
    a slot (engine/runner/kv_rows.py) cost `window_bytes_per_token` up to there."""

    type_k: str = ""
    type_v: str = ""
    bytes_per_token: int = 0
    window_bytes_per_token: int = 0
    window_positions: int = 0

    def slot_bytes(self, tokens: int) -> int:
        """The KV bytes of a slot holding `tokens` positions."""
        return tokens * self.bytes_per_token + min(tokens, self.window_positions) * self.window_bytes_per_token


@dataclass(frozen=True, slots=True)
class EngineStats:
    slots: tuple[SlotInfo, ...] = ()
    num_waiting: int = 0
    slot_context: int = 0  # tokens of KV per slot (prompt + generated)
    max_queue: int = 0
    num_requests_finished: int = 0
    num_prompt_tokens: int = 0  # prompt tokens forwarded through the model
    num_cached_prompt_tokens: int = 0  # prompt tokens adopted from the prompt cache
    num_generated_tokens: int = 0
    num_decode_steps: int = 0
    num_draft_tokens: int = 0  # prompt-lookup draft tokens verified
    num_draft_accepted: int = 0  # ... and accepted
    prefill_pieces_by_chunk: tuple[tuple[int, int], ...] = ()  # (chunk, count), sorted
    num_kv_tokens: int = 0
    prompt_cache_entries: int = 0
    prompt_cache_bytes: int = 0
    peak_memory_bytes: int = 0  # the runner's peak (MLX's allocator, else the process's peak RSS)
    budget: Optional[BudgetStats] = None  # the ITL-budget policy and its cost model, when on
    num_context_shifts: int = 0  # context shifts done (--context-shift)
    num_discarded_tokens: int = 0  # ... and the KV tokens they dropped
    kv: KVInfo = KVInfo()

    @property
    def num_busy_slots(self) -> int:
        return sum(1 for s in self.slots if s.state != "idle")

