"""More requests than slots, a full queue, and clients that go away mid-request."""

import asyncio
import json
import socket

import httpx
import pytest

from server_helpers import GREEDY, error_of, start_server, stop_server, wait_for


@pytest.fixture(scope="module")
def two_slots():
    running = start_server(parallel=2)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def one_slot():
    running = start_server(parallel=1, max_queue=1)
    yield running
    stop_server(running)


PROMPTS = [f"Request number {i}: the quick brown fox" for i in range(6)]
LONG = {"prompt": "hello", "max_tokens": 3000, "ignore_eos": True, "cache_prompt": False}


def _body(prompt):
    return {"prompt": prompt, "max_tokens": 16, "ignore_eos": True, "cache_prompt": False, **GREEDY}


async def _run_all(url, bodies):
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json()["choices"][0]["text"] for r in responses]


def test_more_requests_than_slots_match_one_at_a_time(two_slots):
    bodies = [_body(p) for p in PROMPTS]
    with two_slots.client() as client:
        single = [client.post("/v1/completions", json=b).json()["choices"][0]["text"] for b in bodies]
    together = asyncio.run(_run_all(two_slots.url, bodies))
    assert together == single


def _idle(client):
    return all(s["state"] == "idle" for s in client.get("/slots").json())


def _first_text(response):
    """Read up to the first generated text; the caller keeps the returned iterator alive.

    (Dropping a half-read httpx line iterator closes the connection, i.e. disconnects.)"""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
            return lines


def test_stream_disconnect_frees_the_slot(one_slot):
    with one_slot.client() as client:
        with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp:
            reading = _first_text(resp)
            assert not _idle(client)
            del reading  # closing the half-read stream drops the connection
        wait_for(lambda: _idle(client), 10, "the aborted stream's slot to be freed")
        resp = client.post("/v1/completions", json={"prompt": "after", "max_tokens": 3})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
        assert 'mlxcel_requests_total{finish_reason="abort"}' in client.get("/metrics").text


def test_non_streaming_disconnect_frees_the_slot(one_slot):
    host, port = one_slot.url.removeprefix("http://").split(":")
    body = json.dumps(LONG).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with one_slot.client() as client:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_for(lambda: not _idle(client), 10, "the request to start")
        wait_for(lambda: _idle(client), 10, "the abandoned request's slot to be freed")


def test_full_queue_is_429_with_retry_after(one_slot):
    with one_slot.client() as client, one_slot.client() as waiting_client:
        with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as running:
            reading = _first_text(running)  # noqa: F841 (kept alive: see _first_text)
            with waiting_client.stream("POST", "/v1/completions", json={**LONG, "stream": True}):
                wait_for(lambda: one_slot.worker.stats().num_waiting == 1, 10, "a queued request")
                resp = client.post("/v1/completions", json={"prompt": "no room", "max_tokens": 2})
                assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
                assert error_of(resp)["code"] == "server_busy"
        wait_for(lambda: _idle(client) and one_slot.worker.stats().num_waiting == 0, 10, "everything aborted")
        assert 'mlxcel_requests_rejected_total{status="429"} 1' in client.get("/metrics").text
