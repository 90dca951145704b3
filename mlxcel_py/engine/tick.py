"""The synchronous engine: one `step()` is one scheduler tick."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from .events import Event
from .request import Request
from .scheduler import Scheduler
from .stats import EngineStats, Limits


class Engine:
    """Admit, decode the active batch, retire, run one prefill piece; returns the tick's events."""

    def __init__(self, scheduler: Scheduler, runner):
        self.scheduler = scheduler
        self.runner = runner
        # The worker calls this when it has nothing to do: a distributed runner's keepalive
        # to the other ranks. None in one process, so the worker calls nothing at all.
        self.idle: Optional[Callable[[], None]] = getattr(runner, "idle", None)
        self._peak_memory = 0  # read from the runner after each tick, on the engine thread

    def step(self, on_admitted: Optional[Callable[[], None]] = None) -> list[Event]:
        """One tick: admit, the decode step, one prefill piece (its chunk chosen after the decode),
        then retire what finished, so its KV is free and its snapshot stored before the next admission.

        `on_admitted` runs between admission and the model calls (the worker publishes
        stats there, so /slots shows a prefill while its first piece runs)."""
        events = self.scheduler.admit()
        if on_admitted is not None:
            on_admitted()
        s = self.scheduler
        for schedule in (s.schedule_decode, s.schedule_prefill, s.schedule_retire):
            if (step := schedule()) is not None:
                events += s.update(step, self.runner.execute(step))
        peak = getattr(self.runner, "peak_memory_bytes", None)
        if peak is not None:
            self._peak_memory = peak()
        return events

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def limits(self) -> Limits:
        s = self.scheduler
        return Limits(s.num_slots, s.slot_context, s.max_queue)

    def stats(self) -> EngineStats:
        return dataclasses.replace(self.scheduler.stats(), peak_memory_bytes=self._peak_memory)

    def close(self) -> None:
        """Called by the worker on the stopping thread once the engine thread has ended."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

