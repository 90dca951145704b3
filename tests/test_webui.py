"""The chat page without a browser: served at / to browsers only, its files, --no-webui, the key,
and nothing in it that points outside the server (tests/webui/ drives it in chromium)."""

from __future__ import annotations

import re

from fnmatch import fnmatch
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import mlxcel_py.server.http.serving as serving
from mlxcel_py.cli.app import app as cli
from mlxcel_py.config import resolve
from mlxcel_py.errors import ConfigError
from mlxcel_py.server.app import create_app
from mlxcel_py.server.webui import STATIC_DIR, accepts_html
from config_helpers import flags_for
from server_helpers import start_server, stop_server

ROOT = Path(__file__).resolve().parents[1]
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
NOT_BROWSERS = [{}, {"Accept": "*/*"}, {"Accept": "application/json"}, {"Accept": "text/html;q=0"}]
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".json": "application/json", ".txt": "text/plain; charset=utf-8"}
# URLs in the vendored files that are not requests: licence and error-message text, XML namespace
# names, and marked's prefix for www. autolinks. A rebuilt vendor folder with a new one fails here.
VENDOR_URLS = {
    "https://github.com/babel/babel/blob/main/packages/babel-helpers/LICENSE", "https://github.com/markedjs/marked",
    "https://bugs.chromium.org/p/chromium/issues/detail?id=1305293", "https://github.com/markedjs/marked.",
    "https://github.com/sindresorhus/validate-element-name", "http://www.w3.org/1999/xhtml",
    "http://www.w3.org/2000/svg", "http://www.w3.org/1998/Math/MathML", "http://",
    "https://github.com/primer/github-syntax-light", "https://github.com/primer/github-syntax-dark",
    "https://github.com/highlightjs/highlight.js/wiki/security",
    "https://github.com/highlightjs/highlight.js/issues/2277",
}
URL = re.compile(r"https?://[^\s\"'`)\\]*")


def client(**kwargs) -> TestClient:
    """The app in its loading state (no model needed): the page does not depend on it."""
    return TestClient(create_app(None, None, resolve("serve", flags_for("serve", **kwargs), env={})))


@pytest.fixture(scope="module")
def ready():
    running = start_server()
    yield running
    stop_server(running)


def static_files() -> list[Path]:
    return sorted(p for p in STATIC_DIR.rglob("*") if p.is_file())


def test_the_page_is_served_to_browsers():
    response = client().get("/", headers=BROWSER)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert 'aria-label="Message"' in response.text and '<script type="module" src="/webui/js/main.js">' in response.text


def referenced_assets() -> set[str]:
    """Every /webui/ path index.html links and every JS module imports."""
    paths = set(re.findall(r'(?:src|href)="(/webui/[^"]+)"', (STATIC_DIR / "index.html").read_text()))
    for js in STATIC_DIR.rglob("*.js"):
        paths |= set(re.findall(r'from "(/webui/[^"]+)"', js.read_text()))
    return paths


def test_every_referenced_asset_is_served_with_its_type():
    web = client()
    paths = referenced_assets()
    assert {"/webui/js/main.js", "/webui/vendor/marked.js", "/webui/vendor/purify.js", "/webui/app.css"} <= paths
    for path in sorted(paths):
        response = web.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"] == TYPES[Path(path).suffix], path
        assert response.content == (STATIC_DIR / path.removeprefix("/webui/")).read_bytes()


def test_an_unknown_asset_gets_the_apis_answer():
    response = client().get("/webui/nope.js")
    assert response.status_code == 503  # the gate's answer while loading, as for any unknown path
    assert client(no_webui=True).get("/webui/nope.js").json() == response.json()


def same_answer(a, b) -> None:
    assert (a.status_code, a.headers["content-type"], a.json()) == (b.status_code, b.headers["content-type"], b.json())


@pytest.mark.parametrize("headers", NOT_BROWSERS)
def test_slash_answers_other_clients_as_before(ready, headers):
    """curl and health checkers get what they got before the page existed: the API's 404 JSON."""
    with TestClient(create_app(ready.worker, ready.runtime.loaded, ready.config)) as with_page, \
            TestClient(create_app(ready.worker, ready.runtime.loaded,
                                  resolve("serve", flags_for("serve", no_webui=True), env={}))) as without:
        before = without.get("/", headers=headers)
        assert before.status_code == 404 and before.json()["error"]["type"] == "not_found_error"
        same_answer(with_page.get("/", headers=headers), before)


