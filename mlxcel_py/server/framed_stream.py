"""Submitting a prepared request, and its SSE stream, whose frames come from a `Framer`: one per
API (OpenAI's `responses.OpenAIFramer`, llama-server's /completion, Anthropic's /v1/messages);
`gather` collects a whole reply for the routes with their own shapes.

The transport is streaming.py's: the client is watched from submission (a client that
leaves aborts its request), a server-side cut ends the stream with the framer's frames,
and a bug after the 200 is reported in-band. Only the frames differ per API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..engine import Finished, TokenDelta
from ..engine import Request as EngineRequest
from ..errors import MlxcelError
from .runtime import runtime
from .body import read_body
from .errors import APIError, from_error, unavailable
from .responses import failure
from .streaming import FINAL_WRITE_S, SSE_HEADERS, Generation, _watched

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("mlxcel_py.server")
P = TypeVar("P")  # a route's prepared request: it has `.job`, the engine request


class Framer(Protocol):
    """The SSE frames of one streamed reply in one API's shape."""

    def opening(self) -> list[str]: ...
    def frames(self, event: Any) -> list[str]: ...  # one engine event's frames (possibly none)
    def cut(self, error: APIError) -> list[str]: ...  # the server ended the request
    def bug(self) -> list[str]: ...  # a bug after the 200 went out
    def closing(self) -> list[str]: ...  # after everything else


class FramedStream(Response):
    """The SSE response of one request, framed by `framer`."""

    def __init__(self, framer: Framer, gen: Generation, label: str):
        super().__init__()  # a Response, so FastAPI passes it through; __call__ writes the stream
        self.framer, self.gen, self.label = framer, gen, label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await _watched(receive, self.gen, lambda: self._body(send))

    async def _body(self, send: Send) -> None:
        async def write(frames: list[str]) -> None:
            for frame in frames:
                await send({"type": "http.response.body", "body": frame.encode("utf-8"), "more_body": True})

        tail: list[str] = []
        with self.gen.scope:
            try:
                await write(self.framer.opening())
                async for event in self.gen.events():
                    await write(self.framer.frames(event))
            except Exception:  # a bug after the 200 went out: tell the client in-band
                log.exception("stream %s failed", self.label)
                tail = self.framer.bug()
        if self.gen.cut_error is not None:
            tail = self.framer.cut(self.gen.cut_error)
        with anyio.move_on_after(FINAL_WRITE_S):
            await write(tail + self.framer.closing())
            await send({"type": "http.response.body", "body": b"", "more_body": False})


@dataclass(frozen=True, slots=True)
class Gathered:
    """A whole reply: its text, the generated token ids, and how it finished."""

    text: str
    token_ids: tuple[int, ...]
    finished: Finished


async def gather(receive: Receive, gen: Generation) -> Optional[Gathered]:
    """Collect a request's reply; None if the client left. Raises the cut or the engine's failure."""
    parts: list[str] = []
    ids: list[int] = []
    done: list[Finished] = []

    async def work() -> None:
        with gen.scope:
            async for event in gen.events():
                if isinstance(event, TokenDelta):
                    parts.append(event.text)
                    ids.append(event.token_id)
                elif isinstance(event, Finished):
                    parts.append(event.text)
                    done.append(event)
                    return

    await _watched(receive, gen, work)
    if gen.cut_error is not None:
        raise gen.cut_error
    if not done:
        return None
    if done[0].finish_reason not in ("stop", "length"):
        raise failure(done[0])
    return Gathered("".join(parts), tuple(ids), done[0])


async def submit(request: Request, rt: "Runtime", job: EngineRequest, arrived: float, param: str
                 ) -> Optional[Generation]:
    """Queue a prepared request; None if its client already left. `param` names the field a
    refusal (a prompt too long, a full queue) points at."""
    if rt.draining:  # the shutdown began while the body was being prepared
        raise unavailable("the server is shutting down", "server_shutting_down")
    if await request.is_disconnected():  # the client left while its prompt was being tokenized
        return None
    try:
        handle = rt.worker.submit(job, loop=asyncio.get_running_loop())
    except MlxcelError as exc:
        error = from_error(exc, param)
        rt.metrics.observe_rejection(error.status)
        raise error from None
    return Generation(handle, rt.worker, rt.metrics, arrived, rt.live)


async def start(request: Request, prepare: Callable[["Runtime", bytes], P], param: str
                ) -> tuple[P, Optional[Generation]]:
    """A generation route's first half: read the body on the loop, `prepare` it (parse,
    validate, template, tokenize) on the Runtime's threads, submit it. The generation is
    None when the client already left."""
    arrived = time.perf_counter()
    rt = runtime(request)
    raw = await read_body(request, rt.max_body_bytes)
    prepared = await rt.off_loop(prepare, rt, raw)
    del raw  # a large body is not kept alive for the whole generation
    return prepared, await submit(request, rt, prepared.job, arrived, param)  # type: ignore[attr-defined]
