"""Aggregate decode tok/s of the engine next to mlx-lm's BatchGenerator, same model, same run.

Usage: .venv/bin/python bench/bench_engine.py [--model PATH] [--tokens 64] [--concurrency 1 4 8]
Prints one row per concurrency: ours, BatchGenerator, the ratio, and the engine's per-tick
overhead (step time minus the runner's model calls).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import BatchGenerator  # noqa: E402

from mlxcel_py.config import resolve  # noqa: E402
from mlxcel_py.engine import build_engine  # noqa: E402
from mlxcel_py.engine import Finished, Request, SamplingParams  # noqa: E402
from mlxcel_py.models import encode_chat, load_model  # noqa: E402

TOPICS = ["the sea", "a dragon", "Paris", "bread", "rain", "chess", "the moon", "a robot", "music", "winter"]


def prompts(lm, n: int) -> list[tuple[int, ...]]:
    return [encode_chat(lm.tokenizer, [{"role": "user", "content": f"Write a story about {TOPICS[i % 10]}."}]).ids for i in range(n)]


def run_ours(lm, ps, tokens: int) -> tuple[float, float]:
    """(aggregate decode tok/s while all decode, mean non-model ms per decode tick)."""
    cfg = resolve("serve", env={}, parallel=len(ps), prompt_cache=False)
    engine = build_engine(cfg.engine, lm)
    model_time = [0.0]
    execute = engine.runner.execute

    def timed(step):
        t = time.perf_counter()
        out = execute(step)
        if step.decode:
            model_time[0] += time.perf_counter() - t
        return out

    engine.runner.execute = timed
    for i, p in enumerate(ps):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=tokens, ignore_eos=True), cache_prompt=False))
    while engine.scheduler.waiting or engine.scheduler.prefilling:  # admit and prefill everyone first
        engine.step()
    model_time[0], steps, done = 0.0, 0, 0
    generated_before = engine.stats().num_generated_tokens
    start = time.perf_counter()
    while engine.has_work():
        events = engine.step()
        steps += 1
        done += sum(isinstance(e, Finished) for e in events)
    elapsed = time.perf_counter() - start
    generated = engine.stats().num_generated_tokens - generated_before
    return generated / elapsed, (elapsed - model_time[0]) / steps * 1000.0


def run_batch_generator(lm, ps, tokens: int) -> float:
    gen = BatchGenerator(lm.model, max_tokens=tokens, completion_batch_size=len(ps), prefill_batch_size=len(ps))
    gen.insert([list(p) for p in ps], max_tokens=[tokens] * len(ps))
    first = gen.next_generated()  # prefill and the first token of everyone
    count, start = 0, time.perf_counter()
    remaining = len(ps) - sum(r.finish_reason is not None for r in first)
    while remaining:
        responses = gen.next_generated()
        count += len(responses)
        remaining -= sum(r.finish_reason is not None for r in responses)
    elapsed = time.perf_counter() - start
    gen.close()
    return count / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    lm = load_model(args.model)
    print(f"model: {lm.description}")
    print(f"{'seqs':>4} {'ours tok/s':>11} {'BatchGenerator':>15} {'ratio':>6} {'overhead ms/tick':>17}")
    for c in args.concurrency:
        ps = prompts(lm, c)
        run_ours(lm, ps, 8)  # warm-up
        ours, overhead = run_ours(lm, ps, args.tokens)
        theirs = run_batch_generator(lm, ps, args.tokens)
        print(f"{c:>4} {ours:>11.1f} {theirs:>15.1f} {ours / theirs:>6.2f} {overhead:>17.2f}")
        mx.clear_cache()


if __name__ == "__main__":
    main()
