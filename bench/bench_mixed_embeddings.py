"""A mixed load: four chat streams decoding while 32 embedding requests of 300 tokens arrive.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_mixed_embeddings.py [--model M] [--streams 4] [--embeddings 32]
        [--tokens 300] [--parallel 8] [--json out.json]

One `serve` (default flags, --parallel 8: four slots decode, the others embed). Measured, in order:
- each embedding computed alone (one request at a time, nothing decoding);
- the contended figure: the streams' quiet inter-token p95 plus the time of one lone prefill piece of the
  chunk policy's contended size (512 tokens, an embedding of that length), i.e. what a tick holding one
  decode step and one full contended piece costs;
- the mixed run: the streams decoding, all embeddings sent at once; the worst stream's inter-token p95
  over the embeddings' span, against the figure; every embedding compared with its alone vector.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_vs_llama_server import machine  # noqa: E402

from mlxcel_py.loadtest.admit import warm_up  # noqa: E402
from mlxcel_py.loadtest.client import StreamLog, completion_body, new_client, stream_request  # noqa: E402
from mlxcel_py.loadtest.prompts import build_prompt, load_encoder, round_seed  # noqa: E402
from mlxcel_py.loadtest.servers import Arm, ManagedServer, mlxcel_spec  # noqa: E402
from mlxcel_py.loadtest.stats import itls_overlapping, itls_within, percentile  # noqa: E402

CONTENDED_CHUNK = 512  # the policy's chunk while another sequence decodes (docs/CONTINUOUS_BATCHING.md)
QUIET_S = 5.0


async def embed(client: httpx.AsyncClient, url: str, text: str) -> tuple[np.ndarray, float, float]:
    """(vector, sent, done) of one /v1/embeddings request."""
    sent = time.perf_counter()
    reply = await client.post(url + "/v1/embeddings", json={"input": text, "encoding_format": "float"})
    reply.raise_for_status()
    return np.array(reply.json()["data"][0]["embedding"]), sent, time.perf_counter()


async def alone(url: str, texts: list[str]) -> list[np.ndarray]:
    """Every text embedded alone, one request at a time."""
    async with httpx.AsyncClient(timeout=600) as client:
        return [(await embed(client, url, t))[0] for t in texts]


async def piece_ms(url: str, text: str, rounds: int = 3) -> float:
    """Median latency of embedding `text` alone (one prefill piece when it fits the chunk)."""
    times = []
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(rounds):
            _, sent, done = await embed(client, url, text)
            times.append((done - sent) * 1000)
    return float(np.median(times))


async def mixed(url: str, prompts: list[str], texts: list[str], eos_ids: frozenset[int],
                quiet_s: float) -> dict:
    """Streams decode; quiet window; then every embedding at once; streams run until the last is back."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        tasks = [asyncio.create_task(stream_request(client, url + "/v1/completions",
                                                    completion_body(p, 3000, eos_ids=eos_ids), log, changed))
                 for p, log in zip(prompts, logs)]
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: all(len(g.token_times) >= 2 for g in logs)), 600)
            quiet_start = time.perf_counter()
            await asyncio.sleep(quiet_s)
            quiet_end = time.perf_counter()
            got = await asyncio.gather(*(embed(client, url, t) for t in texts))
            if any(g.ended for g in logs):
                raise RuntimeError(f"a stream ended during the run: {[(g.finish_reason, g.error) for g in logs]}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    start, end = min(g[1] for g in got), max(g[2] for g in got)
    quiet = [percentile(itls_within(g.token_times, quiet_start, quiet_end), 95) * 1000 for g in logs]
    loaded = [percentile(itls_overlapping(g.token_times, start, end), 95) * 1000 for g in logs]
    return {"vectors": [g[0] for g in got], "quiet_p95_ms": quiet, "mixed_p95_ms": loaded,
            "embeddings_span_s": end - start}


def run(args: argparse.Namespace) -> dict:
    encode, eos_ids = load_encoder(args.model)
    texts = [build_prompt(encode, args.tokens, round_seed(0, 0, "embed", i)) for i in range(args.embeddings)]
    prompts = [build_prompt(encode, 32, round_seed(0, 0, "stream", i)) for i in range(args.streams)]
    spec = mlxcel_spec(Arm("ours"), args.parallel, args.model)
    with ManagedServer(spec, health_timeout_s=600) as server:
        url = server.spec.url
        asyncio.run(warm_up(url, encode, eos_ids, 0))
        t0 = time.perf_counter()
        solo = asyncio.run(alone(url, texts))
        print(f"{len(texts)} embeddings alone: {time.perf_counter() - t0:.1f} s", flush=True)
        piece = asyncio.run(piece_ms(url, build_prompt(encode, CONTENDED_CHUNK, round_seed(0, 0, "piece"))))
        print(f"a lone {CONTENDED_CHUNK}-token piece: {piece:.0f} ms", flush=True)
        got = asyncio.run(mixed(url, prompts, texts, eos_ids, args.quiet_s))
    diffs = [float(np.abs(a - b).max()) for a, b in zip(got.pop("vectors"), solo)]
    figure = max(got["quiet_p95_ms"]) + piece
    return {**got, "piece_512_ms": piece, "contended_figure_ms": figure,
            "worst_mixed_p95_ms": max(got["mixed_p95_ms"]), "within_figure": max(got["mixed_p95_ms"]) <= figure,
            "max_abs_diff_vs_alone": max(diffs), "all_equal_alone": max(diffs) <= 1e-5}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF or mlx-lm directory (default: the bundled model)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--embeddings", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--quiet-s", type=float, default=QUIET_S)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    # A SIGTERM (timeout, Ctrl-C's cousin) unwinds, so the server started here is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(machine(), flush=True)
    result = run(args)
    print(f"end: {machine()}")
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
