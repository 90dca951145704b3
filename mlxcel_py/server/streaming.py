"""One submitted request on the HTTP side: watch its client, stream or collect its events.

From the moment a request is submitted its connection is watched (the ASGI
`http.disconnect` message), so a client that leaves while its prompt is still being
prefilled is aborted at once; the scheduler drops the prefill before its next piece.
At shutdown the server can cut a request (`Generation.cut`): a stream then ends with a
final chunk, an error frame and `[DONE]`, a non-streaming request with a 503.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Awaitable, Callable, MutableSet, Optional

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from ..engine import EngineWorker, Finished, RequestHandle, TokenDelta
from .errors import APIError
from .metrics import ServerMetrics
from .assembler import Assembler, Part
from .responses import Reply, assembled_json, failure

CLIENT_CLOSED = 499  # nginx's "client closed request"; nobody reads it
FINAL_WRITE_S = 2.0  # a client that stopped reading cannot hold a cut stream open longer than this
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


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


async def _watched(receive: Receive, gen: Generation, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` until it ends or the client disconnects; the request is closed either way."""
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            await work()
            group.cancel_scope.cancel()
    finally:
        gen.close()


async def assemble(gen: Generation, assembler: Assembler) -> tuple[list[Part], Finished]:
    """The parts of a whole reply and its `Finished` event."""
    parts: list[Part] = []
    async for event in gen.events():
        parts += assembler.feed(event)
        if isinstance(event, Finished):
            return parts, event
    raise RuntimeError("the event stream ended without Finished")


async def complete(receive: Receive, reply: Reply, gen: Generation) -> Response:
    """The non-streaming response: the whole reply, 503 if the server cut it, 499 if the client left."""
    result: list[tuple[list[Part], Finished]] = []
    assembler = Assembler(reply.shape)

    async def work() -> None:
        with gen.scope:
            result.append(await assemble(gen, assembler))

    await _watched(receive, gen, work)
    if gen.cut_error is not None:
        raise gen.cut_error
    if not result:
        return Response(status_code=CLIENT_CLOSED)
    parts, finished = result[0]
    if finished.finish_reason not in ("stop", "length"):
        raise failure(finished)
    return JSONResponse(assembled_json(reply, parts, finished, assembler.finish_reason(finished.finish_reason)))
