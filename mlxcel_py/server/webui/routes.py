"""The chat page: `GET /` for browsers and its files under `/webui/`, read from `static/` in the package.

Only requests for the page reach this router, and they reach it ahead of the API key and loading
gate (`WebUIDoor`): a browser cannot send a bearer token with a page load, so the page is public
and asks for the key itself. `/` from anything that does not ask for text/html (curl, load
balancers' health checks) goes on to the app as before (404 JSON, 401 with a key, 503 loading).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

STATIC_DIR = Path(str(files(__package__) / "static"))
ASSET_PREFIX = "/webui/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
    ".json": "application/json", ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain; charset=utf-8",
}
# The page and its scripts come from this server only, and so do its requests: model output that
# slipped past the sanitiser could still load nothing and send nothing elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
COMMON_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _assets() -> dict[str, Path]:
    """URL path -> file, for every file of a type we serve (the table is fixed at import)."""
    found = {}
    for path in sorted(STATIC_DIR.rglob("*")):
        if path.is_file() and path.suffix in CONTENT_TYPES:
            found[ASSET_PREFIX + path.relative_to(STATIC_DIR).as_posix()] = path
    return found


ASSETS = _assets()


def accepts_html(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the Accept header names text/html (or XHTML) with a non-zero q: a browser's page load."""
    for name, value in headers:
        if name.lower() != b"accept":
            continue
        for item in value.decode("latin-1").split(","):
            media, *params = (part.strip().lower() for part in item.split(";"))
            if media in ("text/html", "application/xhtml+xml") and "q=0" not in params:
                return True
    return False


def _file(path: Path, extra: dict[str, str]) -> Response:
    return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers={**COMMON_HEADERS, **extra})


async def page(request: Request) -> Response:
    """The single page."""
    return _file(STATIC_DIR / "index.html", {"Content-Security-Policy": CSP})


async def asset(request: Request) -> Response:
    """One of the page's files (only those in the table reach here)."""
    return _file(ASSETS[request.url.path], {})


router = Router(routes=[Route("/", page, methods=["GET"]), Route(ASSET_PREFIX + "{name:path}", asset, methods=["GET"])])


def is_page_request(scope: Scope) -> bool:
    """The page for a browser, or one of its files; anything else is the API's."""
    if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
        return False
    path = scope["path"]
    return path in ASSETS or (path == "/" and accepts_html(scope.get("headers", [])))


class WebUIDoor:
    """ASGI middleware placed between the bug catcher and the gate: page requests go to `router`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_page_request(scope):
            await router(scope, receive, send)
        else:
            await self.app(scope, receive, send)
