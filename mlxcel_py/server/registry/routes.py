"""llama-server's router routes: POST /models/load and /models/unload {"model": NAME}.

With one model configured it is always loaded: /models/load succeeds, /models/unload is a 400
saying so (the one model stays loaded for the server's lifetime).
"""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, Field

from ..http.body import parse_body, read_body
from ..http.errors import APIError
from ..runtime import runtime


class ModelNameRequest(BaseModel):
    """The body of /models/load and /models/unload."""

    model: str = Field(min_length=1, description="A configured model's name (GET /v1/models lists them).")


async def _named(request: Request) -> str:
    rt = runtime(request)
    body = await rt.off_loop(parse_body, await read_body(request, rt.max_body_bytes), ModelNameRequest)
    return body.model


async def load_model_route(request: Request) -> dict:
    """Load the named model now (it answers at once when resident); its load error otherwise."""
    name = await _named(request)
    registry = request.app.state.registry
    if registry is not None:
        await registry.load(name)
    return {"success": True, "model": name}


async def unload_model_route(request: Request) -> dict:
    """Unload the named model (a 409 while it has requests in flight)."""
    name = await _named(request)
    registry = request.app.state.registry
    if registry is None:
        raise APIError(400, "this server serves one model, loaded for its lifetime; serve several "
                            "(-m twice or --models-dir) to unload them on demand", param="model")
    unloaded = await registry.unload(name)
    return {"success": True, "model": name, "unloaded": unloaded}
