"""What the server is doing, whatever the dialect: /health, /metrics, /slots (/v1/models is in
openai/, /props in llama/)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..runtime import runtime
from .errors import APIError
from .metrics import CONTENT_TYPE


def _switched_off(endpoint: str, flag: str) -> APIError:
    """llama-server's answer for an endpoint started without its switch."""
    return APIError(501, f"This server does not support {endpoint} endpoint. Start it with `{flag}`")


async def health(request: Request) -> JSONResponse:
    rt = runtime(request)
    if rt.failure is not None:
        return JSONResponse({"status": "error", "error": rt.failure}, status_code=503)
    if rt.draining:
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    if not rt.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    rt = runtime(request)
    if rt.config.server is not None and not rt.config.server.endpoint_metrics:
        raise _switched_off("metrics", "--metrics")
    # llama-server's header: when this process started, for rates over its lifetime.
    return Response(rt.metrics.render(), media_type=CONTENT_TYPE,
                    headers={"Process-Start-Time-Unix": str(rt.started)})


async def slots(request: Request) -> list[dict]:
    rt = runtime(request)
    if rt.config.server is not None and not rt.config.server.endpoint_slots:
        raise _switched_off("slots", "--slots")
    stats = rt.worker.stats()
    kv = stats.kv
    return [
        {
            "id": s.slot_id, "state": s.state, "is_processing": s.state != "idle", "request_id": s.request_id,
            "n_ctx": stats.slot_context, "prompt_tokens": s.prompt_tokens, "processed": s.processed,
            "generated": s.generated, "cache_type_k": kv.type_k, "cache_type_v": kv.type_v,
            "kv_bytes_per_token": kv.bytes_per_token, "kv_bytes": (s.processed + s.generated) * kv.bytes_per_token,
        }
        for s in stats.slots
    ]
