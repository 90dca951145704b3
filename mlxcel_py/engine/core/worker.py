"""The one thread that owns MLX, and the bridge the rest of the program talks through.

Requests and aborts go in through a queue; events come back on a per-request handle that
can be read from a plain thread (`get`, iteration) or from asyncio (`async for`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterator, Optional, Protocol

from ...errors import EngineError, EngineStoppedError, MlxcelError, QueueFullError, RequestError
from .events import Event, Finished, empty_finish
from .request import Request
from .scheduler import check_fits
from .slots import SlotAction, SlotResult
from .stats import EngineStats, Limits

if TYPE_CHECKING:
    from ..runner.constraints import ConstraintCompiler

log = logging.getLogger("mlxcel_py.engine")


class StepEngine(Protocol):
    """What the worker drives: `Engine` in production, fakes in tests."""

    def add_request(self, request: Request) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def has_work(self) -> bool: ...
    def step(self, on_admitted: Optional[Callable[[], None]] = None) -> list[Event]: ...
    def slot_action(self, action: SlotAction) -> SlotResult: ...
    def stats(self) -> EngineStats: ...
    def prepare(self) -> None: ...
    def idle(self) -> None: ...
    def close(self) -> None: ...

    @property
    def compiler(self) -> Optional["ConstraintCompiler"]: ...

    @property
    def limits(self) -> Limits: ...


class RequestHandle:
    """Events of one request, ending with a `Finished` event."""

    def __init__(self, request_id: str, worker: "EngineWorker", loop: Optional[asyncio.AbstractEventLoop]):
        self.request_id = request_id
        self._worker = worker
        self._loop = loop
        self._sync: "queue.SimpleQueue[Event]" = queue.SimpleQueue()
        self._async: Optional[asyncio.Queue[Event]] = asyncio.Queue() if loop is not None else None

    def _put(self, event: Event) -> None:
        if self._loop is None:
            self._sync.put(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, event)
        except RuntimeError:  # the client's loop is gone; nobody is listening
            pass

    def _put_now(self, event: Event) -> None:
        """On the handle's loop (from `_deliver`): queue the event."""
        self._async.put_nowait(event)  # type: ignore[union-attr]

    def get(self, timeout: Optional[float] = None) -> Event:
        """Next event (blocking); raises `queue.Empty` after `timeout` seconds."""
        return self._sync.get(timeout=timeout)

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.get()
            yield event
            if isinstance(event, Finished):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        if self._async is None:
            raise RuntimeError("submit(..., loop=...) is needed for async iteration")
        while True:
            event = await self._async.get()
            yield event
            if isinstance(event, Finished):
                return

    def abort(self) -> None:
        self._worker.abort(self.request_id)


def _deliver(batch: list[tuple[RequestHandle, Event]]) -> None:
    """On one event loop: a tick's events for the handles that loop reads, in engine order."""
    for handle, event in batch:
        handle._put_now(event)


