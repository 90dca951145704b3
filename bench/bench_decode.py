"""Aggregate decode tokens/s through each server's HTTP API at 1 and 4 streams, same machine, same run.

    .venv/bin/python bench/bench_decode.py [--streams 1 4] [--window-s 10] [--rounds 3] [--arms ours mlx_lm llama]

Arms: `ours` (mlxcel-py serve, the default model, dense float32 on the CPU), `mlx_lm`
(mlx_lm.server on the dense float32 conversion of the same model, OpenBLAS preloaded with
the same kernels: bench/peers.py) and `llama` (llama-server on the default Q4_1 GGUF, where
installed, -t 2 -b 512), each also with its threads tamed for a busy machine (see spec_for).
All servers of a stream count run at once and take turns within each round, so load swings
hit every arm alike. A turn starts N streams of a 32-token prompt (greedy, EOS ignored), waits
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
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import peers  # noqa: E402

from mlxcel_py.loadtest.client import StreamLog, completion_body, new_client, stream_request  # noqa: E402
from mlxcel_py.loadtest.prompts import build_prompt, load_encoder, round_seed  # noqa: E402
from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, mlxcel_spec  # noqa: E402

PROMPT_TOKENS = 32


async def one_round(url: str, prompts: list[str], eos_ids: frozenset[int], window_s: float) -> float:
    """Aggregate token frames per second over the window in which every stream decodes."""
    logs = [StreamLog() for _ in prompts]
    changed = asyncio.Condition()
    async with new_client() as client:
        tasks = [asyncio.create_task(stream_request(client, url + "/v1/completions",
                                                    completion_body(p, 4096, eos_ids=eos_ids), log, changed))
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


ARMS = ("ours", "mlx_lm", "mlx_lm-1t", "llama", "llama-passive", "llama-t1")


def spec_for(name: str, streams: int) -> ServerSpec:
    """The server of an arm. `-1t`: OpenBLAS on one thread; `-passive`: OpenMP threads that
    sleep instead of spinning at barriers; `-t1`: llama-server on one thread. (On a busy
    2-core machine spinning threads collapse: docs/CPU_DECODE.md.)"""
    if name == "ours":
        return mlxcel_spec(Arm("ours"), streams, None)
    if name.startswith("mlx_lm"):
        spec = peers.mlx_lm_spec(name, peers.ensure_converted(), None)
        return replace(spec, env={**spec.env, "OPENBLAS_NUM_THREADS": "1"}) if name.endswith("-1t") else spec
    binary = peers.llama_server_binary()
    if binary is None:
        raise RuntimeError("llama-server is not installed ($LLAMA_SERVER unset, none on PATH)")
    from mlxcel_py.models import default_model_path

    spec = peers.llama_server_spec(name, binary, default_model_path(), 512, streams)
    if name == "llama-passive":
        return replace(spec, env={**spec.env, "OMP_WAIT_POLICY": "passive"})
    if name == "llama-t1":
        argv = list(spec.argv)
        argv[argv.index("-t") + 1] = "1"
        return replace(spec, argv=tuple(argv))
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = ap.parse_args()
    encode, eos_ids = load_encoder(None)
    print(f"load average at start {os.getloadavg()[0]:.2f}; window {args.window_s:.0f} s, {args.rounds} rounds, "
          "arms alternating within each round")
    print("| server | streams | tok/s median | range | load during |\n|---|---:|---:|---:|---:|", flush=True)
    for streams in args.streams:
        with ExitStack() as stack:
            servers, rates, loads = {}, {name: [] for name in args.arms}, {name: [] for name in args.arms}
            for name in args.arms:  # all up at once, so every round meets the same machine load
                try:
                    servers[name] = stack.enter_context(ManagedServer(spec_for(name, streams))).spec.url
                except RuntimeError as exc:
                    print(f"| {name} | {streams} | not run: {str(exc).splitlines()[0]} | | |", flush=True)
            for r in range(-1, args.rounds):  # round -1 warms every server up
                prompts = [build_prompt(encode, PROMPT_TOKENS, round_seed(0, r, "decode", i)) for i in range(streams)]
                for name, url in servers.items():
                    rate = asyncio.run(one_round(url, prompts, eos_ids, args.window_s if r >= 0 else 2.0))
                    if r >= 0:
                        rates[name].append(rate)
                        loads[name].append(os.getloadavg()[0])
        for name in servers:
            v = rates[name]
            print(f"| {name} | {streams} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} "
                  f"| {min(loads[name]):.1f}-{max(loads[name]):.1f} |", flush=True)


if __name__ == "__main__":
    main()
