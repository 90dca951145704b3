"""/openapi.json: FastAPI's schema of the routes, plus the request bodies the routes parse
themselves (off the event loop, so FastAPI never sees them as parameters) and the errors.

Served behind the API key like every route but /health.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from .errors import anthropic_route, ollama_route

REF = "#/components/schemas/{model}"
ERRORS = {
    "400": "Invalid request: the message and `param` name the field",
    "401": "Missing or wrong API key",
    "404": "Unknown route, or (on a path with an id) nothing stored under that id",
    "413": "Body larger than --max-body-bytes",
    "415": "Content-Type is not application/json",
    "429": "Every slot busy and the queue full; retry after Retry-After seconds",
    "501": "Not supported by this server; the message says what to do instead",
    "503": "Loading, or shutting down; retry after Retry-After seconds",
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
        },
    }},
}


ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
    }},
}


OLLAMA_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


def _error_schema(path: str) -> str:
    return "AnthropicError" if anthropic_route(path) else "OllamaError" if ollama_route(path) else "Error"


def _error_responses(codes: list[str], path: str) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/" + _error_schema(path)}
    return {code: {"description": ERRORS[code], "content": {"application/json": {"schema": ref}}} for code in codes}


def build_openapi(app: FastAPI, api_key: bool, bodies: dict[str, type[BaseModel]],
                  streaming: tuple[str, ...], refusing: tuple[str, ...] = ()) -> dict[str, Any]:
    """FastAPI's schema plus `bodies` (path -> the body it parses), the errors, the streamed replies,
    and the 501 of the `refusing` routes (declared so that clients know, always answered)."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="OpenAI, llama-server, Anthropic and Ollama APIs of mlxcel-py serve "
                                     "(see docs/SERVER.md)")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    components["AnthropicError"] = ANTHROPIC_ERROR_SCHEMA
    components["OllamaError"] = OLLAMA_ERROR_SCHEMA
    for path, model in bodies.items():
        body = model.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}
        operation["responses"].update(_error_responses(["400", "404", "413", "415", "429", "503"], path))
    for path, methods in schema["paths"].items():
        for operation in methods.values():
            keyed = ["401"] if api_key and path != "/health" else []
            by_id = ["404"] if "{" in path else []  # e.g. GET /v1/responses/{response_id}
            operation["responses"].update(_error_responses(["503", *keyed, *by_id], path))
    for path in refusing:
        for operation in schema["paths"][path].values():
            operation["responses"].update(_error_responses(["501"], path))
    health = schema["paths"]["/health"]["get"]["responses"]["503"]
    health["description"] = "Loading or shutting down: {\"status\": \"loading\" | \"shutting_down\"}"
    health["content"] = {"application/json": {"schema": {"type": "object"}}}
    schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    for path in streaming:
        ok = schema["paths"][path]["post"]["responses"]["200"]
        if ollama_route(path):  # Ollama streams by default, one JSON object a line
            ok["description"] = "Newline-delimited JSON objects (the default), or one object with `stream: false`"
            ok["content"]["application/x-ndjson"] = {"schema": {"type": "string"}}
            continue
        ok["description"] = "The reply as JSON, or with `stream: true` server-sent events (OpenAI's end in [DONE])"
        ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    if api_key:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema


def install_openapi(app: FastAPI, api_key: bool, bodies: dict[str, type[BaseModel]],
                    streaming: tuple[str, ...], refusing: tuple[str, ...] = ()) -> None:
    """Serve the schema at /openapi.json (built once, on first request)."""
    built: list[dict[str, Any]] = []

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        if not built:
            built.append(build_openapi(app, api_key, bodies, streaming, refusing))
        return JSONResponse(built[0])
