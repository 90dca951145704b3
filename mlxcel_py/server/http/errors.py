"""Error JSON: OpenAI's `{"error": {"message", "type", "param", "code"}}` everywhere, except
Anthropic's `{"type": "error", "error": {"type", "message"}}` on the Anthropic routes and
Ollama's `{"error": "..."}` on its /api/ routes.

A context overflow also carries llama-server's `n_prompt_tokens` and `n_ctx` in the error
object. Bugs are answered (500, with an id the log also has) by `CatchBugs`, inside the
CORS middleware so a browser can read even that answer.
"""

from __future__ import annotations

import logging
import uuid
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import EngineStoppedError, MlxcelError, PromptTooLongError, QueueFullError, RequestError

log = logging.getLogger("mlxcel_py.server")

RETRY_AFTER_S = 1
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_supported_error",  # llama-server's, for an endpoint switched off
    503: "unavailable_error",
}
# Anthropic's error types (its API reference, "Errors"); 503 is its overloaded_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_ROUTE = "/v1/messages"
OLLAMA_PREFIX = "/api/"


def anthropic_route(path: str) -> bool:
    """The Anthropic routes answer errors in Anthropic's shape."""
    return path == ANTHROPIC_ROUTE or path.startswith(ANTHROPIC_ROUTE + "/")


def ollama_route(path: str) -> bool:
    """Ollama's routes (/api/...) answer errors in Ollama's shape, {"error": "..."}."""
    return path.startswith(OLLAMA_PREFIX)


class APIError(Exception):
    """An error a route answers with; rendered as OpenAI's error JSON (Anthropic's, Ollama's on their routes)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
        extra: Optional[dict] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}
        self.extra = extra or {}  # more fields of the error object (llama-server's n_prompt_tokens, n_ctx)

    def body(self, path: str = "") -> dict:
        if anthropic_route(path):
            return anthropic_error_body(self.status, self.message)
        if ollama_route(path):
            return {"error": self.message}
        return error_body(self.status, self.message, param=self.param, code=self.code, extra=self.extra)

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(self.body(path), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
               extra: Optional[dict] = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code, **(extra or {})}}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def from_error(exc: MlxcelError, param: Optional[str] = None) -> APIError:
    """Map the project's errors to HTTP statuses; `param` names the field when the error does not."""
    if isinstance(exc, PromptTooLongError):  # llama-server's fields, for clients that trim and retry
        return APIError(400, str(exc), param=exc.param or param, code=exc.code,
                        extra={"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx})
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param or param, code=exc.code)
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc), code=exc.code, headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, EngineStoppedError):
        return APIError(503, str(exc), code=exc.code)
    return APIError(500, str(exc), code=getattr(exc, "code", None))


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    return (f"{param}: {first.get('msg')}" if param else str(first.get("msg"))), param


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure (ours, FastAPI's, Starlette's 404/405) through the error JSON of its route."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return APIError(exc.status_code, message, headers=dict(exc.headers or {})).response(request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)  # the client left while sending its body; nobody reads this

    @app.exception_handler(MlxcelError)
    async def _ours(request: Request, exc: MlxcelError) -> JSONResponse:
        return from_error(exc).response(request.url.path)


class CatchBugs:
    """Any other exception is a bug: log it once with an id the client also gets, answer 500, keep serving.

    An ASGI middleware rather than an `Exception` handler, which Starlette runs outside every
    middleware (so its 500 would miss the CORS headers)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # too late for a status: the server closes the connection
                raise
            incident = f"req-{uuid.uuid4().hex[:12]}"
            log.error("unhandled error %s on %s %s", incident, scope.get("method"), scope["path"], exc_info=exc)
            error = APIError(500, f"internal server error (request id {incident}; see the server log)",
                             code="internal_error")
            await error.response(scope["path"])(scope, receive, send)
