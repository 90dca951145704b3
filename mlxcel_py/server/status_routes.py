"""What the server is doing: /health, /v1/models, /metrics, /slots."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .runtime import runtime
from .metrics import CONTENT_TYPE

async def health(request: Request) -> JSONResponse:
    rt = runtime(request)
    if rt.failure is not None:
        return JSONResponse({"status": "error", "error": rt.failure}, status_code=503)
    if rt.draining:
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    if not rt.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def models(request: Request) -> dict:
    rt = runtime(request)
    stats = rt.worker.stats()
    meta = {"context_length": rt.loaded.context_length, "slots": len(stats.slots), "slot_context": stats.slot_context,
            # llama-server's names for the same
            "n_ctx": stats.slot_context, "n_ctx_train": rt.loaded.context_length, "n_vocab": rt.vocab_size}
    entry = {"id": rt.model_id, "aliases": list(rt.aliases) or [rt.model_id], "object": "model",
             "created": rt.started, "owned_by": "mlxcel-py", "meta": meta}
    return {"object": "list", "data": [entry]}


async def metrics(request: Request) -> Response:
    return Response(runtime(request).metrics.render(), media_type=CONTENT_TYPE)


async def slots(request: Request) -> list[dict]:
    stats = runtime(request).worker.stats()
    return [
        {
            "id": s.slot_id, "state": s.state, "is_processing": s.state != "idle", "request_id": s.request_id,
            "n_ctx": stats.slot_context, "prompt_tokens": s.prompt_tokens, "processed": s.processed,
            "generated": s.generated,
        }
        for s in stats.slots
    ]
