"""Huge bodies next to a running stream: the stream and /health keep their cadence while
multi-megabyte bodies are refused (a defect once found on a child server)."""

import json
import threading
import time

import httpx

from server_helpers import wait_for
from stress_helpers import record, serving

BODIES = {
    "4MB_one_turn": json.dumps({"messages": [{"role": "user", "content": "The quick brown fox. " * 200_000}]}),
    "4MB_many_turns": json.dumps({"messages": [{"role": "user", "content": "hi"}] * 140_000}),
    "9MB_over_limit": "x" * (9 << 20),
}
ROUNDS = 3


def _stream(url: str, times: list, stop: threading.Event) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            times.append(time.perf_counter())
            if stop.is_set():
                return


def _health(url: str, latencies: list, stop: threading.Event) -> None:
    with httpx.Client(timeout=60) as client:
        for _ in range(100_000):
            if stop.is_set():
                return
            start = time.perf_counter()
            client.get(url + "/health")
            latencies.append((start, time.perf_counter() - start))
            time.sleep(0.02)


def _worst_gap(times: list, start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start][-1:]
    after = [t for t in times if t > end][:1]
    points = before + inside + after
    return max(b - a for a, b in zip(points, points[1:]))


def test_a_stream_and_health_keep_their_cadence(model_path):
    with serving(model_path, "-np", "2") as child:
        times, health, stop = [], [], threading.Event()
        threads = [threading.Thread(target=_stream, args=(child.url, times, stop)),
                   threading.Thread(target=_health, args=(child.url, health, stop))]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(times) > 50, 60, "the stream to run")
            quiet_start = time.perf_counter()
            time.sleep(2.0)
            quiet = _worst_gap(times, quiet_start, time.perf_counter())
            quiet_health = max(d for s, d in health if s >= quiet_start)
            figures = {"quiet_gap_s": round(quiet, 3), "quiet_health_s": round(quiet_health, 3)}
            for name, body in BODIES.items():
                gaps, healths, took = [], [], []
                for _ in range(ROUNDS):
                    start = time.perf_counter()
                    resp = httpx.post(child.url + "/v1/chat/completions", content=body, timeout=120,
                                      headers={"content-type": "application/json"})
                    end = time.perf_counter()
                    assert resp.status_code in (400, 413), resp.text
                    time.sleep(0.3)  # the stream's next frames bound the last gap
                    gaps.append(_worst_gap(times, start, end))
                    healths.append(max([d for s, d in health if start <= s <= end] or [0.0]))
                    took.append(end - start)
                figures |= {f"{name}_refused_in_s": round(max(took), 2), f"{name}_gap_s": round(max(gaps), 3),
                            f"{name}_health_s": round(max(healths), 3)}
                assert max(gaps) < quiet + 0.5 and max(healths) < quiet_health + 0.5, figures
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
    record("cadence", **figures)
