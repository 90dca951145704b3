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
from ..generation.fanout import GenerationGroup, PreparedGroup, collect_all, start_all
from ..generation.submit import CLIENT_CLOSED
from ..runtime import runtime
from .choices import ChoicesFramer, fan_out, whole_json
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
    group, members = await start_all(request, lambda rt, raw: fan_out(prepare(rt, raw)), param)
    if members is None:  # the client left while its prompt was being tokenized
        return Response(status_code=CLIENT_CLOSED)
    if len(members) > 1:
        return await _choices(request, group, GenerationGroup(members))
    gen, reply = members[0], group.replies[0]
    if group.stream:
        return FramedStream(OpenAIFramer(reply), gen, reply.id)
    assembler = Assembler(reply.shape)
    whole = await collect(request.receive, gen, assembler)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    finish = assembler.finish_reason(whole.finished.finish_reason)
    return JSONResponse(assembled_json(reply, list(whole.parts), whole.finished, finish))


async def _choices(request: Request, group: PreparedGroup[Reply], members: GenerationGroup) -> Response:
    """n > 1: the choices' streams in one, or one body with every choice."""
    if group.stream:
        return FramedStream(ChoicesFramer(group.replies), members, group.replies[0].id)
    wholes = await collect_all(request.receive, members)
    if wholes is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(whole_json(group.replies, wholes))


async def models(request: Request) -> dict:
    """The served model, with llama-server's context and vocabulary figures in `meta`; with several,
    every configured one with its `status` (loaded, loading, unloaded) and memory."""
    registry = request.app.state.registry
    if registry is None:
        rt = runtime(request)
        base = _entry(rt)
        return {"object": "list", "data": [base, *_adapter_entries(rt, base)]}
    data = []
    for hosted in registry.hosted.values():
        rt = hosted.runtime
        entry = _entry(rt) if rt.loaded is not None else {
            "id": hosted.name, "aliases": [hosted.name], "tags": [], "object": "model", "created": rt.started,
            "owned_by": "mlxcel-py"}
        data.append({**entry, "status": hosted.describe()})
    return {"object": "list", "data": data}


def _capabilities(rt: "Runtime") -> list[str]:
    """llama-server's words: "completion", and "multimodal" for images; ours for the rest."""
    loaded = rt.loaded
    if loaded.rank_head is not None:
        return ["rerank"]
    if not loaded.causal:
        return ["embedding"]
    return ["completion", "multimodal"] if loaded.vision is not None else ["completion"]


def _adapter_entries(rt: "Runtime", base: dict) -> list[dict]:
    """The served model with one of its LoRA adapters alone, as `<id>:<adapter>` (a `model` naming it selects it)."""
    from pathlib import Path

    return [{**base, "id": f"{rt.model_id}:{Path(a.path).stem}", "aliases": [f"{rt.model_id}:{Path(a.path).stem}"],
             "parent": rt.model_id, "adapter": {"id": a.id, "path": a.path, "scale": a.scale}}
            for a in rt.loaded.adapters]


def _entry(rt: "Runtime") -> dict:
    stats = rt.worker.stats()
    meta = {"context_length": rt.loaded.context_length, "slots": len(stats.slots), "slot_context": stats.slot_context,
            # llama-server's names for the same
            "n_ctx": stats.slot_context, "n_ctx_train": rt.loaded.context_length, "n_vocab": rt.vocab_size}
    tags = list(rt.config.server.model_tags) if rt.config.server else []
    entry = {"id": rt.model_id, "aliases": list(rt.aliases) or [rt.model_id], "tags": tags, "object": "model",
             "created": rt.started, "owned_by": "mlxcel-py", "meta": meta, "capabilities": _capabilities(rt)}
    return entry
