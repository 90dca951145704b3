"""POST /v1/chat/completions and /v1/completions: read, prepare off the loop, submit, respond.

On the event loop a request only reads its body (bounded by --max-body-bytes); parsing,
validation, templating and tokenizing run on the Runtime's threads, generation on the
engine's. Routes never call MLX.
"""

from __future__ import annotations

from typing import Callable

from fastapi import Request
from fastapi.responses import Response

from .runtime import Runtime
from .framed_stream import FramedStream, start
from .prompts import Prepared, prepare_chat, prepare_completion
from .responses import OpenAIFramer
from .streaming import CLIENT_CLOSED, complete

async def chat_completions(request: Request) -> Response:
    return await _generate(request, prepare_chat, "messages")


async def completions(request: Request) -> Response:
    return await _generate(request, prepare_completion, "prompt")


async def _generate(request: Request, prepare: Callable[[Runtime, bytes], Prepared], param: str) -> Response:
    prepared, gen = await start(request, prepare, param)
    if gen is None:  # the client left while its prompt was being tokenized
        return Response(status_code=CLIENT_CLOSED)
    if prepared.stream:
        return FramedStream(OpenAIFramer(prepared.reply), gen, prepared.reply.id)
    return await complete(request.receive, prepared.reply, gen)
