"""CORS: loopback origins by default, --cors-origins widens it, preflights never need the key,
and every answer (401, 404, 500 included) carries the headers a browser needs to read it."""

import pytest

from mlxcel_py.server.http.cors import origin_pattern
from server_helpers import error_of, start_server, stop_server

KEY = "s3cret"
CHAT = "/v1/chat/completions"
MSG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ALLOWED = ("http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8000", "https://localhost")
REFUSED = ("http://evil.example", "http://localhost.evil.example:80", "http://127.0.0.1.nip.io", "null")


def preflight(client, origin, path=CHAT, headers="content-type, authorization, x-api-key"):
    return client.options(path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                         "Access-Control-Request-Headers": headers})


@pytest.fixture(scope="module")
def keyed_srv():
    running = start_server(parallel=1, api_key=KEY)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def keyed(keyed_srv):
    with keyed_srv.client() as client:
        yield client


@pytest.mark.parametrize("origin", ALLOWED)
def test_preflight_from_a_loopback_origin_needs_no_key(keyed, origin):
    resp = preflight(keyed, origin)
    assert resp.status_code == 200
    assert resp.headers["access-control-allow-origin"] == origin
    assert "POST" in resp.headers["access-control-allow-methods"]
    assert resp.headers["access-control-allow-headers"] == "content-type, authorization, x-api-key"
    assert "origin" in resp.headers["vary"].lower()


@pytest.mark.parametrize("origin", REFUSED)
def test_preflight_from_another_origin_is_refused(keyed, origin):
    """As llama-server: 200 without Access-Control-Allow-Origin, so the browser refuses the call."""
    resp = preflight(keyed, origin)
    assert resp.status_code == 200 and resp.content == b""
    assert not any(name.startswith("access-control-") for name in resp.headers)


def test_preflight_for_a_method_we_lack_gets_the_error_json(keyed):
    resp = keyed.options(CHAT, headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "PUT"})
    assert resp.status_code == 400
    error = error_of(resp)
    assert error["code"] == "cors_refused" and "http://localhost:5173" in error["message"]


def test_answers_carry_the_headers_even_errors(keyed):
    origin = {"Origin": "http://localhost:5173"}
    auth = {"Authorization": f"Bearer {KEY}", **origin}
    cases = [
        keyed.get("/v1/models", headers=origin),  # 401: no key
        keyed.get("/v1/models", headers=auth),  # 200
        keyed.get("/nope", headers=auth),  # 404
        keyed.post(CHAT, json={"messages": []}, headers=auth),  # 400
        keyed.post("/v1/messages", json={}, headers={"x-api-key": KEY, **origin}),  # 400, Anthropic-shaped
    ]
    assert [r.status_code for r in cases] == [401, 200, 404, 400, 400]
    assert all(r.headers["access-control-allow-origin"] == origin["Origin"] for r in cases)
    assert "Retry-After" in cases[0].headers["access-control-expose-headers"]
    assert keyed.get("/v1/models", headers={**auth, "Origin": "http://evil.example"}).headers.get(
        "access-control-allow-origin") is None


def test_a_bug_is_a_500_with_cors_headers(keyed, keyed_srv):
    runtime = keyed_srv.runtime
    worker = runtime.worker

    class Broken:
        def stats(self):
            raise RuntimeError("boom")

    runtime.worker = Broken()
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Origin": "http://localhost:5173"}
        resp = keyed.get("/slots", headers=headers)
        props = keyed.get("/props", headers=headers)
    finally:
        runtime.worker = worker
    for got in (resp, props):
        assert got.status_code == 500 and got.headers["access-control-allow-origin"] == "http://localhost:5173"
        error = error_of(got)
        assert error["code"] == "internal_error" and "request id req-" in error["message"]


@pytest.fixture(scope="module")
def wide():
    running = start_server(parallel=1, cors_origins="http://ui.example:3000,http://10.0.0.5:*")
    with running.client() as client:
        yield client
    stop_server(running)


def test_listed_origins_and_port_wildcards(wide):
    for origin in ("http://ui.example:3000", "http://10.0.0.5:1234", "http://localhost:8080"):
        resp = preflight(wide, origin)
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == origin
    for origin in ("http://ui.example:3001", "https://ui.example:3000", "http://10.0.0.50:1234"):
        resp = preflight(wide, origin)
        assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


def test_star_allows_any_site():
    running = start_server(parallel=1, cors_origins="*")
    try:
        with running.client() as client:
            resp = preflight(client, "http://evil.example")
            assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*"
            got = client.get("/health", headers={"Origin": "http://evil.example"})
            assert got.headers["access-control-allow-origin"] == "*"
    finally:
        stop_server(running)


@pytest.mark.parametrize(("origin", "ok"), [
    ("http://localhost", True), ("http://localhost:1", True), ("https://127.0.0.1:443", True),
    ("http://[::1]", True), ("http://localhost:", False), ("http://localhostx", False), ("ws://localhost", False),
    ("http://127.0.0.2", False), ("http://localhost:80/x", False),
])
def test_loopback_pattern(origin, ok):
    import re

    assert bool(re.fullmatch(origin_pattern(()), origin)) is ok


def test_the_localhost_keyword_names_the_loopback_origins():
    """llama-server's `--cors-origins localhost`: the loopback origins, any port; nothing else."""
    running = start_server(parallel=1, cors_origins="localhost")
    try:
        with running.client() as client:
            for origin in ALLOWED:
                assert preflight(client, origin).headers.get("access-control-allow-origin") == origin
            assert "access-control-allow-origin" not in preflight(client, "http://evil.example").headers
    finally:
        stop_server(running)
