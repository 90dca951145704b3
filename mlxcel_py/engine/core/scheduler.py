"""Who decodes and which prefill piece runs, tick by tick. Plain Python: no MLX, no threads.

State: an active batch (decoding), at most one parked chunked prefill, and a waiting queue.
The prefill chunk is read from the policy every time a piece is planned, so it follows
whether anything is decoding *now*; the plan resumes at the sequence's cursor.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Callable, Optional

from ...errors import PromptTooLongError
from ..chunking.pieces import next_piece
from ..chunking.policy import ChunkPolicy, TickState
from .decode_rows import DecodeRows, _seeded
from .drafting import DraftConfig, DraftGate, cap_plans
from .events import Embedding, Event, Finished, PromptProgress, TokenDelta, TokenLogprobs
from .kv_budget import KVBudget
from .prompt_cache import PromptCache
from .request import Request
from .sequence import Sequence
from .stats import EngineStats, SlotInfo
from .step import BeginSequence, PrefillPiece, Retire, Shift, Step, StepOutput
from .text_stream import TextStream

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


class Scheduler(DecodeRows):
    """Admission, decode batching and chunked prefill over sequences; emits engine events."""

    def __init__(
        self,
        *,
        policy: ChunkPolicy,
        num_slots: int,
        slot_context: int,
        max_queue: int,
        make_stream: Callable[[tuple[str, ...]], TextStream],
        eos_token_ids: frozenset[int],
        prompt_cache: Optional[PromptCache] = None,
        clock: Clock = time.perf_counter,
        drafting: Optional[DraftConfig] = None,
        context_shift: bool = False,
    ):
        self.policy, self.clock = policy, clock
        self.num_slots, self.slot_context, self.max_queue = num_slots, slot_context, max_queue
        self.make_stream, self.eos_token_ids = make_stream, eos_token_ids
        self.prompt_cache = prompt_cache
        self.drafting = drafting if drafting is not None and drafting.enabled else None
        self.gate = DraftGate() if self.drafting is not None else None  # drafting off where it loses, by size
        self.context_shift = context_shift  # a full slot shifts its KV (context_shift.py) instead of ending
        self.budget = KVBudget(num_slots * slot_context)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: Optional[Sequence] = None
        self.running: list[Sequence] = []
        self._aborts: set[str] = set()
        self._retired: list[Retire] = []
        self._free_slots = list(range(num_slots))
        self._next_id = 0
        self._num_drafted = 0  # draft tokens in this tick's decode step: the piece's chunk counts them
        self.counters = {"finished": 0, "prompt": 0, "cached": 0, "generated": 0, "decode_steps": 0,
                         "drafted": 0, "draft_accepted": 0, "context_shifts": 0, "discarded": 0}
        self.pieces_by_chunk: dict[int, int] = {}
        # Per slot, the tokens whose KV its last request left in the prompt cache (slots.py saves them).
        self.slot_tokens: dict[int, tuple[int, ...]] = {}

    # -- requests in ----------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self._next_id += 1
        seq = Sequence(request=request, seq_id=self._next_id, arrival=self.clock())
        seq.max_tokens = request.sampling.max_tokens
        if not self._shifting(seq):  # the slot's context ends the reply
            seq.max_tokens = min(seq.max_tokens, self.slot_context - seq.prompt_len)
        seq.stream = self.make_stream(request.sampling.stop)
        self.waiting.append(seq)

    def abort(self, request_id: str) -> None:
        self._aborts.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running or self._aborts or self._retired)

    def switch_policy(self, policy: ChunkPolicy) -> None:
        """Plan the next pieces with `policy` (the engine's calibration hands over the budget policy)."""
        self.policy = policy

    # -- one tick: admit, then a decode step, then a prefill piece -------------------------
    def admit(self) -> list[Event]:
        """Apply aborts, then park the next waiting request as the chunked prefill."""
        events = self._apply_aborts()
        if self.prefilling is None and self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.slot = self._free_slots.pop(0)
            seq.admitted = self.clock()
            hit = None
            if self._caching(seq) and not seq.request.sampling.prompt_logprobs:  # echo scores every token
                hit = self.prompt_cache.lookup(seq.request.cache_ids)
            seq.adopt(hit, min(self.policy.alone, self.policy.contended))
            self.prefilling = seq
        return events

    def schedule_decode(self) -> Optional[Step]:
        """One decode step for the whole active batch (and the retirements pending since the last step)."""
        self._num_drafted = 0
        if not (self.running or self._retired):
            return None
        shifts = self._shifts()
        open_ = self.gate is None or self.gate.allows(len(self.running), self.counters["decode_steps"])
        # A seeded sampled row drafts by its own state alone: speculative sampling draws its RNG
        # otherwise than plain decoding, so a timing-driven gate would make its output vary.
        plans = cap_plans(self.drafting, [self._draft(s) if open_ or _seeded(s) else ((), 0) for s in self.running])
        drafts, lengths = tuple(p[0] for p in plans), tuple(p[1] for p in plans)
        widest = max((len(d) + n for d, n in plans), default=0)
        self._num_drafted = len(plans) * widest  # every row is padded to the widest draft
        for seq, (draft, n) in zip(self.running, plans):  # one KV position per token in; a slot's context caps it
            self.budget.reserve(seq.seq_id, 1 + len(draft) + n)
        return self._step(decode=tuple(s.seq_id for s in self.running), decode_context=self._decode_context(),
                          drafts=drafts if any(drafts) else (), draft_lengths=lengths if any(lengths) else (),
                          shift=shifts)

    def schedule_prefill(self) -> Optional[Step]:
        """The parked prefill's next piece, cut with the chunk for the state right now."""
        seq = self.prefilling
        if seq is None:
            return None
        chunk = self.policy.chunk_for(TickState(
            num_decoding=len(self.running) + self._num_drafted if self.running else 0,
            decode_context=self._decode_context(),
            prefill_context=seq.prefill_offset, remaining=seq.prompt_len - seq.prefill_offset,
        ))
        if seq.request.whole_prompt:  # an encoder's prompt is never split
            chunk = max(chunk, seq.prompt_len - seq.prefill_offset)
        piece = next_piece(seq.prompt_len, seq.adopted, seq.boundary, seq.prefill_offset, chunk,
                           seq.request.unsplit)
        if not self.budget.reserve(seq.seq_id, piece.length):
            return None  # cannot happen while every slot fits its context; wait for room
        prompt = seq.request.prompt_ids
        cached = piece.ends_at_boundary and self._caching(seq)
        snapshot_id = self.prompt_cache.insert(seq.request.cache_ids[: piece.end]) if cached else None
        begin = None
        if seq.prefill_started is None:
            seq.prefill_started = self.clock()
            adopt_id = seq.hit.snapshot_id if seq.hit is not None else None
            begin = BeginSequence(seq.request.sampling, prompt[: seq.adopted], adopt_id, seq.request.pooling,
                                  seq.request.images, seq.request.lora)
        work = PrefillPiece(seq.seq_id, piece.start, prompt[piece.start : piece.end], chunk, piece.terminal,
                            snapshot_id, begin)
        return self._step(prefill=work)

    def command_step(self, **fields) -> Step:
        """A record outside the tick (a slot action's), carrying the pending retirements and drops."""
        return dataclasses.replace(self._step(), **fields)

    def slot_busy(self, slot: int) -> bool:
        return any(s.slot == slot for s in ([self.prefilling] if self.prefilling else []) + self.running)

    def schedule_retire(self) -> Optional[Step]:
        """The retirements still pending at the end of a tick (requests done at their first token)."""
        return self._step() if self._retired else None

    def update(self, step: Step, out: StepOutput) -> list[Event]:
        """Apply what the runner sampled for `step`; returns the events it produced."""
        events: list[Event] = []
        if step.decode:
            self.counters["decode_steps"] += 1
            by_id = {s.seq_id: s for s in self.running}
            none = ((),) * len(step.decode)
            logprobs = out.decoded_logprobs or (None,) * len(step.decode)
            failed = dict(out.failed)
            lengths = step.draft_lengths or (0,) * len(step.decode)
            for seq_id, token, lp, draft, n, more in zip(step.decode, out.decoded, logprobs, step.drafts or none,
                                                         lengths, out.decoded_extra or none):
                seq = by_id[seq_id]
                if draft or n:
                    self._verified(seq, len(draft) + n, more)
                events += self._emit_token(seq, token, lp, failed.get(seq_id))
                for extra in more:  # the accepted draft tokens, then the target's; a finish ends the run
                    if seq.finish_reason is not None:
                        break
                    events += self._emit_token(seq, extra)
            self.running = [s for s in self.running if s.finish_reason is None]
        if step.prefill is not None:
            events += self._prefilled(step.prefill, out)
        return events

    # -- helpers ---------------------------------------------------------------------------
    def _step(self, decode: tuple[int, ...] = (), prefill: Optional[PrefillPiece] = None,
              decode_context: int = 0, drafts: tuple[tuple[int, ...], ...] = (),
              draft_lengths: tuple[int, ...] = (), shift: tuple[Shift, ...] = ()) -> Step:
        retired, self._retired = tuple(self._retired), []
        dropped = self.prompt_cache.take_dropped() if self.prompt_cache is not None else ()
        return Step(retired, decode, prefill, dropped, decode_context, drafts, draft_lengths=draft_lengths,
                    shift=shift)

    def _prefilled(self, piece: PrefillPiece, out: StepOutput) -> list[Event]:
        seq = self.prefilling
        self.counters["prompt"] += len(piece.tokens)
        self.pieces_by_chunk[piece.chunk] = self.pieces_by_chunk.get(piece.chunk, 0) + 1
        seq.prefill_offset = piece.end
        now = self.clock()
        events: list[Event] = [
            PromptProgress(
                seq.request.request_id, seq.prompt_len, seq.adopted, piece.end,
                (now - seq.prefill_started) * 1000.0, piece.chunk, out.prompt_logprobs,
            )
        ]
        if piece.terminal:
            self.prefilling = None
            seq.first_token_at = now
            if seq.request.pooling is not None:  # an embedding: its vector, and it ends (no decode)
                events.append(Embedding(seq.request.request_id, out.embedding))
                return events + self._finish(seq, "stop")
            self.running.append(seq)
            events += self._emit_token(seq, out.first_token, out.first_logprobs, dict(out.failed).get(seq.seq_id))
            self.running = [s for s in self.running if s.finish_reason is None]
        return events

    def _decode_context(self) -> int:
        """KV positions over the decoding sequences (what their attention reads)."""
        return sum(s.prompt_len + len(s.output_ids) - s.discarded for s in self.running)

    def _caching(self, seq: Sequence) -> bool:
        # An embedding pools every position's hidden state, so it neither adopts nor stores KV.
        # A prompt with images is cached under its key, in which each image's tokens stand for that image.
        # A request with its own LoRA scales runs another model: its KV is never shared.
        return (self.prompt_cache is not None and seq.request.cache_prompt and seq.request.pooling is None
                and (seq.request.images is None or seq.request.cache_key is not None) and seq.request.lora is None)

    def _emit_token(self, seq: Sequence, token: int, logprobs: Optional[TokenLogprobs] = None,
                    error: Optional[str] = None) -> list[Event]:
        seq.output_ids.append(token)
        self.counters["generated"] += 1
        rid = seq.request.request_id
        if error is not None:  # the runner could not sample this sequence: it alone ends
            return self._finish(seq, "error", drop_last=True, error=error)
        if token in self.eos_token_ids and not seq.request.sampling.ignore_eos:
            return self._finish(seq, "stop", drop_last=True)
        events: list[Event] = []
        text = seq.stream.push(token)
        events.append(TokenDelta(rid, token, text, logprobs))
        if seq.stream.stopped:
            return events + self._finish(seq, "stop")
        if len(seq.output_ids) >= seq.max_tokens:
            return events + self._finish(seq, "length")
        return events

    def _finish(self, seq: Sequence, reason: str, drop_last: bool = False, error: Optional[str] = None) -> list[Event]:
        """End a sequence: free its slot, queue its KV for retirement (snapshotted), emit `Finished`."""
        seq.finish_reason = reason
        seq.finished_at = self.clock()
        if drop_last:  # the eos token is not part of the completion
            seq.output_ids.pop()
        tail = seq.stream.finish() if reason != "abort" else ""
        in_kv = seq.prompt_len + max(len(seq.output_ids) - (0 if drop_last else 1), 0)
        tokens = (seq.request.cache_ids + tuple(seq.output_ids))[:in_kv]
        snapshot_id = None
        # No snapshot of a shifted KV: the next turn resends the whole history (past the slot), and a
        # re-rotated tail ("rotate" mode) is not the prefill of any token list.
        if self._caching(seq) and seq.first_token_at is not None and reason != "abort" and not seq.shifts:
            snapshot_id = self.prompt_cache.insert(tokens)  # indexed now: the next admission may adopt it
        self._retired.append(Retire(seq.seq_id, snapshot_id, len(tokens) if snapshot_id is not None else 0))
        if seq.slot is not None and reason != "abort":  # the slot's KV is now this request's (or none)
            self.slot_tokens[seq.slot] = tokens if snapshot_id is not None else ()
        self.budget.release(seq.seq_id)
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            self._free_slots.sort()
        self.counters["finished"] += 1
        self.counters["cached"] += seq.adopted
        return [Finished(seq.request.request_id, reason, seq.usage(), seq.timings(), tail, error,
                         stop_word=seq.stream.matched, slot=seq.slot)]

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
                seq.slot, state, seq.request.request_id, seq.prompt_len, seq.prefill_offset, len(seq.output_ids),
                len(seq.shifts),
            )
        c = self.counters
        return EngineStats(
            slots=tuple(slots), num_waiting=len(self.waiting), slot_context=self.slot_context,
            max_queue=self.max_queue, num_requests_finished=c["finished"], num_prompt_tokens=c["prompt"],
            num_cached_prompt_tokens=c["cached"], num_generated_tokens=c["generated"],
            num_decode_steps=c["decode_steps"], num_draft_tokens=c["drafted"],
            num_draft_accepted=c["draft_accepted"], prefill_pieces_by_chunk=tuple(sorted(self.pieces_by_chunk.items())),
            num_kv_tokens=self.budget.num_used,
            prompt_cache_entries=len(self.prompt_cache) if self.prompt_cache else 0,
            prompt_cache_bytes=self.prompt_cache.nbytes if self.prompt_cache else 0,
            budget=self.policy.stats(), num_context_shifts=c["context_shifts"], num_discarded_tokens=c["discarded"],
        )
