"""Many clients at once: a 32-client soak (nothing lost, memory flat) and a burst over the
queue limit (every reply a 200 or a clean 429)."""

import asyncio
import json
import time

import httpx

from stress_helpers import record, rss_mib, serving

CLIENTS, ROUNDS = 32, 20
REQUEST_TIMEOUT_S = 120
SOAK_TIMEOUT_S = 900


def _body(client: int, n: int, stream: bool, chat: bool) -> dict:
    text = f"Client {client} asks question {n}: what is the capital of France?"
    body = {"max_tokens": 16, "temperature": 0.7, "seed": client * 1000 + n, "stream": stream}
    return {**body, "messages": [{"role": "user", "content": text}]} if chat else {**body, "prompt": text}


def _complete(chat: bool, stream: bool, resp: httpx.Response, lines: list[str]) -> bool:
    """Whether a reply is whole: a finish reason, usage, and for a stream one finish chunk and [DONE]."""
    if resp.status_code != 200:
        return False
    if not stream:
        body = resp.json()
        return body["choices"][0]["finish_reason"] in ("stop", "length") and body["usage"]["completion_tokens"] <= 16
    if not lines or lines[-1] != "[DONE]":
        return False
    chunks = [json.loads(line) for line in lines[:-1]]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    return finishes in (["stop"], ["length"]) and (not chat or chunks[0]["choices"][0]["delta"]["role"] == "assistant")


async def _one(http: httpx.AsyncClient, client: int, n: int, latencies: list[float]) -> bool:
    chat, stream = n % 2 == 0, (n // 2) % 2 == 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    start = time.perf_counter()
    try:
        async with http.stream("POST", path, json=_body(client, n, stream, chat)) as resp:
            if stream:
                lines = [line[6:] async for line in resp.aiter_lines() if line.startswith("data: ")]
            else:
                lines = []
                await resp.aread()
    except httpx.HTTPError:
        return False
    latencies.append(time.perf_counter() - start)
    return _complete(chat, stream, resp, lines)


async def _soak(url: str, rounds: range, latencies: list[float]) -> list[bool]:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        async def client(i: int) -> list[bool]:
            return [await _one(http, i, n, latencies) for n in rounds]

        results = await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return [ok for per_client in results for ok in per_client]


def test_soak_32_clients(model_path):
    with serving(model_path, "-np", "4", "--max-queue", "64") as child:
        asyncio.run(asyncio.wait_for(_soak(child.url, range(2), []), SOAK_TIMEOUT_S))  # warm-up
        before = rss_mib(child.proc.pid)
        latencies: list[float] = []
        start = time.perf_counter()
        first = asyncio.run(asyncio.wait_for(_soak(child.url, range(ROUNDS // 2), latencies), SOAK_TIMEOUT_S))
        middle = rss_mib(child.proc.pid)
        second = asyncio.run(asyncio.wait_for(_soak(child.url, range(ROUNDS // 2, ROUNDS), latencies), SOAK_TIMEOUT_S))
        seconds = time.perf_counter() - start
        after = rss_mib(child.proc.pid)
        metrics = httpx.get(child.url + "/metrics", timeout=10).text
    oks = first + second
    latencies.sort()
    record("soak", clients=CLIENTS, requests=len(oks), lost=oks.count(False), seconds=round(seconds, 1),
           requests_per_s=round(len(oks) / seconds, 2), p50_s=round(latencies[len(latencies) // 2], 2),
           p99_s=round(latencies[int(len(latencies) * 0.99)], 2), rss_before_mib=round(before),
           rss_middle_mib=round(middle), rss_after_mib=round(after))
    assert len(oks) == CLIENTS * ROUNDS and oks.count(False) == 0
    assert 'mlxcel_requests_rejected_total{status="429"}' not in metrics
    assert after - middle < 64, (before, middle, after)  # flat once warm: no per-request leak


BURST, SLOTS, QUEUE = 20, 2, 4


async def _burst(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        bodies = [{"prompt": f"Burst request {i}:", "max_tokens": 500, "ignore_eos": True} for i in range(BURST)]
        return await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))


def test_burst_over_the_queue_limit(model_path):
    with serving(model_path, "-np", str(SLOTS), "--max-queue", str(QUEUE)) as child:
        start = time.perf_counter()
        replies = asyncio.run(asyncio.wait_for(_burst(child.url), SOAK_TIMEOUT_S))
        seconds = time.perf_counter() - start
    ok = [r for r in replies if r.status_code == 200]
    busy = [r for r in replies if r.status_code == 429]
    record("burst", requests=BURST, slots=SLOTS, max_queue=QUEUE, ok=len(ok), refused_429=len(busy),
           other=BURST - len(ok) - len(busy), seconds=round(seconds, 1))
    assert len(ok) + len(busy) == BURST
    assert all(r.json()["usage"]["completion_tokens"] == 500 for r in ok)
    for r in busy:
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "server_busy"
    assert len(ok) == SLOTS + QUEUE  # the burst arrives long before the first 500-token reply is done
