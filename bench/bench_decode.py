"""Aggregate decode tokens/s through each server's HTTP API at 1 and 4 streams, same machine, same run.

    .venv/bin/python bench/bench_decode.py [--streams 1 4] [--window-s 10] [--rounds 3] [--arms ours mlx_lm llama]

Arms: `ours` (mlxcel-py serve, the default model, dense float32 on the CPU), `mlx_lm`
(mlx_lm.server on the dense float32 conversion of the same model, OpenBLAS preloaded with
the same kernels: bench/peers.py) and `llama` (llama-server on the default Q4_1 GGUF, where
installed). Each round starts N streams of a 32-token prompt (greedy, EOS ignored), waits
until every stream has two tokens, then counts the token frames all streams receive in a
window of `--window-s` seconds. Prints the median and range over rounds, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import peers  # noqa: E402

from mlxcel_py.bench.client import StreamLog, completion_body, new_client, stream_request  # noqa: E402
from mlxcel_py.bench.prompts import build_prompt, load_encoder, round_seed  # noqa: E402
from mlxcel_py.bench.servers import Arm, ManagedServer, ServerSpec, mlxcel_spec  # noqa: E402

PROMPT_TOKENS = 32


async def one_round(url: str, prompts: list[str], eos_ids: frozenset[int], window_s: float) -> float:
    """Aggregate token frames per second over the window in which every stream decodes."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        tasks = [asyncio.create_task(stream_request(client, url + "/v1/completions",
                                                    completion_body(p, 100_000, eos_ids=eos_ids), log, changed))
                 for p, log in zip(prompts, logs)]
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: all(len(g.token_times) >= 2 or g.ended for g in logs)), 600)
            if any(g.ended for g in logs):
                raise RuntimeError(f"a stream ended early: {[(g.finish_reason, g.error) for g in logs]}")
            start = time.perf_counter()
            await asyncio.sleep(window_s)
            end = time.perf_counter()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return sum(start <= t <= end for g in logs for t in g.token_times) / (end - start)


def spec_for(name: str, streams: int) -> ServerSpec:
    if name == "ours":
        return mlxcel_spec(Arm("ours"), streams, None)
    if name == "mlx_lm":
        return peers.mlx_lm_spec("mlx_lm", peers.ensure_converted(), None)
    binary = peers.llama_server_binary()
    if binary is None:
        raise RuntimeError("llama-server is not installed ($LLAMA_SERVER unset, none on PATH)")
    from mlxcel_py.models import default_model_path

    return peers.llama_server_spec("llama", binary, default_model_path(), 512, streams)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["ours", "mlx_lm", "llama"], choices=["ours", "mlx_lm", "llama"])
    args = ap.parse_args()
    encode, eos_ids = load_encoder(None)
    print(f"load average at start {os.getloadavg()[0]:.2f}; window {args.window_s:.0f} s, {args.rounds} rounds")
    print(f"| server | streams | tok/s median | range | load |\n|---|---:|---:|---:|---:|", flush=True)
    for name in args.arms:
        for streams in args.streams:
            try:
                with ManagedServer(spec_for(name, streams)) as server:
                    rates = []
                    for r in range(-1, args.rounds):  # round -1 warms the server up
                        prompts = [build_prompt(encode, PROMPT_TOKENS, round_seed(0, r, "decode", i)) for i in range(streams)]
                        rate = asyncio.run(one_round(server.spec.url, prompts, eos_ids, args.window_s if r >= 0 else 2.0))
                        if r >= 0:
                            rates.append(rate)
            except RuntimeError as exc:
                print(f"| {name} | {streams} | not run: {str(exc).splitlines()[0]} | | |", flush=True)
                continue
            print(f"| {name} | {streams} | {statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} "
                  f"| {os.getloadavg()[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
