"""Runners for one model split over the ranks of an `mx.distributed` group.

Rank 0 leads: `LeaderRunner.execute` broadcasts each `Step` record, then runs it on its own
shard. Every other rank runs `follow`: receive a record, execute it, until rank 0 says stop.
All ranks run the same `ModelRunner` code over the same records, so the model's collectives
(all-reduces inside the layers, pipeline sends) line up. Tokens are sampled on rank 0 and
shared, so every rank feeds the same tokens back whatever its logits' last bits (see
docs/DISTRIBUTED.md). One process (world size 1) never builds any of this.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Callable, ContextManager, Iterator, Optional

import mlx.core as mx

from ...errors import EngineError
from ..runner.constraints import ConstraintCompiler
from .link import Link, Watchdog
from ..runner.model_runner import ModelRunner
from ..runner.sampling import SampledToken
from ..core.step import Step, StepOutput

log = logging.getLogger("mlxcel_py.distributed")

KEEPALIVE_S = 1.0  # rank 0 pings the others this often while idle: a lost rank shows up even then


class RankLostError(EngineError):
    """A rank died, stalled or failed: the ranks can no longer execute records together."""


class ShardRunner(ModelRunner):
    """A `ModelRunner` over this rank's shard whose sampled tokens are rank 0's, on every rank.

    No CPU decode step: it holds whole weights and knows no collectives. Drafts are ignored (each row
    decodes one token): verifying them samples outside `_sample`, which the ranks share."""

    verifies_drafts = False

    def __init__(self, model, link: Link, compiler: Optional[ConstraintCompiler] = None, *,
                 kernels: Optional[ContextManager[Any]] = None, rank_head: Any = None):
        super().__init__(model, compiler, kernels=kernels, rank_head=rank_head)
        self.link = link

    def _sample(self, logits: mx.array, seq_ids) -> list[SampledToken]:
        if self.link.rank == 0:  # samples (and reads logprobs, advances grammars); the others take its ids
            sampled = super()._sample(logits, seq_ids)
            self.link.share_tokens(mx.array([s.token_id for s in sampled]), len(seq_ids))
            return sampled
        mx.eval(logits)  # join the collectives rank 0's logits need (tensor: the last layer's all-reduce)
        return [SampledToken(t) for t in self.link.share_tokens(None, len(seq_ids)).tolist()]


class LeaderRunner(ShardRunner):
    """Rank 0's runner: broadcast each record, run it; a lost rank is reported once through `on_lost`."""

    def __init__(self, model, link: Link, timeout_s: float, keepalive_s: float = KEEPALIVE_S,
                 compiler: Optional[ConstraintCompiler] = None, *, kernels: Optional[ContextManager[Any]] = None,
                 rank_head: Any = None):
        super().__init__(model, link, compiler, kernels=kernels, rank_head=rank_head)
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s
        self.on_lost: Callable[[str], None] = _exit_lost  # the server swaps in one that fails requests first
        self._lost: Optional[str] = None
        self._last_sent = time.monotonic()
        self._watchdog = Watchdog(self._expired)

    def execute(self, step: Step) -> StepOutput:
        with self._guarded("a step"):
            self.link.send(("step", step))
            return super().execute(step)

    def idle(self) -> None:
        """Called by the worker while there is nothing to do: ping the others now and then."""
        super().idle()
        if self._lost is None and time.monotonic() - self._last_sent < self.keepalive_s:
            return
        with self._guarded("a keepalive"):
            self.link.send(("ping", None))

    def close(self) -> None:
        """Tell the other ranks to exit, then free this rank's KV."""
        if self._lost is None:
            try:
                with self._watchdog.guard("the stop record", self.timeout_s):
                    self.link.send(("stop", None))
            except Exception as exc:  # a rank already gone: nothing left to tell
                log.warning("could not tell the other ranks to stop: %s", exc)
        super().close()

    @contextlib.contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        if self._lost is not None:
            raise RankLostError(self._lost)
        try:
            with self._watchdog.guard(what, self.timeout_s):
                yield
        except Exception as exc:
            # Whatever broke mid-record (a peer's socket, a bug here), the ranks may now disagree.
            self._lose(f"a distributed rank was lost during {what}: {exc}")
            raise RankLostError(self._lost) from None
        finally:
            self._last_sent = time.monotonic()
        if self._lost is not None:  # the watchdog gave up on this record while it ran: distrust it
            raise RankLostError(self._lost)

    def _expired(self, what: str, seconds: float) -> None:
        self._lose(f"no answer from the other ranks for {seconds:.1f} s during {what} "
                   f"(--distributed-timeout {self.timeout_s:g})")

    def _lose(self, message: str) -> None:
        if self._lost is None:
            self._lost = message
            self.on_lost(message)


def _exit_lost(message: str) -> None:
    log.error("%s; exiting", message)
    logging.shutdown()
    os._exit(1)


def follow(runner: ShardRunner, link: Link, timeout_s: float, keepalive_s: float = KEEPALIVE_S) -> Optional[str]:
    """Execute rank 0's records until it sends stop (returns None) or is lost (returns why)."""

    def expired(what: str, seconds: float) -> None:  # the main thread is stuck in a collective
        _exit_lost(f"rank {link.rank}: no record from rank 0 for {seconds:.1f} s (--distributed-timeout)")

    watchdog = Watchdog(expired)
    # The wait includes rank 0's idle gap between keepalives (its worker polls every 0.5 s).
    budget = timeout_s + keepalive_s + 0.5
    try:
        while True:
            with watchdog.guard("a record", budget):
                kind, step = link.receive()
                if kind == "step":
                    runner.execute(step)
            if kind == "stop":
                return None
    except Exception as exc:  # rank 0's socket closed (it exited), or this rank failed
        return f"rank {link.rank} stopped following rank 0: {exc}"
    finally:
        runner.close()
