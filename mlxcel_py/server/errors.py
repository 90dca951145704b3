"""OpenAI's error JSON everywhere: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import logging
import uuid
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..errors import EngineStoppedError, MlxcelError, QueueFullError, RequestError

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
    503: "unavailable_error",
}


class APIError(Exception):
    """An error a route answers with; rendered as OpenAI's error JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_error(exc: MlxcelError, param: Optional[str] = None) -> APIError:
    """Map the project's errors to HTTP statuses; `param` names the field when the error does not."""
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
    """Route every failure (ours, FastAPI's, Starlette's 404/405, bugs) through error_body."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)  # the client left while sending its body; nobody reads this

    @app.exception_handler(MlxcelError)
    async def _ours(_: Request, exc: MlxcelError) -> JSONResponse:
        return from_error(exc).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug in a route: log it once with an id the client also gets, answer 500, keep serving.
        incident = f"req-{uuid.uuid4().hex[:12]}"
        log.error("unhandled error %s on %s %s", incident, request.method, request.url.path, exc_info=exc)
        message = f"internal server error (request id {incident}; see the server log)"
        return JSONResponse(error_body(500, message, code="internal_error"), status_code=500)
