"""Everything but generation: /health, /v1/models, /metrics, /slots, /tokenize, /detokenize."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from .app import runtime
from .errors import APIError
from .schemas import DetokenizeRequest, TokenizeRequest, check_token_ids, parse_request

router = APIRouter()
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/health")
@router.get("/v1/health", include_in_schema=False)
async def health(request: Request) -> JSONResponse:
    rt = runtime(request)
    if rt.draining:
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    if not rt.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def models(request: Request) -> dict:
    rt = runtime(request)
    stats = rt.worker.stats()
    meta = {"context_length": rt.loaded.context_length, "slots": len(stats.slots), "slot_context": stats.slot_context}
    entry = {"id": rt.model_id, "object": "model", "created": rt.started, "owned_by": "mlxcel-py", "meta": meta}
    return {"object": "list", "data": [entry]}


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    rt = runtime(request)
    return PlainTextResponse(rt.metrics.render(rt.worker.stats(), rt.model_id), media_type=PROMETHEUS_TEXT)


@router.get("/slots")
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


@router.post("/tokenize")
async def tokenize(request: Request) -> dict:
    from ..models import encode_text

    rt = runtime(request)
    body = await parse_request(request, TokenizeRequest)
    try:
        ids = encode_text(rt.loaded.tokenizer, body.content, add_special_tokens=bool(body.add_special))
    except ValueError as exc:
        raise APIError(400, str(exc), param="content") from None
    if not body.with_pieces:
        return {"tokens": list(ids)}
    decode = rt.loaded.tokenizer.decode
    return {"tokens": [{"id": t, "piece": decode([t])} for t in ids]}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    rt = runtime(request)
    body = await parse_request(request, DetokenizeRequest)
    check_token_ids(body.tokens, rt.vocab_size, "tokens")
    return {"content": rt.loaded.tokenizer.decode(body.tokens)}