class EngineWorker:
    """Runs `engine.step()` on its own thread; `submit`/`abort` are safe from any thread."""

    def __init__(self, engine: StepEngine, name: str = "mlxcel-engine"):
        self._engine = engine
        self._inbox: "queue.SimpleQueue[tuple[str, object]]" = queue.SimpleQueue()
        self._handles: dict[str, RequestHandle] = {}  # outstanding: submitted and not yet finished
        self._lock = threading.Lock()
        self._limits = engine.limits
        self._stats = engine.stats()
        self._stopping = threading.Event()
        self._prepared = threading.Event()  # set once the engine's prepare() (calibration) returned
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    # -- public API (any thread) -------------------------------------------------------
    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    def submit(self, request: Request, loop: Optional[asyncio.AbstractEventLoop] = None) -> RequestHandle:
        """Queue a request; raises `RequestError` (can never run) or `EngineError` (not now).

        Admission is counted here, where requests enter: every request holds its place
        from submit to its `Finished` event, so a burst fills the free slots plus
        `max_queue`, and the engine thread's queue is never read from this thread."""
        if self._stopping.is_set():
            raise EngineStoppedError("the server is shutting down")
        limits = self._limits
        check_fits(request, limits.slot_context)
        handle = RequestHandle(request.request_id, self, loop)
        with self._lock:
            if request.request_id in self._handles:
                raise RequestError(f"duplicate request id {request.request_id!r}")
            if len(self._handles) >= limits.max_outstanding:
                waiting = len(self._handles) - limits.num_slots
                raise QueueFullError(f"the server is busy ({waiting} requests waiting); retry later")
            self._handles[request.request_id] = handle
            self._inbox.put(("submit", request))
        return handle

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def slot_action(self, action: SlotAction) -> "concurrent.futures.Future[SlotResult]":
        """Queue a slot save/restore/erase for the engine thread (the one MLX owner); its future result."""
        if self._stopping.is_set():
            raise EngineStoppedError("the server is shutting down")
        future: "concurrent.futures.Future[SlotResult]" = concurrent.futures.Future()
        self._inbox.put(("slot", (action, future)))
        return future

    @property
    def compiler(self):
        """The engine's grammar compiler (None for engines without one); safe from any thread."""
        return self._engine.compiler

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest tick."""
        return self._stats

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything in flight and join the thread."""
        self._stopping.set()
        self._inbox.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._engine.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def prepared(self) -> bool:
        """False while the engine thread runs `prepare()` (the ITL-budget calibration, ~20 s):
        /health answers 503 "loading" then, as while the model loads."""
        return self._prepared.is_set()

    # -- engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            try:
                self._engine.prepare()  # e.g. the ITL-budget calibration; submitted requests wait in the inbox
            finally:
                self._prepared.set()
            while True:
                if not self._drain(block=not self._engine.has_work()):
                    break
                if self._engine.has_work():
                    self._dispatch(self._engine.step(on_admitted=self._publish_stats))
                else:
                    self._engine.idle()  # a distributed engine's keepalive to its other ranks
                self._publish_stats()
        except EngineError as exc:  # the engine cannot go on (a lost distributed rank): no abort pass
            log.error("engine stopped: %s", exc)
            self._fail_all(str(exc))
            return
        except Exception:  # a bug in the engine: fail every request instead of hanging them
            log.exception("engine thread crashed")
            self._fail_all("internal engine error (see server log)")
        finally:
            self._stopping.set()
        self._abort_all()

    def _publish_stats(self) -> None:
        self._stats = self._engine.stats()

    def _drain(self, block: bool) -> bool:
        """Apply queued messages; returns False on stop."""
        try:
            kind, payload = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if kind == "stop":
                return False
            if kind == "submit":
                self._engine.add_request(payload)  # type: ignore[arg-type]
            elif kind == "slot":
                self._slot_action(*payload)  # type: ignore[misc]
            else:
                self._engine.abort(payload)  # type: ignore[arg-type]
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _slot_action(self, action: SlotAction, future: "concurrent.futures.Future[SlotResult]") -> None:
        try:
            future.set_result(self._engine.slot_action(action))
        except MlxcelError as exc:  # refused (busy slot, bad file): the caller's answer, not a crash
            future.set_exception(exc)
        except BaseException as exc:  # a bug: the caller hears of it, and the engine thread's handler too
            future.set_exception(exc)
            raise

    def _dispatch(self, events: list[Event]) -> None:
        """Hand a tick's events to their handles: one wakeup per event loop, not one per event
        (4 streams are 4 tokens a tick, and each wakeup costs the loop and this thread CPU)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, Event]]] = {}
        with self._lock:
            routed = [(self._handles.get(e.request_id), e) for e in events]
            for event in events:
                if isinstance(event, Finished):
                    self._handles.pop(event.request_id, None)
        for handle, event in routed:
            if handle is None:
                continue
            if handle._loop is None:
                handle._put(event)
            else:
                by_loop.setdefault(handle._loop, []).append((handle, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # that client's loop is gone; nobody is listening
                pass

    def _abort_all(self) -> None:
        while True:  # requests still queued in the inbox were never seen by the engine
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self._engine.add_request(payload)  # type: ignore[arg-type]
            elif kind == "slot":
                payload[1].set_exception(EngineStoppedError("the server is shutting down"))  # type: ignore[index]
        with self._lock:
            ids = list(self._handles)
        for request_id in ids:
            self._engine.abort(request_id)
        try:
            self._dispatch(self._engine.step() if self._engine.has_work() else [])
        except Exception:
            log.exception("engine failed while aborting")
        self._fail_all("the server is shutting down", reason="abort")

    def fail_all(self, message: str) -> None:
        """End every outstanding request with an error, from any thread (the engine may be stuck)."""
        self._fail_all(message)

    def _fail_all(self, message: str, reason: str = "error") -> None:
        with self._lock:
            handles, self._handles = dict(self._handles), {}
        for request_id, handle in handles.items():
            handle._put(empty_finish(request_id, reason, message))
