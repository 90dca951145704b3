"""POST /v1/chat/completions and /v1/completions: tokenize, submit, stream the events back.

Routes never call MLX: tokenizing happens here, generation on the worker's thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..engine import Request as EngineRequest
from ..errors import MlxcelError, RequestError
from .app import Runtime, runtime
from .errors import APIError, from_error
from .schemas import (
    ChatRequest, CompletionRequest, GenerationRequest, completion_prompt_ids, parse_request, sampling_params,
)
from .streaming import (
    EventStreamResponse, Generation, Kind, Reply, collect, failure, final_json, sse_stream, until_disconnect,
)

router = APIRouter()
CLIENT_CLOSED = 499  # nginx's "client closed request"; nobody reads it


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    arrived = time.perf_counter()
    rt = runtime(request)
    body = await parse_request(request, ChatRequest)
    rt.check_model(body.model)
    from ..models import encode_chat

    try:
        prompt = encode_chat(rt.loaded.tokenizer, body.messages)
    except RequestError as exc:
        raise from_error(exc, "messages") from None
    return await _generate(request, rt, body, "chat", prompt.ids, prompt.history_boundary, arrived)


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    arrived = time.perf_counter()
    rt = runtime(request)
    body = await parse_request(request, CompletionRequest)
    rt.check_model(body.model)
    try:
        ids = completion_prompt_ids(body.prompt, rt.loaded.tokenizer, rt.vocab_size)
    except RequestError as exc:  # tokenizer refusals
        raise from_error(exc, "prompt") from None
    return await _generate(request, rt, body, "completion", ids, None, arrived)


async def _generate(
    request: Request, rt: Runtime, body: GenerationRequest, kind: Kind,
    ids: tuple[int, ...], boundary: Optional[int], arrived: float,
) -> Response:
    param = "messages" if kind == "chat" else "prompt"
    sampling = sampling_params(body, rt.config.sampling)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    request_id = f"{prefix}-{uuid.uuid4().hex[:24]}"
    stream = bool(body.stream)
    reply = Reply(kind, request_id, int(time.time()), rt.model_id,
                  include_usage=stream and body.include_usage, return_progress=bool(body.return_progress))
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    try:
        job = EngineRequest(request_id, ids, sampling, boundary, cache_prompt)
        handle = rt.worker.submit(job, loop=asyncio.get_running_loop())
    except MlxcelError as exc:
        error = from_error(exc, param)
        rt.metrics.observe_rejection(error.status)
        raise error from None
    gen = Generation(handle, rt.worker, rt.metrics, arrived)
    if stream:
        return EventStreamResponse(sse_stream(reply, gen), on_close=gen.close)
    try:
        result = await until_disconnect(request.receive, collect(gen))
    finally:
        gen.close()
    if result is None:
        return Response(status_code=CLIENT_CLOSED)
    text, finished = result
    if finished.finish_reason not in ("stop", "length"):
        raise failure(finished)
    return JSONResponse(final_json(reply, text, finished))
