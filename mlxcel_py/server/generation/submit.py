"""Submitting a prepared request, and the request on the HTTP side from then on (`Generation`).

`start` is every generation route's first half: read the body on the loop, prepare it (parse,
validate, template, tokenize) on the Runtime's threads, submit it. From the moment a request
is submitted its connection is watched (the ASGI `http.disconnect` message), so a client that
leaves while its prompt is still being prefilled is aborted at once; the scheduler drops the
prefill before its next piece. At shutdown the server can cut a request (`Generation.cut`):
a stream then ends with its framer's frames, a non-streaming request with a 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, MutableSet, Optional, TypeVar

import anyio
from starlette.requests import Request
from starlette.types import Receive

from ...engine import EngineWorker, Finished, RequestHandle, TokenDelta
from ...engine import Request as EngineRequest
from ...errors import MlxcelError
from ..http.body import read_body
from ..http.errors import APIError, from_error, unavailable
from ..http.metrics import ServerMetrics
from ..runtime import routed, runtime
from .prepared import Prepared

if TYPE_CHECKING:
    from ..runtime import Runtime

CLIENT_CLOSED = 499  # nginx's "client closed request"; nobody reads it
R = TypeVar("R")


class Generation:
    """One submitted request: its events with server-side timing, cut and abort-unless-finished."""

    def __init__(self, handle: RequestHandle, worker: EngineWorker, metrics: ServerMetrics, arrived: float,
                 live: MutableSet["Generation"]):
        self.handle, self.worker, self.metrics, self.arrived = handle, worker, metrics, arrived
        self.finished: Optional[Finished] = None
        self.cut_error: Optional[APIError] = None
        self.scope = anyio.CancelScope()  # cancelled by `cut`; the response code runs inside it
        self._live, self._closed = live, False
        live.add(self)

    async def events(self) -> AsyncIterator[Any]:
        last: Optional[float] = None
        async for event in self.handle:
            if isinstance(event, TokenDelta):
                now = time.perf_counter()
                if last is None:
                    self.metrics.ttft.observe(now - self.arrived)
                else:
                    self.metrics.itl.observe(now - last)
                last = now
            elif isinstance(event, Finished):
                self.finished = event
                self.metrics.observe_finish(event.finish_reason)
            yield event

    def cut(self, error: APIError) -> None:
        """End the request from the server's side (on the event loop); its response says why."""
        if self.finished is None and self.cut_error is None:
            self.cut_error = error
            self.scope.cancel()

    def close(self) -> None:
        """Abort the request unless it already finished (client gone, cut, a bug)."""
        self._live.discard(self)
        if self.finished is None and not self._closed:
            self._closed = True
            self.worker.abort(self.handle.request_id)
            self.metrics.observe_finish("abort")  # nobody reads its Finished event any more


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    # The body has been read: the next message is http.disconnect, whenever the client leaves.
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def watched(receive: Receive, gen: Generation, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` until it ends or the client disconnects; the request is closed either way."""
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            await work()
            group.cancel_scope.cancel()
    finally:
        gen.close()


def failure(f: Finished) -> APIError:
    """The error of a request that ended without a normal finish reason."""
    if f.finish_reason == "abort":
        return APIError(503, f.error or "the request was aborted", code="server_shutting_down")
    return APIError(500, f.error or "the engine failed on this request", code="engine_error")


def no_generation(rt: "Runtime", what: str) -> APIError:
    """llama-server's 501 for a route the served model cannot answer (a reranker, an encoder)."""
    return APIError(501, f"This server does not support {what}: {rt.loaded.no_text(rt.model_id)}",
                    code="not_supported_error")


async def submit(request: Request, rt: "Runtime", job: EngineRequest, arrived: float, param: str
                 ) -> Optional[Generation]:
    """Queue a prepared request; None if its client already left. `param` names the field a
    refusal (a prompt too long, a full queue) points at."""
    if rt.draining:  # the shutdown began while the body was being prepared
        raise unavailable("the server is shutting down", "server_shutting_down")
    if await request.is_disconnected():  # the client left while its prompt was being tokenized
        return None
    if job.pooling is None and not rt.loaded.generates:  # a reranker's outputs are scores; an encoder's vectors
        raise no_generation(rt, "completions")
    if job.lora is None and rt.lora_override is not None:  # POST /lora-adapters' scales
        job = dataclasses.replace(job, lora=rt.lora_override)
    try:
        handle = rt.worker.submit(job, loop=asyncio.get_running_loop())
    except MlxcelError as exc:
        error = from_error(exc, param)  # translated here: the rejection is counted by its status
        rt.metrics.observe_rejection(error.status)
        raise error from None
    return Generation(handle, rt.worker, rt.metrics, arrived, rt.live)


async def start(request: Request, prepare: Callable[["Runtime", bytes], Prepared[R]], param: str
                ) -> tuple[Prepared[R], Optional[Generation]]:
    """A generation route's first half: read the body on the loop, `prepare` it (parse,
    validate, template, tokenize) on the Runtime's threads, submit it. The generation is
    None when the client already left."""
    arrived = time.perf_counter()
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, raw) as rt:  # the model the body names (several: loaded first)
        prepared = await rt.off_loop(prepare, rt, raw)
        del raw  # a large body is not kept alive for the whole generation
        return prepared, await submit(request, rt, prepared.job, arrived, param)
