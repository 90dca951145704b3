"""Browser tests of the chat page: Playwright for Python driving Debian's chromium, headless.

Skipped with the reason when playwright or /usr/bin/chromium is missing (`make test-webui`
installs both where we are root). Every request the page makes is recorded, and anything not
for this server is refused, so a test can assert that nothing left 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
from urllib.parse import urlsplit

import pytest

from server_helpers import start_server, stop_server

CHROMIUM = os.environ.get("MLXCEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[webui]', or make test-webui)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which("chromium"):
        return f"no chromium at {CHROMIUM} (apt-get install chromium, or make test-webui)"
    return None


# Module scope, not session: a live sync_playwright holds a running asyncio loop on the main
# thread, and every later test that calls asyncio.run (the CLI's serve) would fail.
@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server():
    running = start_server(parallel=2)
    yield running
    stop_server(running)


class RecordedPage:
    """A page with every request URL recorded; requests for other hosts are aborted."""

    def __init__(self, context, base: str):
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.context = context
        self.base = base
        context.route("**/*", self._route)
        self.page = context.new_page()
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))

    def _route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if urlsplit(url).hostname == "127.0.0.1":
            route.fallback()
        else:
            route.abort()

    def foreign(self) -> list[str]:
        """Requests for anything but this server (data: and blob: URLs never reach the network)."""
        return [u for u in self.requests if urlsplit(u).scheme not in ("data", "blob")
                and urlsplit(u).netloc != urlsplit(self.base).netloc]


@pytest.fixture
def recorded(browser, server):
    context = browser.new_context(viewport=VIEWPORT, base_url=server.url)
    rec = RecordedPage(context, server.url)
    yield rec
    context.close()
