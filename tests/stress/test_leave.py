"""Clients that leave: a disconnect storm (every slot idle afterwards, no prefill left
running) and SIGTERM with streams in flight (every stream ends with [DONE], exit 0)."""

import asyncio
import json
import random
import signal
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import long_prompt, wait_for
from stress_helpers import record, serving

STORM, STORM_SLOTS, CHUNK = 48, 4, 64


def _metric(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _plan(i: int, rng: random.Random) -> tuple[str, dict, float]:
    """A request with a long prompt (chat or not, streaming or not) and when its client leaves."""
    chat, stream = rng.random() < 0.5, rng.random() < 0.5
    text = " ".join([f"{i}"] + [str(t) for t in long_prompt(rng.randint(100, 600))])
    body = {"max_tokens": 400, "ignore_eos": True, "stream": stream, "cache_prompt": False}
    body |= {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, rng.uniform(0.2, 4.0)


async def _leave(http: httpx.AsyncClient, path: str, body: dict, after_s: float) -> int:
    """One request, given up after `after_s`: its status if it had an answer by then, else 0."""
    try:
        return (await asyncio.wait_for(http.post(path, json=body), after_s)).status_code
    except asyncio.TimeoutError:
        return 0  # the cancelled request's connection is closed: the server sees the client leave


async def _storm(url: str, plans: list) -> list[int]:
    limits = httpx.Limits(max_connections=STORM, max_keepalive_connections=0)  # one connection per request
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        return await asyncio.gather(*(_leave(http, *plan) for plan in plans))


def _idle(url: str) -> bool:
    slots = httpx.get(url + "/slots", timeout=10).json()
    return all(s["state"] == "idle" for s in slots) and _metric(url, "mlxcel_queue_depth") == 0


def test_disconnect_storm_leaves_every_slot_idle(model_path):
    with serving(model_path, "-np", str(STORM_SLOTS), "--prefill-chunk-size", str(CHUNK)) as child:
        url = child.url
        rng = random.Random(7)
        plans = [_plan(i, rng) for i in range(STORM)]
        start = time.perf_counter()
        statuses = asyncio.run(asyncio.wait_for(_storm(url, plans), 120))
        left = time.perf_counter()
        wait_for(lambda: _idle(url), 60, "every slot to be idle after the storm")
        to_idle = time.perf_counter() - left
        tokens = _metric(url, "mlxcel_prompt_tokens_total")
        time.sleep(2.0)  # requests still being tokenized when their client left must not reach the engine
        still = _metric(url, "mlxcel_prompt_tokens_total") - tokens
        assert _idle(url)
        aborted = _metric(url, "mlxcel_requests_total", finish_reason="abort")
        submitted = sum(_metric(url, "mlxcel_requests_total", finish_reason=r) for r in ("stop", "length", "abort"))
        after = httpx.post(url + "/v1/completions", json={"prompt": "Still there?", "max_tokens": 4}, timeout=60)
    record("disconnect_storm", clients=STORM, slots=STORM_SLOTS, left_early=statuses.count(0),
           answered=sorted(set(statuses) - {0}),
           reached_engine=int(submitted), aborted=int(aborted), storm_s=round(left - start, 1),
           idle_after_s=round(to_idle, 2), prompt_tokens_after_idle=int(still))
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
    assert still == 0  # no abandoned prefill kept running
    # Everything that reached the engine and was left is counted as aborted (the rest left
    # while their body was still being read or prepared, before submission).
    assert aborted == submitted - statuses.count(200) and aborted > 0
    assert set(statuses) <= {0, 200, 400}  # 400: a prompt over the context, refused before the engine


GRACE_S, LONG, SHORT = 4.0, 8, 4


def _stream(url: str, max_tokens: int, out: list, first: threading.Event) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                if len(out) >= 3:
                    first.set()


def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT",), ("SIGINT", "SIGINT")], ids="+".join)
def test_signal_with_streams_in_flight(model_path, signals):
    with serving(model_path, "-np", str(LONG + SHORT), "--shutdown-grace", str(GRACE_S)) as child:
        url = child.url
        streams = [([], threading.Event(), 100_000 if i < LONG else 40) for i in range(LONG + SHORT)]
        readers = [threading.Thread(target=_stream, args=(url, n, out, first)) for out, first, n in streams]
        for reader in readers:
            reader.start()
        for _, first, _ in streams:
            assert first.wait(60)
        signalled = time.perf_counter()
        child.proc.send_signal(getattr(signal, signals[0]))
        wait_for(lambda: _refused(url), 5, "the listening socket to close")
        for name in signals[1:]:  # a second Ctrl-C quits at once: every stream is cut now
            child.proc.send_signal(getattr(signal, name))
        for reader in readers:
            reader.join(GRACE_S + 30)
        assert child.proc.wait(60) == 0
        exited = time.perf_counter() - signalled
    finishes = [json.loads(out[-3] if out[-2].startswith('{"error"') else out[-2])["choices"][0]["finish_reason"]
                for out, _, _ in streams]
    record("+".join(signals), streams=len(streams), done=sum(out[-1] == "[DONE]" for out, _, _ in streams),
           finished_in_grace=finishes.count("length"), cut=finishes.count("abort"), grace_s=GRACE_S,
           exit_after_s=round(exited, 2), exit_code=0)
    assert all(out[-1] == "[DONE]" for out, _, _ in streams)
    assert finishes[:LONG] == ["abort"] * LONG
    for out, _, _ in streams[:LONG]:
        assert json.loads(out[-2])["error"]["code"] == "server_shutting_down"
    assert set(finishes[LONG:]) <= {"length", "abort"}
    assert exited < (GRACE_S if len(signals) == 1 else 0) + 5
