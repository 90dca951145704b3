"""The chat page at `/` (docs/WEBUI.md): static files in `static/`, served by `routes`."""

from .routes import STATIC_DIR, WebUIDoor, accepts_html, router

__all__ = ["STATIC_DIR", "WebUIDoor", "accepts_html", "router"]
