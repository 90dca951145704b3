"""The streamed response of one submitted request, whose frames come from a `Framer`: one per
dialect (openai.shapes.OpenAIFramer, llama.shapes.NativeFramer, anthropic.shapes.AnthropicFramer,
ollama.shapes.OllamaFramer, whose lines are NDJSON rather than SSE).

The transport is the same for all: the client is watched from submission (a client that
leaves aborts its request), a server-side cut ends the stream with the framer's frames,
and a bug after the 200 is reported in-band. Only the frames differ per API.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..http.errors import APIError
from .submit import Generation, watched

log = logging.getLogger("mlxcel_py.server")
FINAL_WRITE_S = 2.0  # a client that stopped reading cannot hold a cut stream open longer than this
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
NDJSON_HEADERS = [  # Ollama's streams: one JSON object a line
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse(obj: Any) -> str:
    """One `data:` frame of JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Framer(Protocol):
    """The SSE frames of one streamed reply in one API's shape."""

    def opening(self) -> list[str]: ...
    def frames(self, event: Any) -> list[str]: ...  # one engine event's frames (possibly none)
    def cut(self, error: APIError) -> list[str]: ...  # the server ended the request
    def bug(self) -> list[str]: ...  # a bug after the 200 went out
    def closing(self) -> list[str]: ...  # after everything else


class FramedStream(Response):
    """The streamed response of one request, framed by `framer` (SSE unless `headers` say otherwise)."""

    def __init__(self, framer: Framer, gen: Generation, label: str, headers: list = SSE_HEADERS):
        super().__init__()  # a Response, so FastAPI passes it through; __call__ writes the stream
        self.framer, self.gen, self.label, self.stream_headers = framer, gen, label, headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.stream_headers})
        await watched(receive, self.gen, lambda: self._body(send))

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
