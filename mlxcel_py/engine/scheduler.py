"""Who decodes and which prefill piece runs, tick by tick. Plain Python: no MLX, no threads.

State: an active batch (decoding), at most one parked chunked prefill, and a waiting queue.
The prefill chunk is read from the policy every time a piece is planned, so it follows
whether anything is decoding *now*; the plan resumes at the sequence's cursor.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

from ..errors import PromptTooLongError
from .kv import KVBudget, PromptCache
from .plan import PlanCaps, PrefillChunkPolicy, PrefillPlan
from .sequence import DecodeWork, PrefillOutput, PrefillWork, RetireWork, Sequence, Snapshot
from .stats import EngineStats, SlotInfo
from .text import TextStream
from .events import Event, Finished, PromptProgress, TokenDelta
from .request import Request

Clock = Callable[[], float]


def check_fits(request: Request, slot_context: int) -> None:
    """Refuse a prompt that can never run: it must leave room for one generated token."""
    n = len(request.prompt_ids)
    if n >= slot_context:
        raise PromptTooLongError(
            f"the prompt has {n} tokens, but a slot's context holds {slot_context} "
            f"(prompt plus at least one generated token); shorten it or raise --ctx-size",
            n_prompt_tokens=n, n_ctx=slot_context,
        )


class Scheduler:
    """Admission, decode batching and chunked prefill over sequences; emits engine events."""

    def __init__(
        self,
        *,
        policy: PrefillChunkPolicy,
        num_slots: int,
        slot_context: int,
        max_queue: int,
        make_stream: Callable[[tuple[str, ...]], TextStream],
        eos_token_ids: frozenset[int],
        caps: PlanCaps = PlanCaps(),
        prompt_cache: Optional[PromptCache] = None,
        clock: Clock = time.perf_counter,
    ):
        self.policy, self.caps, self.clock = policy, caps, clock
        self.num_slots, self.slot_context, self.max_queue = num_slots, slot_context, max_queue
        self.make_stream, self.eos_token_ids = make_stream, eos_token_ids
        self.prompt_cache = prompt_cache
        self.budget = KVBudget(num_slots * slot_context)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: Optional[Sequence] = None
        self.running: list[Sequence] = []
        self._aborts: set[str] = set()
        self._retired: list[RetireWork] = []
        self._free_slots = list(range(num_slots))
        self._next_id = 0
        self.counters = {"finished": 0, "prompt": 0, "cached": 0, "generated": 0, "decode_steps": 0}
        self.pieces_by_chunk: dict[int, int] = {}

    # -- requests in ----------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self._next_id += 1
        seq = Sequence(request=request, seq_id=self._next_id, arrival=self.clock())
        seq.max_tokens = min(request.sampling.max_tokens, self.slot_context - seq.prompt_len)
        seq.stream = self.make_stream(request.sampling.stop)
        self.waiting.append(seq)

    def abort(self, request_id: str) -> None:
        self._aborts.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running or self._aborts or self._retired)

    # -- one tick: admit, decode, retire, prefill ------------------------------------------
    def admit(self) -> list[Event]:
        """Apply aborts, then park the next waiting request as the chunked prefill."""
        events = self._apply_aborts()
        if self.prefilling is None and self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.slot = self._free_slots.pop(0)
            seq.admitted = self.clock()
            hit = None
            if self.prompt_cache is not None and seq.request.cache_prompt:
                hit = self.prompt_cache.lookup(seq.request.prompt_ids)
            seq.adopt(hit, min(self.policy.alone, self.policy.contended))
            self.prefilling = seq
        return events

    def schedule_decode(self) -> Optional[DecodeWork]:
        if not self.running:
            return None
        for seq in self.running:  # one KV position per sequence; a slot's context caps it
            self.budget.reserve(seq.seq_id, 1)
        return DecodeWork(tuple(s.seq_id for s in self.running))

    def update_decode(self, work: DecodeWork, tokens: tuple[int, ...]) -> list[Event]:
        self.counters["decode_steps"] += 1
        events: list[Event] = []
        by_id = {s.seq_id: s for s in self.running}
        for seq_id, token in zip(work.seq_ids, tokens):
            events += self._emit_token(by_id[seq_id], token)
        self.running = [s for s in self.running if s.finish_reason is None]
        return events

    def schedule_prefill(self) -> Optional[PrefillWork]:
        """Plan the parked prefill from its cursor with the chunk for the state right now."""
        seq = self.prefilling
        if seq is None:
            return None
        chunk = self.policy.chunk(others_decoding=bool(self.running))
        plan = self.plan_for(seq, chunk)
        piece = plan.pieces()[0]
        if not self.budget.reserve(seq.seq_id, piece.padded_len):
            return None  # cannot happen while every slot fits its context; wait for room
        snapshot = piece.ends_at_boundary and self._caching(seq)
        adopt = seq.hit if seq.prefill_offset == seq.adopted else None
        if seq.prefill_started is None:
            seq.prefill_started = self.clock()
        return PrefillWork(seq.seq_id, seq.request.prompt_ids, piece, chunk, adopt, seq.request.sampling, snapshot)

    def update_prefill(self, work: PrefillWork, out: PrefillOutput) -> list[Event]:
        seq = self.prefilling
        piece = work.piece
        self.budget.give_back(seq.seq_id, piece.num_pad)
        self.counters["prompt"] += piece.length
        self.pieces_by_chunk[work.chunk] = self.pieces_by_chunk.get(work.chunk, 0) + 1
        seq.prefill_offset = piece.end
        if out.snapshot is not None:
            self._store(out.snapshot)
        now = self.clock()
        events: list[Event] = [
            PromptProgress(
                seq.request.request_id, seq.prompt_len, seq.adopted, piece.end,
                (now - seq.prefill_started) * 1000.0, work.chunk,
            )
        ]
        if piece.terminal:
            self.prefilling = None
            seq.first_token_at = now
            self.running.append(seq)
            events += self._emit_token(seq, out.first_token)
            self.running = [s for s in self.running if s.finish_reason is None]
        return events

    def take_retired(self) -> list[RetireWork]:
        retired, self._retired = self._retired, []
        return retired

    def store_snapshots(self, snapshots: list[Snapshot]) -> None:
        for snap in snapshots:
            self._store(snap)

    # -- helpers ---------------------------------------------------------------------------
    def plan_for(self, seq: Sequence, chunk: int) -> PrefillPlan:
        return PrefillPlan.resume_at(seq.prompt_len, seq.adopted, seq.boundary, seq.prefill_offset, chunk, self.caps)

    def _caching(self, seq: Sequence) -> bool:
        return self.prompt_cache is not None and seq.request.cache_prompt

    def _store(self, snap: Snapshot) -> None:
        if self.prompt_cache is not None:
            self.prompt_cache.insert(snap.tokens, snap.kv, snap.nbytes)

    def _emit_token(self, seq: Sequence, token: int) -> list[Event]:
        seq.output_ids.append(token)
        self.counters["generated"] += 1
        rid = seq.request.request_id
        if token in self.eos_token_ids and not seq.request.sampling.ignore_eos:
            return self._finish(seq, "stop", drop_last=True)
        events: list[Event] = []
        text = seq.stream.push(token)
        events.append(TokenDelta(rid, token, text))
        if seq.stream.stopped:
            return events + self._finish(seq, "stop")
        if len(seq.output_ids) >= seq.max_tokens:
            return events + self._finish(seq, "length")
        return events

    def _finish(self, seq: Sequence, reason: str, drop_last: bool = False) -> list[Event]:
        """End a sequence: free its slot, queue its KV for retirement, emit `Finished`."""
        seq.finish_reason = reason
        seq.finished_at = self.clock()
        if drop_last:  # the eos token is not part of the completion
            seq.output_ids.pop()
        tail = seq.stream.finish() if reason != "abort" else ""
        in_kv = seq.prompt_len + max(len(seq.output_ids) - (0 if drop_last else 1), 0)
        tokens = (seq.request.prompt_ids + tuple(seq.output_ids))[:in_kv]
        want = self._caching(seq) and seq.first_token_at is not None and reason != "abort"
        self._retired.append(RetireWork(seq.seq_id, tokens if want else None))
        self.budget.release(seq.seq_id)
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            self._free_slots.sort()
        self.counters["finished"] += 1
        self.counters["cached"] += seq.adopted
        return [Finished(seq.request.request_id, reason, seq.usage(), seq.timings(), tail)]

    def _apply_aborts(self) -> list[Event]:
        if not self._aborts:
            return []
        ids, self._aborts = self._aborts, set()
        events: list[Event] = []
        for seq in [s for s in self.waiting if s.request.request_id in ids]:
            self.waiting.remove(seq)
            seq.slot = None
            events += self._finish(seq, "abort")
        if self.prefilling is not None and self.prefilling.request.request_id in ids:
            seq, self.prefilling = self.prefilling, None
            events += self._finish(seq, "abort")
        for seq in [s for s in self.running if s.request.request_id in ids]:
            events += self._finish(seq, "abort")
        self.running = [s for s in self.running if s.finish_reason is None]
        return events

    def stats(self) -> EngineStats:
        slots = [SlotInfo(i, "idle") for i in range(self.num_slots)]
        active = ([self.prefilling] if self.prefilling else []) + self.running
        for seq in active:
            state = "prefill" if seq is self.prefilling else "decode"
            slots[seq.slot] = SlotInfo(
                seq.slot, state, seq.request.request_id, seq.prompt_len, seq.prefill_offset, len(seq.output_ids)
            )
        c = self.counters
        return EngineStats(
            slots=tuple(slots), num_waiting=len(self.waiting), slot_context=self.slot_context,
            max_queue=self.max_queue, num_requests_finished=c["finished"], num_prompt_tokens=c["prompt"],
            num_cached_prompt_tokens=c["cached"], num_generated_tokens=c["generated"],
            num_decode_steps=c["decode_steps"], prefill_pieces_by_chunk=tuple(sorted(self.pieces_by_chunk.items())),
            num_kv_tokens=self.budget.num_used,
            prompt_cache_entries=len(self.prompt_cache) if self.prompt_cache else 0,
            prompt_cache_bytes=self.prompt_cache.nbytes if self.prompt_cache else 0,
        )
