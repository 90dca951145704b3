"""CORS, safe by default: browser pages on loopback origins (any port) may call the API;
`--cors-origins` adds origins (or `*`, any site; `localhost`, llama-server's keyword, names the
loopback ones).

Starlette's CORSMiddleware does the work. It sits in front of everything, so preflights
never need the API key, and every answer (401, 4xx, 5xx included) carries the headers a
browser needs to read it.
"""

from __future__ import annotations

import re
from typing import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from ...serve_config import LOOPBACK
from .errors import APIError

LOOPBACK_HOSTS = r"(localhost|127\.0\.0\.1|\[::1\])"
# Headers a page may read besides the CORS-safelisted ones.
EXPOSED = ["Retry-After", "WWW-Authenticate"]
PREFLIGHT_MAX_AGE_S = 600


def origin_pattern(origins: Sequence[str]) -> str:
    """One regex for the loopback origins and the `scheme://host:*` entries (any port)."""
    wildcards = [re.escape(o.removesuffix(":*")) for o in origins if o.endswith(":*")]
    alternatives = [rf"https?://{LOOPBACK_HOSTS}"] + wildcards
    return rf"^({'|'.join(alternatives)})(:\d+)?$"


class Cors(CORSMiddleware):
    """CORSMiddleware whose preflight from a refused origin answers 200 without
    Access-Control-Allow-Origin, as llama-server does (the browser then refuses the call);
    a preflight refused for its method or headers gets the API's error JSON."""

    def preflight_response(self, request_headers) -> Response:  # type: ignore[no-untyped-def]
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        if not self.is_allowed_origin(request_headers.get("origin", "")):
            return Response(status_code=200, headers={"Vary": "Origin"})
        reason = response.body.decode("utf-8", "replace")
        error = APIError(response.status_code, f"CORS preflight refused: {reason} "
                         f"(origin {request_headers.get('origin')!r}; see --cors-origins)", code="cors_refused")
        kept = {k: v for k, v in response.headers.items() if k.startswith("access-control-") or k == "vary"}
        return JSONResponse(error.body(), status_code=error.status, headers=kept)


def cors_options(origins: Sequence[str]) -> dict:
    """The middleware's settings for `--cors-origins` (loopback origins are always allowed)."""
    exact = [o for o in origins if o not in (LOOPBACK, "*") and not o.endswith(":*")]
    return {
        "allow_origins": ["*"] if "*" in origins else exact,
        "allow_origin_regex": origin_pattern(origins),
        "allow_methods": ["GET", "POST", "OPTIONS"],
        "allow_headers": ["*"],  # Authorization, x-api-key, the SDKs' anthropic-*/x-stainless-* headers
        "expose_headers": EXPOSED,
        "allow_credentials": False,  # keys travel in headers, never in cookies
        # Chrome's Private Network Access: an allowed public site may reach this local server.
        "allow_private_network": True,
        "max_age": PREFLIGHT_MAX_AGE_S,
    }

