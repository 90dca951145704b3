"""`mlxcel-py serve` over the ranks of an `mlx.launch` (docs/DISTRIBUTED.md).

Every rank joins the group, loads the model and keeps its shard; a handshake tells each
rank what the others hold (or why they failed), so no rank waits for one that cannot
start. Then rank 0 serves HTTP and leads the engine, and every other rank follows its
records. A lost rank ends rank 0 with an error within a bounded time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

from ...engine import follow_leader, join_group, leader_runner
from ...errors import MlxcelError, ModelLoadError, ServeError

if TYPE_CHECKING:
    from ...config import AppConfig, DistributedConfig
    from ...engine import EngineWorker
    from ...models import LoadedModel
    from ..runtime import Runtime

log = logging.getLogger("mlxcel_py.distributed")

STARTUP_TIMEOUT_S = 600.0  # joining and the load handshake: how far apart the ranks' loads may finish
LINGER_S = 2.0  # after a lost rank: /health reports it and the errors reach clients, then the exit


def _exit_now(message: str) -> None:
    log.error("%s", message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(1)


class Cluster:
    """This process's place in the group, and the steps every rank takes to serve one model."""

    def __init__(self, config: "DistributedConfig", link: Any, startup: Any):
        self.config = config
        self.link = link
        self.rank, self.size = link.rank, link.size
        self._startup = startup  # the Watchdog that bounded joining bounds the handshake too

    def load(self, config: "AppConfig") -> "LoadedModel":
        """Load and shard on this rank, then learn what every rank holds; ModelLoadError if any failed."""
        from ...models import load_model
        from ...models.shard import choose_mode, fingerprint, shard_model

        loaded, info = None, {}
        try:
            loaded = load_model(config.model.path, on_progress=log.info, threads=config.model.threads,
                                cpu_weights=config.model.cpu_weights)
            mode = choose_mode(loaded.model, self.config.mode, self.size)
            shard = shard_model(loaded.model, self.link.group, mode)
            info = {"ok": True, "mode": mode, "holds": shard.holds, "bytes": shard.param_bytes,
                    "model": list(fingerprint(loaded.model))}
        except Exception as exc:  # told to every rank, so none waits for this one
            if not isinstance(exc, MlxcelError):
                log.exception("rank %d failed to load", self.rank)
            info = {"ok": False, "error": str(exc)[:1500]}
        try:
            with self._startup.guard("the startup handshake", STARTUP_TIMEOUT_S):
                everyone = self.link.handshake(info)
        except RuntimeError as exc:
            raise ServeError(f"lost a rank while starting: {exc}") from None
        _check_ranks(everyone)
        for rank, peer in enumerate(everyone):
            if self.rank == 0 or rank == self.rank:
                log.info("%s (%.1f MiB of weights)", peer["holds"], peer["bytes"] / 2**20)
        note = f"{everyone[0]['mode']} parallel over {self.size} ranks"
        log.info("rank %d: %s", self.rank, note)
        note = ", " + note
        # The CPU decode step holds whole weights and knows no collectives: a shard never uses it.
        return dataclasses.replace(loaded, description=loaded.description + note, cpu_decode=None)

    def leader_runner(self, loaded: "LoadedModel"):
        return leader_runner(loaded, self.link, self.config.timeout_s)

    def watch(self, runner: Any, runtime: "Runtime", worker: "EngineWorker") -> None:
        """On a lost rank: fail in-flight requests, report /health 503, exit 1 after LINGER_S."""

        def lost(message: str) -> None:
            log.error("%s; failing in-flight requests, exiting in %.0f s", message, LINGER_S)
            runtime.fail(message)
            worker.fail_all(message)
            threading.Timer(LINGER_S, _exit_now, (message,)).start()

        runner.on_lost = lost

    def follow(self, config: "AppConfig") -> None:
        """A rank other than 0: load, then execute rank 0's records until it stops or is lost."""
        # Ctrl-C reaches every rank of a terminal; rank 0 drains its requests, then stops this one.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        loaded = self.load(config)
        log.info("rank %d: following rank 0", self.rank)
        why = follow_leader(loaded, self.link, self.config.timeout_s)
        if why is not None:
            raise ServeError(why)
        log.info("rank %d: stopped by rank 0", self.rank)


def _check_ranks(everyone: list[dict]) -> None:
    failed = [f"rank {r}: {peer['error']}" for r, peer in enumerate(everyone) if not peer["ok"]]
    if failed:
        raise ModelLoadError("cannot serve on every rank: " + "; ".join(failed))
    models = {tuple(peer["model"]) for peer in everyone}
    if len(models) > 1:
        shapes = ", ".join(f"rank {r} {tuple(p['model'])}" for r, p in enumerate(everyone))
        raise ModelLoadError(f"the ranks loaded different models (hidden, layers, heads, kv heads, mlp, vocab): {shapes}")


def join(config: "DistributedConfig") -> Optional[Cluster]:
    """Join the launcher's group; None when the world has one rank (serve exactly as one process)."""
    def stalled(what: str, seconds: float) -> None:
        _exit_now(f"{what} took over {seconds:.0f} s: did every rank start?")

    try:
        joined = join_group(config.backend, STARTUP_TIMEOUT_S, stalled)
    except RuntimeError as exc:
        raise ServeError(f"cannot join the distributed group (backend {config.backend}): {exc}") from None
    if joined is None:
        log.info("distributed: world size 1, serving in one process")
        return None
    link = joined.link
    log.info("distributed: rank %d of %d, backend %s, --distributed %s, timeout %g s",
             link.rank, link.size, config.backend, config.mode, config.timeout_s)
    return Cluster(config, link, joined.startup)