@pytest.mark.parametrize("headers", NOT_BROWSERS)
def test_slash_while_loading_and_with_a_key_as_before(headers):
    same_answer(client().get("/", headers=headers), client(no_webui=True).get("/", headers=headers))
    keyed, keyed_off = client(api_key="k"), client(api_key="k", no_webui=True)
    assert keyed.get("/", headers=headers).status_code == 401
    same_answer(keyed.get("/", headers=headers), keyed_off.get("/", headers=headers))


def test_no_webui_turns_it_off():
    web = client(no_webui=True)
    page = web.get("/", headers=BROWSER)
    assert page.status_code == 503 and page.json()["error"]["code"] == "model_loading"
    assert web.get("/webui/app.css").status_code == 503
    assert client(no_webui=True, api_key="k").get("/", headers=BROWSER).status_code == 401


def test_the_page_needs_no_key_but_the_api_does():
    web = client(api_key="secret")
    assert web.get("/", headers=BROWSER).status_code == 200
    assert web.get("/webui/js/api.js").status_code == 200
    assert web.get("/v1/models").status_code == 401
    assert web.get("/slots", headers={"Authorization": "Bearer secret"}).status_code == 503  # past the key: loading


@pytest.mark.parametrize(("env", "webui"), [({}, True), ({"LLAMA_ARG_NO_WEBUI": "1"}, False),
                                            ({"LLAMA_ARG_NO_WEBUI": "true"}, False), ({"LLAMA_ARG_NO_WEBUI": "0"}, True),
                                            ({"MLXCEL_NO_WEBUI": "on"}, False), ({"LLAMA_ARG_NO_WEBUI": ""}, True)])
def test_no_webui_from_the_environment(env, webui):
    assert resolve("serve", env=env).server.webui is webui
    assert resolve("serve", flags_for("serve", no_webui=True), env=env).server.webui is False


def test_bad_no_webui_value_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        resolve("serve", env={"LLAMA_ARG_NO_WEBUI": "maybe"})
    assert str(info.value) == ("LLAMA_ARG_NO_WEBUI must be one of 1, true, on, enabled, yes, 0, false, off, disabled, no"
                               " (got 'maybe')")


def test_the_flag_reaches_the_config(monkeypatch):
    seen = []
    monkeypatch.setattr(serving, "serve_forever", seen.append)
    for args, webui in ((["serve", "--port", "0"], True), (["serve", "--no-webui", "--port", "0"], False)):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert seen.pop().server.webui is webui


@pytest.mark.parametrize(("accept", "html"), [("text/html", True), ("TEXT/HTML; q=0.5", True), ("*/*", False),
                                              ("text/html;q=0", False), ("application/xhtml+xml", True)])
def test_accepts_html(accept, html):
    assert accepts_html([(b"accept", accept.encode())]) is html


def test_no_file_points_outside_the_server():
    for path in static_files():
        if path.suffix not in (".js", ".css", ".html"):
            continue  # licences and VERSIONS.json are never loaded by the page
        urls = set(URL.findall(path.read_text()))
        if "vendor" in path.relative_to(STATIC_DIR).parts:
            assert urls <= VENDOR_URLS, (path, urls - VENDOR_URLS)
        else:
            assert urls == set(), path


def test_vendored_versions_and_licences_are_recorded():
    import json

    versions = {v["name"]: v for v in json.loads((STATIC_DIR / "vendor" / "VERSIONS.json").read_text())}
    assert set(versions) == {"marked", "dompurify", "@highlightjs/cdn-assets"}
    for entry in versions.values():
        assert all((STATIC_DIR / "vendor" / f).is_file() for f in entry["files"])
    licences = {p.name for p in (STATIC_DIR / "vendor" / "LICENSES").iterdir()}
    assert licences == {"marked.txt", "dompurify.txt", "highlight.js.txt"}
    script = (ROOT / "scripts" / "build_webui_vendor.sh").read_text()
    for name, var in (("marked", "MARKED"), ("dompurify", "DOMPURIFY"), ("@highlightjs/cdn-assets", "HIGHLIGHT")):
        assert f"{var}={versions[name]['version']}\n" in script


def test_every_static_file_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["mlxcel_py.server.webui"]
    for path in static_files():
        rel = path.relative_to(STATIC_DIR.parent).as_posix()
        assert any(fnmatch(rel, p.replace("**/", "")) or fnmatch(rel, p) for p in patterns), rel
