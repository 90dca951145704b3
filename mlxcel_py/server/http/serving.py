"""`serve_forever`: bind, answer /health with 503 while the model loads, serve, drain on a signal.

Order matters: the BLAS preload runs before anything imports mlx.core, and the socket is
bound before loading so a busy port fails fast and /health works during the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
import threading
from typing import Any, Callable, Iterator, Optional

import uvicorn

from ...config import AppConfig, startup_summary
from ...errors import ServeError
from ..app import create_app
from ..registry.registry import in_thread
from ..runtime import serving as serving_state
from .errors import APIError

log = logging.getLogger("mlxcel_py.server")
# After the grace period the server cuts open requests itself; uvicorn's own deadline (which
# cancels tasks outright) comes this much later, for clients too slow to take their last frames.
CUT_MARGIN_S = 5.0
# A thread that wants the GIL waits up to this long for a busy holder (Python's default: 5 ms).
# The engine thread gives the GIL up at every MLX or kernel call in a tick, so while another
# thread validates or templates a huge body each of those waits would add up to a stalled
# stream (a 120k-turn chat: 0.36-0.40 s between two frames at 5 ms, 0.07-0.11 s at 1 ms).
GIL_SWITCH_INTERVAL_S = 0.001


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that drains on SIGINT/SIGTERM: no new requests, the grace period for
    the open ones, then every remaining one is cut (a stream gets its final frames); exit 0."""

    def __init__(self, config: uvicorn.Config, runtime: Any, grace_s: float):
        super().__init__(config)
        self.runtime, self.grace_s = runtime, grace_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown (exit 130/143); we exit cleanly.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        forced = self.should_exit and sig == signal.SIGINT  # a second Ctrl-C: quit at once
        super().handle_exit(sig, frame)
        if forced:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing is open
                # The streams still get their final frames in the moment before the loop stops.
                asyncio.get_running_loop().call_soon_threadsafe(self._cut, "the server was interrupted")

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self.runtime.draining = True  # requests on kept-alive connections get 503 from here on
        if self.runtime.live:
            log.info("draining: %d requests in flight, %g s to finish", len(self.runtime.live), self.grace_s)
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._cut, f"grace period {self.grace_s:g} s")
        try:
            await super().shutdown(sockets=sockets)
        finally:
            timer.cancel()

    def _cut(self, why: str) -> None:
        message = f"the server shut down before this request finished ({why})"
        count = self.runtime.cut_all(APIError(503, message, code="server_shutting_down"))
        if count:
            log.warning("%s: cut %d requests", why, count)


def bind_socket(host: str, port: int, v6only: bool = False) -> socket.socket:
    """A bound TCP socket (port 0 picks a free one); ServeError when the address is unusable."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as exc:
        raise ServeError(f"cannot resolve --host {host!r}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6only and family == socket.AF_INET6:  # with several addresses, "::" must not also take IPv4
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ServeError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def bind_sockets(hosts: tuple[str, ...], port: int) -> list[socket.socket]:
    """One socket per address, all on one port (port 0: the one the first address got)."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            socks.append(bind_socket(host, socks[0].getsockname()[1] if socks else port, len(hosts) > 1))
    except ServeError:
        for sock in socks:
            sock.close()
        raise
    return socks


