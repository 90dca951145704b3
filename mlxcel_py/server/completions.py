"""POST /v1/chat/completions and /v1/completions: read, prepare off the loop, submit, respond.

On the event loop a request only reads its body (bounded by --max-body-bytes); parsing,
validation, templating and tokenizing run on the Runtime's threads, generation on the
engine's. Routes never call MLX.
"""

from __future__ import annotations

import time
from typing import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .app import Runtime, runtime
from .body import read_body
from .framed_stream import FramedStream, submit
from .prompts import Prepared, prepare_chat, prepare_completion
from .responses import OpenAIFramer
from .streaming import CLIENT_CLOSED, complete

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    return await _generate(request, prepare_chat)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, prepare_completion)


async def _generate(request: Request, prepare: Callable[[Runtime, bytes], Prepared]) -> Response:
    arrived = time.perf_counter()
    rt = runtime(request)
    raw = await read_body(request, rt.max_body_bytes)
    prepared = await rt.off_loop(prepare, rt, raw)
    del raw  # a large body is not kept alive for the whole generation
    gen = await submit(request, rt, prepared.job, arrived, "messages" if prepared.reply.kind == "chat" else "prompt")
    if gen is None:  # the client left while its prompt was being tokenized
        return Response(status_code=CLIENT_CLOSED)
    if prepared.stream:
        return FramedStream(OpenAIFramer(prepared.reply), gen, prepared.reply.id)
    return await complete(request.receive, prepared.reply, gen)
