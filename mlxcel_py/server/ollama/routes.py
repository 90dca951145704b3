"""Ollama's native API: /api/chat and /api/generate (streamed as NDJSON by default), /api/tags,
/api/show, /api/ps, /api/version; the model-management routes answer why not (embeddings: server/embeddings).

Errors on /api/ routes are Ollama's `{"error": "..."}` (http/errors.py picks the shape by path).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ... import __version__
from ..generation.assembler import Assembler
from ..generation.collect import collect
from ..generation.prepared import Prepared
from ..generation.stream import NDJSON_HEADERS, FramedStream
from ..generation.submit import CLIENT_CLOSED, submit
from ..http.body import parse_body, read_body
from ..http.errors import APIError
from ..runtime import routed, runtime
from .catalog import ps_json, ps_many, show_json, tags_json, tags_many
from .prepare import prepare_chat, prepare_generate
from .schemas import OllamaShowRequest
from .shapes import Kind, OllamaFramer, OllamaReply, loaded_json, whole_json

if TYPE_CHECKING:
    from ..runtime import Runtime

# The Ollama release whose API shapes these routes follow (clients gate features on it).
OLLAMA_API_VERSION = "0.12.0"
ADD_MODELS = ("this server serves the one model it was started with; choose it with `mlxcel-py serve --model` "
              "(a .gguf file, an mlx-lm directory or a Hugging Face id such as org/name:Q4_K_M)")

Prepare = Callable[["Runtime", bytes, float], Optional[Prepared[OllamaReply]]]


async def chat(request: Request) -> Response:
    """A chat reply: `message` pieces as NDJSON, or one object with `stream: false`."""
    return await _generate(request, prepare_chat, "chat", "messages")


async def generate(request: Request) -> Response:
    """A completion of `prompt`: `response` pieces as NDJSON, or one object with `stream: false`."""
    return await _generate(request, prepare_generate, "generate", "prompt")


async def _generate(request: Request, prepare: Prepare, kind: Kind, param: str) -> Response:
    arrived = time.perf_counter()
    raw = await read_body(request, runtime(request).max_body_bytes, curl_without_origin=True)
    async with routed(request, raw) as rt:
        return await _answer(request, rt, await rt.off_loop(prepare, rt, raw, arrived), kind, param, arrived)


async def _answer(request: Request, rt: "Runtime", prepared: Optional[Prepared[OllamaReply]], kind: Kind,
                  param: str, arrived: float) -> Response:
    if prepared is None:  # no prompt: Ollama's way to load a model (with keep_alive 0: to unload it)
        return JSONResponse(loaded_json(kind, rt.model_id, unload=rt.routed and rt.keep_alive == 0))
    gen = await submit(request, rt, prepared.job, arrived, param)
    if gen is None:
        return Response(status_code=CLIENT_CLOSED)
    reply = prepared.reply
    if prepared.stream:
        return FramedStream(OllamaFramer(reply), gen, prepared.job.request_id, NDJSON_HEADERS)
    whole = await collect(request.receive, gen, Assembler(reply.shape))
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(whole_json(reply, list(whole.parts), whole.finished, whole.token_ids))


async def tags(request: Request) -> dict:
    """The served model, under each of its names (its files' sizes read off the loop); with several
    models every configured one, with its state."""
    rt, registry = runtime(request), request.app.state.registry
    return await rt.off_loop(tags_json, rt) if registry is None else await rt.off_loop(tags_many, registry)


async def show(request: Request) -> dict:
    """The model's details (with one model, whatever name the body gives)."""
    raw = await read_body(request, runtime(request).max_body_bytes, curl_without_origin=True)
    async with routed(request, raw, keys=("model", "name")) as rt:
        body = await rt.off_loop(parse_body, raw, OllamaShowRequest)
        rt.check_model(body.model or body.name)
        return await rt.off_loop(show_json, rt)


async def ps(request: Request) -> dict:
    """The loaded models: the served one, for the server's lifetime; with several, the resident ones."""
    rt, registry = runtime(request), request.app.state.registry
    return await rt.off_loop(ps_json, rt) if registry is None else await rt.off_loop(ps_many, registry)


async def version(request: Request) -> dict:
    return {"version": OLLAMA_API_VERSION, "mlxcel_py": __version__}


async def manage_models(request: Request) -> Response:
    """/api/pull, /push, /create, /copy, /delete: models are not managed over HTTP here."""
    raise APIError(501, f"{request.url.path} is not supported: {ADD_MODELS}", code="not_implemented")