def make_server(app: Any, config: AppConfig) -> GracefulServer:
    """The uvicorn server for `app`, with the configured log level and shutdown grace."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    server_cfg = config.server
    grace = server_cfg.shutdown_grace_s  # type: ignore[union-attr]
    uv_config = uvicorn.Config(
        app, log_level=server_cfg.log_level, lifespan="off",  # type: ignore[union-attr]
        timeout_graceful_shutdown=int(grace + CUT_MARGIN_S + 1),
    )
    return GracefulServer(uv_config, serving_state(app), grace)


def _with_draft(loaded, spec):
    """(target, draft): the --draft-model loaded after the target, in the loading thread."""
    from ...models import load_draft

    return loaded, load_draft(spec.draft, loaded, on_progress=log.info, threads=spec.threads,
                              cpu_weights=spec.cpu_weights)


async def _serve(server: GracefulServer, socks: list[socket.socket], config: AppConfig, urls: str,
                 cluster=None) -> None:
    """Serve `config`; with a `cluster` (rank 0 of several) the model is sharded and the runner leads."""
    from ...engine import engine_session
    from ...models import load_model

    serving = asyncio.ensure_future(server.serve(sockets=socks))
    if config.router is not None:
        await _serve_many(server, serving, urls)
        return
    spec = config.model
    if cluster is None:
        load = lambda: load_model(spec.path, on_progress=log.info, threads=spec.threads,  # noqa: E731
                                  cpu_weights=spec.cpu_weights, mmproj=spec.mmproj, lora=spec.lora,
                                  lora_fuse=spec.lora_fuse)
    else:
        load = lambda: cluster.load(config)  # noqa: E731
    if spec.draft is not None:  # the resolver refused a draft beside --distributed
        load_target = load
        load = lambda: _with_draft(load_target(), spec)  # noqa: E731
    loading = in_thread(load)
    await asyncio.wait({serving, loading}, return_when=asyncio.FIRST_COMPLETED)
    if not loading.done():  # stopped by a signal while loading
        loading.cancel()
        await serving
        return
    ready = False
    try:
        loaded, draft = loading.result() if spec.draft is not None else (loading.result(), None)
        runner = None if cluster is None else cluster.leader_runner(loaded)
        with engine_session(config.engine, loaded, runner, draft) as worker:
            server.runtime.attach(worker, loaded)
            if cluster is not None:
                cluster.watch(runner, server.runtime, worker)
            # The loader and build_engine have logged the weights path and the context per slot.
            log.info("ready: serving %s on %s%s", server.runtime.model_id, urls,
                     "" if worker.prepared else " once the ITL-budget calibration ends (/health: 503 until then)")
            ready = True
            await serving
    finally:
        if not ready:  # a load or engine failure: close the socket, then report it
            server.should_exit = True
            await serving


async def _serve_many(server: GracefulServer, serving: asyncio.Future, urls: str) -> None:
    """Several models: each loads on its first request (--models-preload ones now); all stop at the end."""
    registry = server.runtime
    log.info("ready: serving %d models (%s) on %s; each loads on its first request", len(registry.hosted),
             ", ".join(registry.hosted), urls)
    preloading = asyncio.ensure_future(registry.preload())
    try:
        await serving
    finally:
        preloading.cancel()
        await registry.close()


def serve_forever(config: AppConfig) -> None:
    """Run `mlxcel-py serve` until SIGINT/SIGTERM; raises ServeError or ModelLoadError to the CLI."""
    from ...logs import setup_logging
    from ...models.cpu.blas import preload_blas

    if config.server is None:
        raise ServeError("serve_forever needs a serve config")
    setup_logging(config.server.log_level)
    preload_blas(config.blas)
    cluster = None
    if config.distributed is not None:  # under mlx.launch: only rank 0 binds the port
        from .cluster import join

        cluster = join(config.distributed)
        if cluster is not None and cluster.rank != 0:
            cluster.follow(config)
            return
    socks = bind_sockets(config.server.hosts, config.server.port)
    bound = dataclasses.replace(config.server, port=socks[0].getsockname()[1])
    for line in startup_summary(dataclasses.replace(config, server=bound)):
        log.info("%s", line)
    app = create_app(None, None, config)
    if config.router is None:
        log.info("loading the model; /health answers 503 until it is ready")
    event_loop_runner()(_serve(make_server(app, config), socks, config, ", ".join(bound.urls()), cluster))
    log.info("stopped")


def event_loop_runner() -> Callable[[Any], Any]:
    """`uvloop.run` when uvloop is installed (a dependency on Linux and macOS), else `asyncio.run`.

    Every token of every stream is a wakeup, a frame and a socket write on this loop, while the
    decode step's threads want the same cores (docs/CPU_DECODE.md, "The server's share")."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run
