"""`ModelRegistry`: several models behind one server, each with its own engine while resident.

A request names its model; `acquire` returns that model's Runtime, loading it first if it is
not resident (its requests wait on the load; requests to resident models never do). Loads run
one at a time on a loader thread, so the memory each takes is measured alone. Before a load,
the least recently used idle models are unloaded until it fits --models-max and the
--models-memory budget; a model with requests in flight is never unloaded under them.
Everything here runs on the event loop except the load and the teardown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from ...errors import MlxcelError
from ...models.chat_template import one_line
from ..http.errors import APIError, unavailable
from ..runtime import Runtime
from .hosted import LOADED, LOADING, UNLOADED, Hosted

if TYPE_CHECKING:
    from ...config import AppConfig
    from ...engine import EngineWorker
    from ...models import LoadedModel

T = TypeVar("T")
log = logging.getLogger("mlxcel_py.server")
GIB = 2**30


def in_thread(fn: Callable[[], T]) -> "asyncio.Future[T]":
    """Run `fn` on a daemon thread (a signal during a long load must not wait for it)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            outcome: tuple = (future.set_result, fn())
        except BaseException as exc:  # handed to the event loop, which re-raises it
            outcome = (future.set_exception, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: the server stopped during the load
            pass

    threading.Thread(target=target, name="mlxcel-load", daemon=True).start()
    return future


class ModelRegistry:
    """The configured models, the resident ones' engines, and the limits between them."""

    def __init__(self, config: "AppConfig", primary: Runtime):
        router = config.router
        if router is None:
            raise ValueError("ModelRegistry needs a config with several models (config.router)")
        self.config, self.router = config, router
        self.hosted: dict[str, Hosted] = {}
        self._of: dict[Runtime, Hosted] = {}
        for i, entry in enumerate(router.entries):
            rt = primary if i == 0 else Runtime(config)
            rt.config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=entry.spec),
                                            server=dataclasses.replace(config.server, model_aliases=(entry.name,)))
            rt.routed, rt.responses = True, primary.responses  # one store: previous_response_id across models
            self.hosted[entry.name] = self._of[rt] = hosted = Hosted(entry, rt)
            rt.live.on_empty = lambda h=hosted: self._idle(h)
        self.failure: Optional[str] = None  # the Gate and /health read these, as on a Runtime
        self._draining = False
        self._load_lock: Optional[asyncio.Lock] = None
        self._changed: Optional[asyncio.Event] = None  # set when a model goes idle or unloads
        self.estimate: Callable[[Optional[str]], int] = _estimate
        self.build: Callable[[Hosted], tuple] = self._build

    # -- what the server and the Gate read, as they read a Runtime ------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        for hosted in self.hosted.values():
            hosted.runtime.draining = value

    @property
    def ready(self) -> bool:
        return True  # models load on demand: the server itself is up

    @property
    def live(self) -> set:
        return set().union(*(h.runtime.live for h in self.hosted.values()))

    @property
    def max_body_bytes(self) -> int:
        return next(iter(self.hosted.values())).runtime.max_body_bytes

    def gate_error(self) -> Optional[APIError]:
        return unavailable("the server is shutting down", "server_shutting_down") if self._draining else None

    def cut_all(self, error: APIError) -> int:
        return sum(h.runtime.cut_all(error) for h in self.hosted.values())

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await next(iter(self.hosted.values())).runtime.off_loop(fn, *args)

    # -- routing -----------------------------------------------------------------------------
    def find(self, name: Optional[str]) -> Hosted:
        """The model a request names (absent: the first configured); 404 listing the models."""
        if name is None or name == "":
            return next(iter(self.hosted.values()))
        hosted = self.hosted.get(name) or self.hosted.get(name.removesuffix(":latest"))
        if hosted is None:
            raise APIError(404, f"model {name!r} not found; the models are: {', '.join(self.hosted)}",
                           code="model_not_found", param="model")
        return hosted

    async def acquire(self, name: Optional[str]) -> Runtime:
        """The named model's Runtime once resident (loading it first); pair with `release`."""
        hosted = self.find(name)
        hosted.users += 1
        hosted.touch()
        try:
            while hosted.state != LOADED:
                if self._draining:
                    raise unavailable("the server is shutting down", "server_shutting_down")
                if hosted.loading is None:
                    hosted.loading = asyncio.ensure_future(self._load(hosted))
                    hosted.loading.add_done_callback(_retrieved)  # its waiters may all have left
                await asyncio.shield(hosted.loading)
        except BaseException:
            self.release(hosted.runtime)
            raise
        return hosted.runtime

    def release(self, rt: Runtime) -> None:
        hosted = self._of[rt]
        hosted.users -= 1
        hosted.touch()
        if hosted.idle:
            self._idle(hosted)

    def _idle(self, hosted: Hosted) -> None:
        """A model's last request ended: it may make room now, and its keep-alive starts."""
        if self._changed is not None:
            self._changed.set()
        if not hosted.idle or hosted.state != LOADED:
            return
        keep = hosted.runtime.keep_alive if hosted.runtime.keep_alive is not None else self.router.keep_alive_s
        hosted.cancel_timer()
        if keep >= 0:
            loop = asyncio.get_running_loop()
            hosted.timer = loop.call_later(keep, lambda: asyncio.ensure_future(self._expire(hosted)))
            hosted.expires_at = time.time() + keep

    async def _expire(self, hosted: Hosted) -> None:
        hosted.timer = hosted.expires_at = None
        if hosted.idle and hosted.state == LOADED:
            log.info("model %s: idle past its keep-alive; unloading", hosted.name)
            await self.unload(hosted.name)

    # -- loading and unloading ---------------------------------------------------------------
    async def load(self, name: str) -> Hosted:
        """Make the named model resident (/models/load, --models-preload)."""
        rt = await self.acquire(name)
        self.release(rt)
        return self.find(name)

    async def _load(self, hosted: Hosted) -> None:
        if self._load_lock is None:
            self._load_lock, self._changed = asyncio.Lock(), asyncio.Event()
        hosted.state, hosted.error = LOADING, None
        try:
            async with self._load_lock:  # one at a time: each load's memory is measured alone
                if hosted.estimate == 0:
                    hosted.estimate = await in_thread(lambda: self.estimate(hosted.entry.spec))
                await self._make_room(hosted)
                log.info("model %s: loading %s", hosted.name, hosted.entry.spec or "the embedded default")
                started = time.perf_counter()
                loaded, worker, measured = await in_thread(lambda: self.build(hosted))
                self._attach(hosted, worker, loaded, measured)
                log.info("model %s: loaded in %.1f s (%.0f MiB measured, %.0f MiB estimated)", hosted.name,
                         time.perf_counter() - started, measured / 2**20, hosted.estimate / 2**20)
        except BaseException as exc:
            hosted.state = UNLOADED
            if isinstance(exc, APIError) or not isinstance(exc, Exception):
                raise
            hosted.error = one_line(exc) if isinstance(exc, MlxcelError) else f"{type(exc).__name__}: {one_line(exc)}"
            log.error("model %s failed to load: %s", hosted.name, hosted.error)
            raise APIError(500, f"model {hosted.name!r} failed to load: {hosted.error}",
                           code="model_load_failed") from None
        finally:
            hosted.loading = None
            self._changed.set()

    def _attach(self, hosted: Hosted, worker: "EngineWorker", loaded: "LoadedModel", measured: int) -> None:
        try:
            hosted.runtime.attach(worker, loaded)
        except BaseException:
            worker.stop()
            raise
        hosted.measured, hosted.state = measured, LOADED

    def _build(self, hosted: Hosted) -> tuple:
        """On the loader thread: load the model and start its engine; (loaded, worker, bytes grown)."""
        from ...engine import EngineWorker, build_engine
        from ...models import load_model
        from ...models.footprint import resident_bytes

        spec = self.config.model
        before = resident_bytes()
        loaded = load_model(hosted.entry.spec, on_progress=log.info, threads=spec.threads, cpu_weights=spec.cpu_weights)
        worker = EngineWorker(build_engine(self.config.engine, loaded)).start()
        return loaded, worker, max(resident_bytes() - before, 0)

    async def _make_room(self, hosted: Hosted) -> None:
        """Unload least recently used idle models until `hosted` fits; wait while busy ones hold the room."""
        budget, most = self.router.memory_bytes, self.router.max_resident
        if budget is not None and hosted.estimate > budget:
            raise APIError(503, f"model {hosted.name!r} needs about {hosted.estimate / GIB:.2f} GiB, more than "
                                f"--models-memory {budget / GIB:g} GiB", code="model_over_budget")
        while True:
            resident = [h for h in self.hosted.values() if h.state == LOADED]
            used = sum(h.memory for h in resident)
            if len(resident) < most and (budget is None or used + hosted.estimate <= budget):
                return
            idle = sorted((h for h in resident if h.idle), key=lambda h: h.last_used)
            if idle:
                why = f"--models-max {most}" if len(resident) >= most else f"--models-memory {budget / GIB:g} GiB"
                log.info("model %s: unloading %s to make room (%s)", hosted.name, idle[0].name, why)
                await self.unload(idle[0].name)
                continue
            self._changed.clear()
            await self._changed.wait()

    async def unload(self, name: str) -> bool:
        """Unload a resident, idle model; False when it is not resident. 409 while in use."""
        hosted = self.find(name)
        if hosted.state != LOADED:
            return False
        if not hosted.idle:
            raise APIError(409, f"model {name!r} has requests in flight; it unloads once they end",
                           code="model_in_use")
        hosted.cancel_timer()
        box, hosted.state = [hosted.runtime.detach()], UNLOADED
        hosted.measured = 0
        await in_thread(lambda: _teardown(box))
        if self._changed is not None:
            self._changed.set()
        log.info("model %s: unloaded", name)
        return True

    async def preload(self) -> None:
        """--models-preload, in order; a failure is logged and leaves the model to load on demand."""
        for name in self.router.preload:
            try:
                await self.load(name)
            except APIError as exc:
                log.error("preload of %s failed: %s", name, exc.message)

    async def close(self) -> None:
        """Stop every resident engine (the server is stopping)."""
        for hosted in self.hosted.values():
            if hosted.state == LOADED:
                hosted.cancel_timer()
                hosted.state = UNLOADED
                worker = hosted.runtime.detach()
                if worker is not None:
                    await in_thread(worker.stop)


def _teardown(box: list) -> None:
    """Stop the engine and drop the last reference to it (in `box`) before collecting."""
    from ...models.footprint import release_memory

    worker = box.pop()
    if worker is not None:
        worker.stop()
    del worker
    release_memory()


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _estimate(spec: Optional[str]) -> int:
    from ...models.footprint import estimate_bytes

    return estimate_bytes(spec)
