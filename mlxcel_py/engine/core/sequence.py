"""A request's life in the engine: the mutable record the scheduler keeps per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .drafting import DraftState
from .events import Timings, Usage
from .prompt_cache import CacheHit
from .request import Request
from .text_stream import TextStream


@dataclass(slots=True)
class Sequence:
    """Mutable engine-side state of one request."""

    request: Request
    seq_id: int
    arrival: float
    slot: Optional[int] = None
    adopted: int = 0
    hit: Optional[CacheHit] = None
    boundary: Optional[int] = None  # the history boundary the plan honours (set at admission)
    prefill_offset: int = 0  # the cursor: prompt tokens in the KV cache
    max_tokens: int = 0
    stream: Optional[TextStream] = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    admitted: Optional[float] = None
    prefill_started: Optional[float] = None
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    draft: DraftState = field(default_factory=DraftState)
    shifts: list[tuple[int, int]] = field(default_factory=list)  # (n_keep, n_discard) per context shift, in order
    discarded: int = 0  # tokens the context shifts dropped from its KV

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def adopt(self, hit: Optional[CacheHit], max_segment: int) -> None:
        """Start from a cache hit; honour the history boundary only when its segment fits one piece.

        The plan runs the boundary segment as one unchunked forward (so it can be
        snapshotted); a long chat prompt is chunked like any other instead, and the
        prompt + reply snapshot taken at the finish serves the next turn.
        """
        self.hit = hit
        self.adopted = hit.length if hit is not None else 0
        self.prefill_offset = self.adopted
        b = self.request.history_boundary
        fits = b is not None and (max_segment == 0 or b - self.adopted <= max_segment)
        self.boundary = b if fits else None

    @property
    def kv_len(self) -> int:
        """Positions in its KV before the next decode step (every token but the last sampled one)."""
        return self.prompt_len + len(self.output_ids) - 1 - self.discarded

    def kv_tokens(self) -> tuple[int, ...]:
        """Prompt and output with each shift's discarded span removed (what its KV holds, plus the last token)."""
        tokens = self.request.prompt_ids + tuple(self.output_ids)
        for keep, discard in self.shifts:
            tokens = tokens[:keep] + tokens[keep + discard:]
        return tokens

    def usage(self) -> Usage:
        return Usage(self.prompt_len, len(self.output_ids), self.adopted)

    def timings(self) -> Timings:
        end = self.finished_at or self.arrival
        admitted = self.admitted or end
        first = self.first_token_at
        prefill_s = (first - (self.prefill_started or admitted)) if first else 0.0
        decode_s = (end - first) if first else 0.0
        forwarded = self.prompt_len - self.adopted
        n_decoded = max(len(self.output_ids) - 1, 0)
        return Timings(
            queue_ms=(admitted - self.arrival) * 1000.0,
            ttft_ms=((first - self.arrival) * 1000.0) if first else 0.0,
            prefill_ms=prefill_s * 1000.0,
            decode_ms=decode_s * 1000.0,
            prompt_tps=forwarded / prefill_s if prefill_s > 0 else 0.0,
            decode_tps=n_decoded / decode_s if decode_s > 0 else 0.0,
            draft_n=self.draft.num_drafted,
            draft_n_accepted=self.draft.num_accepted,
            context_shifts=len(self.shifts),
            discarded_tokens=self.discarded,
        )
