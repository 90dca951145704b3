"""The synchronous engine: one `step()` is one scheduler tick over one `Runner`."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

from ..chunking import budget_policy
from ..chunking.calibration import calibrate, default_grid
from ..chunking.cost_model import TickSample, TickShape
from ..chunking.probe import ROW_PROMPT, TickProbe
from .events import Event
from .request import Request
from .scheduler import Scheduler
from ...errors import SlotActionError
from .slots import ModelIdentity, SlotAction, SlotFiles, SlotResult
from .stats import EngineStats, KVInfo, Limits
from .step import Runner, Step

if TYPE_CHECKING:
    from ..runner.constraints import ConstraintCompiler

log = logging.getLogger("mlxcel_py.engine")
CALIBRATION_CONTEXT = 4096  # the scratch prompt the calibration may build (bounded by the slot)


def tick_shape(steps: Iterable[Step], fuses_up_to: int = 0) -> TickShape:
    """What a tick's records computed, for the cost model: its decode rows and its prefill piece,
    `fused` when one record carried both and the runner runs them as one forward (a piece of up
    to `fuses_up_to` tokens, engine/runner/tick.py)."""
    tokens = context = rows = row_context = 0
    fused = False
    for step in steps:
        if step.decode:  # a verified position costs about a row, and rows are padded to the widest draft
            widest = max([len(d) for d in step.drafts] + list(step.draft_lengths) + [0])
            rows, row_context = len(step.decode) * (1 + widest), step.decode_context
        if step.prefill is not None:
            tokens, context = len(step.prefill.tokens), step.prefill.start
            fused = bool(step.decode) and tokens <= fuses_up_to
    return TickShape(tokens, context, rows, row_context, fused)


class Engine:
    """Admit, decode the active batch, run one prefill piece, retire; returns the tick's events."""

    def __init__(self, scheduler: Scheduler, runner: Runner, *, itl_budget_ms: Optional[int] = None,
                 vocab_size: int = 0, kv: KVInfo = KVInfo(), identity: Optional[ModelIdentity] = None):
        self.scheduler = scheduler
        self.kv = kv
        self.slots = SlotFiles(scheduler, runner, identity) if identity is not None and runner.saves_slots else None
        self.runner = runner
        self.itl_budget_ms, self.vocab_size = itl_budget_ms, vocab_size
        self._peak_memory = 0  # read from the runner after each tick, on the engine thread

    def prepare(self) -> None:
        """Work before the first tick, on the engine thread: with an ITL budget, time a few real
        ticks (the calibration) and switch the scheduler to the budget policy seeded by them."""
        if self.itl_budget_ms is None:
            return
        s = self.scheduler
        probe = TickProbe(self.runner, min(s.slot_context - 1, CALIBRATION_CONTEXT), self.vocab_size, clock=s.clock)
        try:
            fuse = self.runner.fuses_up_to
            cal = calibrate(probe.measure, default_grid(s.policy.alone, rows=min(4, s.num_slots - 1), fuses_up_to=fuse),
                            row_context=ROW_PROMPT)
        finally:
            probe.close()
        policy = budget_policy(self.itl_budget_ms, cal, s.policy.alone, fuse)
        s.switch_policy(policy)
        log.info("prefill_chunk_size %s", policy.describe())
        log.info("cost model seeded by %d calibration ticks: %s", len(cal.samples), cal.model(fuses_up_to=fuse).stats().describe())

    def step(self, on_admitted: Optional[Callable[[], None]] = None) -> list[Event]:
        """One tick: admit, the decode step, one prefill piece (its chunk chosen after the decode),
        then retire what finished, so its KV is free and its snapshot stored before the next admission.

        `on_admitted` runs between admission and the model calls (the worker publishes
        stats there, so /slots shows a prefill while its first piece runs)."""
        s = self.scheduler
        start = s.clock()
        events = s.admit()
        if on_admitted is not None:
            on_admitted()
        issued: list[Step] = []
        for step in self._records():
            issued.append(step)
            began = s.clock()
            out = self.runner.execute(step)
            if step.decode and step.prefill is None:  # the draft gate compares decode steps alone
                s.timed_decode(step, out, s.clock() - began)
            events += s.update(step, out)
        elapsed = s.clock() - start
        shape = tick_shape(issued, self.runner.fuses_up_to)
        if elapsed > 0 and (shape.tokens or shape.rows):
            s.policy.observe(TickSample(shape, elapsed))  # the budget policy learns; a fixed one ignores it
        self._peak_memory = self.runner.peak_memory_bytes()
        return events

    def _records(self) -> Iterator[Step]:
        """The tick's records: the decode step, the prefill piece, the pending retirements. A runner
        that runs both in one forward (`one_forward`) gets an undrafted decode step and the piece
        as one record (engine/runner/tick.py); each is scheduled as it would be alone."""
        s = self.scheduler
        decode = s.schedule_decode()
        if decode is not None and self._one_forward() and not (decode.drafts or decode.draft_lengths):
            piece = s.schedule_prefill()
            if piece is not None:
                decode = dataclasses.replace(decode, prefill=piece.prefill, retire=decode.retire + piece.retire,
                                             drop_snapshots=decode.drop_snapshots + piece.drop_snapshots)
        if decode is not None:
            yield decode
        if decode is None or decode.prefill is None:
            if (piece := s.schedule_prefill()) is not None:
                yield piece
        if (retire := s.schedule_retire()) is not None:
            yield retire

    def _one_forward(self) -> bool:
        """Whether to schedule the piece with the decode step: the runner fuses, and the policy's
        contended pieces can fuse (the budget's fit knows fused ticks; a fixed chunk must fit)."""
        fuse = self.runner.fuses_up_to if self.runner.one_forward else 0
        return fuse > 0 and self.scheduler.policy.fuses(fuse)

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def slot_action(self, action: SlotAction) -> SlotResult:
        """A slot save, restore or erase, between ticks (engine/core/slots.py)."""
        if self.slots is None:
            raise SlotActionError("This server does not support slots action with this runner (a distributed "
                                  "engine keeps no slot files)", status=501, code="not_supported_error")
        return self.slots.run(action)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def idle(self) -> None:
        """Nothing to do this tick: the runner's keepalive (a distributed leader pings its ranks)."""
        self.runner.idle()

    @property
    def compiler(self) -> Optional["ConstraintCompiler"]:
        """The runner's grammar compiler (thread-safe): the HTTP side compiles a request's grammar
        with it before queuing, so a bad one is a 400 and the runner finds it cached."""
        return self.runner.compiler

    @property
    def limits(self) -> Limits:
        s = self.scheduler
        return Limits(s.num_slots, s.slot_context, s.max_queue)

    def stats(self) -> EngineStats:
        return dataclasses.replace(self.scheduler.stats(), peak_memory_bytes=self._peak_memory, kv=self.kv)

    def close(self) -> None:
        """Called by the worker on the stopping thread once the engine thread has ended."""
        self.runner.close()
