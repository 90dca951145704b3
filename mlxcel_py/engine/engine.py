"""The synchronous engine: one `step()` is one scheduler tick."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .kv import PromptCache
from .plan import PlanCaps
from .scheduler import Scheduler
from .stats import EngineStats
from .text import stream_factory
from .types import Event, Request

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..models import LoadedModel

log = logging.getLogger("mlxcel_py.engine")


class Engine:
    """Admit, decode the active batch, retire, run one prefill piece; returns the tick's events."""

    def __init__(self, scheduler: Scheduler, runner):
        self.scheduler = scheduler
        self.runner = runner

    def step(self) -> list[Event]:
        events = self.scheduler.admit()
        self._retire()
        if (decode := self.scheduler.schedule_decode()) is not None:
            events += self.scheduler.update_decode(decode, self.runner.decode(decode))
            self._retire()
        if (piece := self.scheduler.schedule_prefill()) is not None:
            events += self.scheduler.update_prefill(piece, self.runner.prefill(piece))
            self._retire()  # a request done at its first token: snapshot it before the next admission
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

    def check_request(self, request: Request, num_unqueued: int = 0) -> None:
        self.scheduler.check_request(request, num_unqueued)

    def stats(self) -> EngineStats:
        return self.scheduler.stats()

    def close(self) -> None:
        """Called by the worker on the stopping thread once the engine thread has ended."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()


def slot_context(ctx_size: int | None, num_slots: int, model_context: int) -> int:
    """Per-slot context: the total split over slots, never more than the model's maximum."""
    if ctx_size is None:
        return model_context
    return max(1, min(ctx_size // num_slots, model_context))


def build_engine(config: "EngineConfig", loaded: "LoadedModel") -> Engine:
    """The engine for a loaded model; every front end builds it through here."""
    from .runner import Runner  # the only import of the model-calling code

    per_slot = slot_context(config.ctx_size, config.num_slots, loaded.context_length)
    pc = config.prompt_cache
    cache = PromptCache(pc.max_bytes, pc.max_entries, pc.min_prefix) if pc.enabled else None
    scheduler = Scheduler(
        policy=config.policy,
        num_slots=config.num_slots,
        slot_context=per_slot,
        max_queue=config.max_queue,
        make_stream=stream_factory(loaded.tokenizer),
        eos_token_ids=frozenset(loaded.eos_token_ids),
        caps=PlanCaps(),
        prompt_cache=cache,
    )
    log.info("prefill_chunk_size %s", config.policy.describe())
    log.info("slots=%d context per slot=%d tokens (total %d)", config.num_slots, per_slot, per_slot * config.num_slots)
    if cache is not None:
        log.info("prompt cache: up to %d entries, %d MiB, min prefix %d", pc.max_entries, pc.max_bytes >> 20, pc.min_prefix)
    else:
        log.info("prompt cache: off")
    return Engine(scheduler, Runner(loaded.model))
