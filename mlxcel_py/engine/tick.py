"""The synchronous engine: one `step()` is one scheduler tick."""

from __future__ import annotations

import dataclasses

from .events import Event
from .request import Request
from .scheduler import Scheduler
from .stats import EngineStats, Limits


class Engine:
    """Admit, decode the active batch, retire, run one prefill piece; returns the tick's events."""

    def __init__(self, scheduler: Scheduler, runner):
        self.scheduler = scheduler
        self.runner = runner
        self._peak_memory = 0  # read from the runner after each tick, on the engine thread

    def step(self) -> list[Event]:
        events = self.scheduler.admit()
        self._retire()
        if (decode := self.scheduler.schedule_decode()) is not None:
            events += self.scheduler.update_decode(decode, self.runner.decode(decode))
            self._retire()
        if (piece := self.scheduler.schedule_prefill()) is not None:
            events += self.scheduler.update_prefill(piece, self.runner.prefill(piece))
            self._retire()  # a request done at its first token: snapshot it before the next admission
        peak = getattr(self.runner, "peak_memory_bytes", None)
        if peak is not None:
            self._peak_memory = peak()
        return events

    def _retire(self) -> None:
        if retired := self.scheduler.take_retired():
            self.scheduler.store_snapshots(self.runner.retire(retired))

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

