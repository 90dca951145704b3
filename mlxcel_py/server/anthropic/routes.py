"""Anthropic's Messages API: POST /v1/messages (streamed or not) and /v1/messages/count_tokens.

Errors on these routes are Anthropic-shaped (http/errors.py picks the shape by path); the API key
may come as `x-api-key` (http/auth.py).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..generation.collect import collect
from ..generation.stream import FramedStream
from ..generation.submit import CLIENT_CLOSED, start
from ..http.body import read_body
from ..runtime import routed, runtime
from .prepare import count_tokens, prepare_messages
from .shapes import AnthropicFramer, message_json


async def messages(request: Request) -> Response:
    """A Messages reply: text and tool_use blocks; with `stream` Anthropic's event stream."""
    prepared, gen = await start(request, prepare_messages, "messages")
    if gen is None:
        return Response(status_code=CLIENT_CLOSED)
    if prepared.stream:
        return FramedStream(AnthropicFramer(prepared.reply), gen, prepared.reply.id)
    whole = await collect(request.receive, gen)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(message_json(prepared.reply, whole.text, whole.finished))


async def messages_count_tokens(request: Request) -> dict:
    """{"input_tokens": n}: the prompt the same body would run (templated and tokenized, nothing generated)."""
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, raw) as rt:
        return await rt.off_loop(count_tokens, rt, raw)
