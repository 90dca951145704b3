"""OpenAI's routes: POST /v1/chat/completions and /v1/completions (read, prepare off the loop,
submit, respond), GET /v1/models.

On the event loop a request only reads its body (bounded by --max-body-bytes); parsing,
validation, templating and tokenizing run on the Runtime's threads, generation on the
engine's. Routes never call MLX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..generation.assembler import Assembler
from ..generation.collect import collect
from ..generation.prepared import Prepared
from ..generation.stream import FramedStream
from ..generation.submit import CLIENT_CLOSED, start
from ..runtime import runtime
from .prepare import prepare_chat, prepare_completion
from .shapes import OpenAIFramer, Reply, assembled_json

if TYPE_CHECKING:
    from ..runtime import Runtime


async def chat_completions(request: Request) -> Response:
    return await _generate(request, prepare_chat, "messages")


async def completions(request: Request) -> Response:
    return await _generate(request, prepare_completion, "prompt")


async def _generate(request: Request, prepare: Callable[["Runtime", bytes], Prepared[Reply]], param: str
                    ) -> Response:
    prepared, gen = await start(request, prepare, param)
    if gen is None:  # the client left while its prompt was being tokenized
        return Response(status_code=CLIENT_CLOSED)
    reply = prepared.reply
    if prepared.stream:
        return FramedStream(OpenAIFramer(reply), gen, reply.id)
    assembler = Assembler(reply.shape)
    whole = await collect(request.receive, gen, assembler)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    finish = assembler.finish_reason(whole.finished.finish_reason)
    return JSONResponse(assembled_json(reply, list(whole.parts), whole.finished, finish))


async def models(request: Request) -> dict:
    """The served model, with llama-server's context and vocabulary figures in `meta`."""
    rt = runtime(request)
    stats = rt.worker.stats()
    meta = {"context_length": rt.loaded.context_length, "slots": len(stats.slots), "slot_context": stats.slot_context,
            # llama-server's names for the same
            "n_ctx": stats.slot_context, "n_ctx_train": rt.loaded.context_length, "n_vocab": rt.vocab_size}
    tags = list(rt.config.server.model_tags) if rt.config.server else []
    entry = {"id": rt.model_id, "aliases": list(rt.aliases) or [rt.model_id], "tags": tags, "object": "model",
             "created": rt.started, "owned_by": "mlxcel-py", "meta": meta}
    return {"object": "list", "data": [entry]}
