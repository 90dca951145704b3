"""Hostile and unlucky clients: huge bodies, clients that leave during a prefill, a shutdown
during streams. Each test is the regression test of one defect a hostile client found."""

import json
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, wait_for

CHUNK = 128  # small prefill pieces: an abandoned prompt has many left when its client goes
HUGE_CHAT = json.dumps({"messages": [{"role": "user", "content": "The quick brown fox. " * 200_000}]}).encode()
MANY_TURNS = json.dumps({"messages": [{"role": "user", "content": "hi"}] * 120_000}).encode()


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2, prefill_chunk_size=CHUNK)
    yield running
    stop_server(running)


def _post_raw(url, path, body: bytes, content_type="application/json"):
    import httpx

    return httpx.post(url + path, content=body, headers={"content-type": content_type}, timeout=60)


class Cadence:
    """Arrival times of a running stream's frames, read on a thread."""

    def __init__(self, client, body):
        self.times: list[float] = []
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client, body), daemon=True)
        self._thread.start()

    def _read(self, client, body):
        import httpx

        try:
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        self.times.append(time.perf_counter())
                    if self.stopping.is_set():
                        return  # leaving the block drops the connection: the server aborts the stream
        except httpx.TransportError:
            if not self.stopping.is_set():
                raise

    def worst_gap(self, start: float, end: float) -> float:
        inside = [t for t in self.times if start <= t] + [end]
        arrivals = [max(t for t in self.times if t < start)] + [t for t in inside if t <= end]
        return max(b - a for a, b in zip(arrivals, arrivals[1:]))

    def stop(self):
        self.stopping.set()
        self._thread.join(60)
        assert not self._thread.is_alive()


def test_a_huge_body_does_not_stall_a_stream(srv):
    body = {"prompt": "The quick brown fox", "max_tokens": 4000, "ignore_eos": True, "cache_prompt": False}
    with srv.client() as client:
        stream = Cadence(client, body)
        wait_for(lambda: len(stream.times) >= 40, 60, "the stream to get going")
        quiet_start = time.perf_counter()
        wait_for(lambda: stream.times[-1] - quiet_start > 1.0, 60, "a quiet second of the stream")
        quiet = stream.worst_gap(quiet_start, time.perf_counter())
        for raw in (HUGE_CHAT, MANY_TURNS):  # refused before tokenizing; refused after templating
            start = time.perf_counter()
            resp = _post_raw(srv.url, "/v1/chat/completions", raw)
            end = time.perf_counter()
            assert resp.status_code == 400 and error_of(resp)["code"] == "context_length_exceeded"
            busy = stream.worst_gap(start, end)
            # On the event loop, templating 120k turns stalled every stream for seconds.
            assert busy < quiet + 0.5, (raw[:40], quiet, busy, end - start)
        resp = _post_raw(srv.url, "/v1/chat/completions", b"x" * (9 << 20))
        assert resp.status_code == 413 and error_of(resp)["code"] == "request_too_large"
        wait_for(lambda: stream.times[-1] > end, 10, "the stream to go on")
        stream.stop()


def _counter(client, name, **labels) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@pytest.mark.parametrize("stream", [True, False])
def test_an_abandoned_prefill_stops_within_one_piece(srv, stream):
    num_tokens = 1500
    prompt = long_prompt(num_tokens)[::-1] if stream else long_prompt(num_tokens)  # no prompt-cache hit
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "cache_prompt": False, "stream": stream}).encode()
    host, port = srv.url.removeprefix("http://").split(":")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with srv.client() as client:
        before = srv.worker.stats().num_prompt_tokens
        aborts = _counter(client, "mlxcel_requests_total", finish_reason="abort")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(head + body)
            wait_for(lambda: srv.worker.stats().num_prompt_tokens - before >= CHUNK, 30, "the prefill to start")
        wait_for(lambda: _counter(client, "mlxcel_requests_total", finish_reason="abort") > aborts, 10,
                 "the server to notice the client left")
        at_notice = srv.worker.stats().num_prompt_tokens
        wait_for(lambda: srv.worker.stats().num_busy_slots == 0, 30, "the slot to be freed")
        done = srv.worker.stats().num_prompt_tokens
    # The piece running when the abort arrived finishes; the next one never starts.
    assert done <= at_notice + CHUNK
    assert done - before < num_tokens


def test_content_type_must_be_json(srv):
    body = b'{"prompt": "hi", "max_tokens": 2}'
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        resp = _post_raw(srv.url, "/v1/completions", body, media)
        assert resp.status_code == 415 and error_of(resp)["code"] == "unsupported_media_type", media
    for media in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"):
        assert _post_raw(srv.url, "/v1/completions", body, media).status_code == 200, media
    assert _post_raw(srv.url, "/tokenize", b'{"content": "hi"}', "text/plain").status_code == 415


def test_body_limit_without_content_length(srv):
    import httpx

    def pieces():  # chunked transfer encoding: no Content-Length to refuse early on
        for _ in range(20):
            yield b" " * (1 << 20)

    resp = httpx.post(srv.url + "/v1/completions", content=pieces(), timeout=60,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "8388608 bytes" in error_of(resp)["message"]


def test_lone_surrogate_is_named(srv):
    resp = _post_raw(srv.url, "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')
    assert resp.status_code == 400
    assert error_of(resp)["message"].startswith(r"malformed JSON body: invalid Unicode escape \ud800 at line 1")


def test_developer_is_system_and_tool_turns_are_accepted(srv):
    turn = {"role": "user", "content": "What is 6 times 7?"}
    with srv.client() as client:
        def reply(messages):
            resp = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, **GREEDY})
            assert resp.status_code == 200, resp.text
            return resp.json()

        system = reply([{"role": "system", "content": "Be brief."}, turn])
        developer = reply([{"role": "developer", "content": "Be brief."}, turn])
        assert developer["choices"] == system["choices"]
        # The same prompt: the second request reuses all of it but the last token from the prompt cache.
        assert developer["usage"]["prompt_tokens"] == system["usage"]["prompt_tokens"]
        assert developer["usage"]["prompt_tokens_details"]["cached_tokens"] == system["usage"]["prompt_tokens"] - 1
        call = {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
        tools = reply([turn, {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "42"}])
        words = client.post("/tokenize", json={"content": '<tool_call>\n{"name": "multiply", "arguments": '
                                               '{"a": 6, "b": 7}}\n</tool_call>'}).json()["tokens"]
        # The call is in the prompt (this template has no tool_calls support: written as text).
        assert tools["usage"]["prompt_tokens"] >= system["usage"]["prompt_tokens"] + len(words)
