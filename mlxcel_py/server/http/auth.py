"""The gate in front of every route: the optional API key, then loading/shutting-down.

The key is taken as `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
(Anthropic's). CORS preflights never get here: the CORS middleware in front answers them.

A plain ASGI middleware (not BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Callable, Optional

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, unavailable

log = logging.getLogger("mlxcel_py.server")
OPEN_PATHS = frozenset({"/health", "/v1/health"})


def presented_keys(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request presents: its bearer token and its x-api-key header."""
    keys = []
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                keys.append(token.strip())
        elif name == b"x-api-key":
            keys.append(value.strip())
    return keys


class Gate:
    """401 without the right key; 503 while loading or draining (except /health)."""

    def __init__(self, app: ASGIApp, api_key: Optional[str], state: Callable[[], object]):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.state = state  # returns the app's Runtime (read per request: it changes at startup)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        error = self._check(scope)
        if error is not None:
            await _answer(error, scope, receive, send)
            return
        started = []

        async def tracked(message: dict) -> None:
            started.append(True)
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            # The server cancels what is left once the grace period (and its margin) is over:
            # answer 503 if nothing went out yet, and end quietly instead of a traceback.
            if not self.state().draining:  # type: ignore[attr-defined]
                raise
            log.warning("%s %s cut at shutdown", scope.get("method"), scope["path"])
            if not started:
                await _answer(unavailable("the server is shutting down", "server_shutting_down"), scope, receive, send)

    def _check(self, scope: Scope) -> Optional[APIError]:
        if self.api_key is not None:
            keys = presented_keys(scope.get("headers", []))
            # compare_digest: the time taken does not reveal how much of the key matched.
            if not any([hmac.compare_digest(key, self.api_key) for key in keys]):
                return APIError(401, "invalid or missing API key; send 'Authorization: Bearer <key>' or "
                                "'x-api-key: <key>'",
                                code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return self.state().gate_error()  # type: ignore[attr-defined]


async def _answer(error: APIError, scope: Scope, receive: Receive, send: Send) -> None:
    await error.response(scope["path"])(scope, receive, send)
