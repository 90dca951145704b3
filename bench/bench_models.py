"""Several models behind one server: the time to first token of a cold model (its load included)
and of a resident one, and how two resident models share the cores while both decode.

    PYTHONPATH=$PWD python bench/bench_models.py [--runs 3] [--tokens 48] [--model PATH]

Serves the model twice, as `a` and `b` (two engines over the same file), on 127.0.0.1 port 0.
Prints one line per measurement; nothing is asserted (numbers depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import threading
import time

import httpx

from mlxcel_py.config import resolve
from mlxcel_py.server.app import create_app
from mlxcel_py.server.http.serving import bind_socket, make_server

PROMPT = "Write one sentence about the sea."


def _serve(path: str):
    from mlxcel_py.models.cpu.blas import preload_blas

    cfg = resolve("serve", env={}, port=0, model=f"a={path}", extra_models=(f"b={path}",), log_level="warning")
    preload_blas(cfg.blas)
    app = create_app(None, None, cfg)
    sock = bind_socket("127.0.0.1", 0)
    server = make_server(app, cfg)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, app.state.registry


def _ttft(client: httpx.Client, model: str, tokens: int = 1) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, tokens) of one greedy streamed completion."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "cache_prompt": False, "ignore_eos": True}
    start, first, count = time.perf_counter(), None, 0
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                first = first or time.perf_counter()
                count += 1
    return (first or time.perf_counter()) - start, time.perf_counter() - start, count


def _decode_rate(client: httpx.Client, model: str, tokens: int) -> float:
    ttft, total, count = _ttft(client, model, tokens)
    return (count - 1) / (total - ttft) if count > 1 and total > ttft else 0.0


def main() -> None:
    from mlxcel_py.models import default_model_path

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    url, server, _ = _serve(args.model or default_model_path())
    with httpx.Client(base_url=url, timeout=600) as client:
        cold, warm = [], []
        for _ in range(args.runs):
            cold.append(_ttft(client, "a")[0])  # loads a first
            warm += [_ttft(client, "a")[0] for _ in range(3)]
            client.post("/models/unload", json={"model": "a"}).raise_for_status()
        print(f"ttft cold (load included): median {statistics.median(cold):.2f} s  runs {[round(c, 2) for c in cold]}")
        print(f"ttft resident:             median {statistics.median(warm) * 1000:.0f} ms  runs "
              f"{[round(w * 1000) for w in warm]}")
        for name in ("a", "b"):
            client.post("/models/load", json={"model": name}).raise_for_status()
        _ttft(client, "a", 4), _ttft(client, "b", 4)  # warm both
        alone = statistics.median(_decode_rate(client, "a", args.tokens) for _ in range(args.runs))
        print(f"decode alone:        {alone:.1f} tok/s (model a, {args.tokens} tokens)")
        both = []
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(args.runs):
                both.append(list(pool.map(lambda m: _decode_rate(client, m, args.tokens), ["a", "b"])))
        a_rate = statistics.median(r[0] for r in both)
        b_rate = statistics.median(r[1] for r in both)
        print(f"decode both at once: a {a_rate:.1f} tok/s, b {b_rate:.1f} tok/s, sum {a_rate + b_rate:.1f} tok/s")
    server.should_exit = True


if __name__ == "__main__":
    main()
