"""Streams that wait for their model to load: the 200 and a keep-alive frame every few seconds
go out at once, so a client (or a proxy) does not time out on a silent connection during a
load of tens of seconds; once the model is resident the route's own stream follows.

SSE streams get comment frames (`: loading model ...`), which every SSE client skips; Ollama's
NDJSON streams get an empty chunk of the reply (`"done": false`). An error after the 200 (a
failed load, a refused field) is one in-band frame with the route's own error body.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any, Awaitable, Callable, Optional

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ..generation.stream import NDJSON_HEADERS, SSE_HEADERS
from ..http.body import json_object, read_body
from ...errors import MlxcelError
from ..http.errors import APIError, from_error
from .hosted import LOADED

KEEP_ALIVE_S = 5.0  # between frames while a model loads; proxies' idle timeouts are 30-60 s
Endpoint = Callable[[Request], Awaitable[Response]]


def _peek(raw: bytes, ollama: bool) -> tuple[Optional[str], bool]:
    """(the model named, whether the reply streams): Ollama's stream unless `stream: false`, with a prompt."""
    body = json_object(raw)
    name = body.get("model") if isinstance(body.get("model"), str) else None
    if ollama:
        return name, body.get("stream") is not False and bool(body.get("messages") or body.get("prompt"))
    return name, body.get("stream") is True


def while_loading(endpoint: Endpoint) -> Endpoint:
    """`endpoint`, answering a stream whose model is not resident with a `LoadingStream`."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request) -> Response:
        registry = request.app.state.registry
        if registry is None:
            return await endpoint(request)
        ollama = request.url.path.startswith("/api/")
        raw = await read_body(request, registry.max_body_bytes, curl_without_origin=ollama)
        request._body = raw  # the route reads the body again (Starlette's stream() yields it)
        name, stream = await registry.off_loop(_peek, raw, ollama)
        hosted = registry.find(name)  # an unknown name is its 404 now, before any 200
        if not stream or hosted.state == LOADED:
            return await endpoint(request)
        return LoadingStream(endpoint, request, registry, hosted.name, ollama)

    return wrapped


class LoadingStream(Response):
    """The 200 and keep-alive frames while `name` loads, then `endpoint`'s own response."""

    def __init__(self, endpoint: Endpoint, request: Request, registry: Any, name: str, ollama: bool):
        super().__init__()
        self.endpoint, self.request, self.registry, self.name, self.ollama = endpoint, request, registry, name, ollama

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": NDJSON_HEADERS if self.ollama else SSE_HEADERS})
        rt = await self._wait(receive, send)
        if rt is None:
            return
        try:
            await self._inner(scope, receive, send)
        finally:
            self.registry.release(rt)

    async def _wait(self, receive: Receive, send: Send) -> Any:
        """The model's Runtime once resident (held), keep-alive frames meanwhile; None if the
        client left or the load failed (its error frame sent)."""
        loading = asyncio.ensure_future(self.registry.acquire(self.name))
        left = asyncio.ensure_future(_disconnected(receive))
        try:
            while not loading.done():
                await self._write(send, self._keep_alive())
                await asyncio.wait({loading, left}, timeout=KEEP_ALIVE_S, return_when=asyncio.FIRST_COMPLETED)
                if left.done():
                    loading.add_done_callback(lambda f: f.exception() or self.registry.release(f.result()))
                    return None
        finally:
            left.cancel()
        try:
            return loading.result()
        except APIError as error:
            await self._error(send, error)
            return None

    async def _inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route's response with its start dropped (the 200 went out); a JSON one as one frame."""
        try:
            response = await self.endpoint(self.request)
        except (APIError, MlxcelError) as error:  # what the app's handlers would have answered
            await self._error(send, error if isinstance(error, APIError) else from_error(error))
            return
        framed: list[bool] = []
        body: list[bytes] = []

        async def forward(message: Message) -> None:
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                framed.append(kind.startswith((b"text/event-stream", b"application/x-ndjson")))
            elif framed[0]:
                await send(message)
            else:
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._write(send, self._frame(b"".join(body)), last=True)

        await response(scope, receive, forward)

    def _keep_alive(self) -> str:
        if not self.ollama:
            return f": loading model {self.name}\n\n"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        piece = {"message": {"role": "assistant", "content": ""}} if self.request.url.path == "/api/chat" \
            else {"response": ""}
        return json.dumps({"model": self.name, "created_at": stamp, **piece, "done": False}) + "\n"

    def _frame(self, payload: bytes) -> str:
        text = payload.decode("utf-8")
        if self.ollama:
            return text + "\n"
        event = "event: error\n" if self.request.url.path.startswith("/v1/messages") else ""
        return f"{event}data: {text}\n\n"

    async def _error(self, send: Send, error: APIError) -> None:
        await self._write(send, self._frame(error.response(self.request.url.path).body), last=True)

    @staticmethod
    async def _write(send: Send, frame: str, last: bool = False) -> None:
        with anyio.move_on_after(2.0):  # a client that stopped reading cannot hold the stream
            await send({"type": "http.response.body", "body": frame.encode("utf-8"), "more_body": True})
            if last:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
