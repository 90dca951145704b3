"""What the server is doing, whatever the dialect: /health, /metrics, /slots (/v1/models is in
openai/, /props in llama/)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..runtime import Runtime, runtime, serving
from .errors import APIError
from .metrics import CONTENT_TYPE, render_by_model


def _switched_off(endpoint: str, flag: str) -> APIError:
    """llama-server's answer for an endpoint started without its switch."""
    return APIError(501, f"This server does not support {endpoint} endpoint. Start it with `{flag}`")


async def health(request: Request) -> JSONResponse:
    rt = serving(request.app)  # with several models: up while not draining (each loads on demand)
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
    registry = request.app.state.registry
    text = rt.metrics.render() if registry is None else render_by_model(
        [(h.name, h.runtime.metrics) for h in registry.hosted.values()])
    # llama-server's header: when this process started, for rates over its lifetime.
    return Response(text, media_type=CONTENT_TYPE,
                    headers={"Process-Start-Time-Unix": str(rt.started)})


async def slots(request: Request) -> list[dict]:
    rt = runtime(request)
    if rt.config.server is not None and not rt.config.server.endpoint_slots:
        raise _switched_off("slots", "--slots")
    registry = request.app.state.registry
    if registry is None:
        return _slots(rt)
    wanted = request.query_params.get("model")
    if wanted is not None:
        registry.find(wanted)  # a 404 listing the models for an unknown name
    return [{**slot, "model": h.name} for h in registry.hosted.values()
            if h.runtime.worker is not None and wanted in (None, h.name) for slot in _slots(h.runtime)]


def _slots(rt: Runtime) -> list[dict]:
    stats = rt.worker.stats()
    kv = stats.kv
    return [
        {
            "id": s.slot_id, "state": s.state, "is_processing": s.state != "idle", "request_id": s.request_id,
            "n_ctx": stats.slot_context, "prompt_tokens": s.prompt_tokens, "processed": s.processed,
            "generated": s.generated, "context_shifts": s.context_shifts, "cache_type_k": kv.type_k, "cache_type_v": kv.type_v,
            "kv_bytes_per_token": kv.bytes_per_token, "kv_bytes": kv.slot_bytes(s.processed + s.generated),
            **({"kv_window_positions": kv.window_positions, "kv_window_bytes_per_token": kv.window_bytes_per_token}
               if kv.window_positions else {}),
        }
        for s in stats.slots
    ]
