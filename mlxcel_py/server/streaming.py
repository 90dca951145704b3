"""Engine events -> OpenAI responses: SSE chunks for streams, one JSON body otherwise.

A request the client stops reading is aborted (`Generation.close`), which frees its slot
at the engine's next tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Literal, Optional

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine import EngineWorker, Finished, PromptProgress, RequestHandle, TokenDelta
from .errors import APIError, error_body
from .metrics import ServerMetrics

log = logging.getLogger("mlxcel_py.server")

Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class Reply:
    """What a response is labelled with."""

    kind: Kind
    id: str
    created: int
    model: str
    include_usage: bool = False
    return_progress: bool = False


class Generation:
    """One submitted request: its events with server-side timing, and abort-unless-finished."""

    def __init__(self, handle: RequestHandle, worker: EngineWorker, metrics: ServerMetrics, arrived: float):
        self.handle, self.worker, self.metrics, self.arrived = handle, worker, metrics, arrived
        self.finished: Optional[Finished] = None

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

    def close(self) -> None:
        """Abort the request unless it already finished (client gone, server stopping)."""
        if self.finished is None:
            self.worker.abort(self.handle.request_id)
            self.metrics.observe_finish("abort")  # nobody reads its Finished event any more


# -- response bodies -------------------------------------------------------------------------
def usage_json(f: Finished) -> dict:
    u = f.usage
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def timings_json(f: Finished) -> dict:
    """llama-server's `timings` block (prompt_n counts the tokens actually prefilled)."""
    t, u = f.timings, f.usage
    prompt_n = u.prompt_tokens - u.cached_tokens
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": t.prefill_ms,
        "prompt_per_token_ms": t.prefill_ms / prompt_n if prompt_n else 0.0, "prompt_per_second": t.prompt_tps,
        "predicted_n": u.completion_tokens, "predicted_ms": t.decode_ms,
        "predicted_per_token_ms": t.decode_ms / u.completion_tokens if u.completion_tokens else 0.0,
        "predicted_per_second": t.decode_tps,
    }


def _choice(reply: Reply, text: Optional[str], finish: Optional[str], role: bool = False) -> dict:
    if reply.kind == "completion":
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    delta: dict = {"role": "assistant", "content": ""} if role else {}
    if text is not None:
        delta["content"] = text
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def chunk(reply: Reply, choices: list, **extra: Any) -> dict:
    kind = "chat.completion.chunk" if reply.kind == "chat" else "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model, "choices": choices, **extra}


def final_json(reply: Reply, text: str, f: Finished) -> dict:
    """The non-streaming response body."""
    if reply.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": f.finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": f.finish_reason}
        kind = "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model,
            "choices": [choice], "usage": usage_json(f), "timings": timings_json(f)}


def failure(f: Finished) -> APIError:
    """A request that ended without a normal finish reason."""
    if f.finish_reason == "abort":
        return APIError(503, f.error or "the request was aborted", code="server_shutting_down")
    return APIError(500, f.error or "the engine failed on this request", code="engine_error")


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# -- streaming ---------------------------------------------------------------------------------
async def sse_stream(reply: Reply, gen: Generation) -> AsyncIterator[str]:
    """The SSE frames of one request, ending with `data: [DONE]`."""
    try:
        if reply.kind == "chat":
            yield sse(chunk(reply, [_choice(reply, None, None, role=True)]))
        async for event in gen.events():
            for frame in _frames(reply, event):
                yield frame
    except Exception:  # a bug after the 200 went out: tell the client in-band
        log.exception("stream %s failed", reply.id)
        yield sse(error_body(500, "internal server error (see the server log)"))
    yield "data: [DONE]\n\n"


def _frames(reply: Reply, event: Any) -> list[str]:
    if isinstance(event, PromptProgress):
        if not reply.return_progress:
            return []
        progress = {"total": event.total, "cache": event.cache, "processed": event.processed,
                    "time_ms": event.time_ms}
        return [sse(chunk(reply, [_choice(reply, None, None)], prompt_progress=progress))]
    if isinstance(event, TokenDelta):
        return [sse(chunk(reply, [_choice(reply, event.text, None)]))] if event.text else []
    frames = [sse(chunk(reply, [_choice(reply, event.text, None)]))] if event.text else []
    if event.finish_reason not in ("stop", "length"):
        return frames + [sse(failure(event).body())]
    frames.append(sse(chunk(reply, [_choice(reply, None, event.finish_reason)], timings=timings_json(event))))
    if reply.include_usage:
        frames.append(sse(chunk(reply, [], usage=usage_json(event))))
    return frames


class EventStreamResponse(StreamingResponse):
    """SSE response that calls `on_close` however it ends (done, client gone, cancelled)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


# -- non-streaming -----------------------------------------------------------------------------
async def collect(gen: Generation) -> tuple[str, Finished]:
    """All text of a request and its `Finished` event."""
    parts: list[str] = []
    async for event in gen.events():
        if isinstance(event, TokenDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            parts.append(event.text)
            return "".join(parts), event
    raise RuntimeError("the event stream ended without Finished")


async def until_disconnect(receive: Callable[[], Awaitable[dict]], work: Awaitable[Any]) -> Optional[Any]:
    """Run `work`; None if the client disconnects first (the caller then aborts)."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            if not t.done():
                t.cancel()
    return task.result() if task.done() and not task.cancelled() else None
