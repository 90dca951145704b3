"""One-shot generation: our engine (what `mlxcel-py generate` runs) next to mlx-lm's own
`stream_generate`, on the same weights in the same process, alternating, best of N.

Usage: .venv/bin/python bench/bench_generate.py [--prompt-tokens 512] [--max-tokens 128] [--rounds 3]
Prints prompt tok/s, generation tok/s and TTFT for both. The stock path (quantized weights,
reference BLAS) is measured by bench/bench_fast_path.py, in its own process.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import stream_generate  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402

from mlxcel_py.config import resolve  # noqa: E402
from mlxcel_py.engine import build_engine  # noqa: E402
from mlxcel_py.engine import Finished, Request, SamplingParams  # noqa: E402
from mlxcel_py.engine.core.worker import EngineWorker  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402


def ours(lm, ids: list[int], max_tokens: int) -> tuple[float, float, float]:
    cfg = resolve("generate", env={}, max_tokens=max_tokens)
    worker = EngineWorker(build_engine(cfg.engine, lm)).start()
    try:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        done = [e for e in worker.submit(Request("bench", tuple(ids), params, cache_prompt=False))][-1]
    finally:
        worker.stop()
    assert isinstance(done, Finished) and done.usage.completion_tokens == max_tokens
    return done.timings.prompt_tps, done.timings.decode_tps, done.timings.ttft_ms


def theirs(lm, ids: list[int], max_tokens: int) -> tuple[float, float, float]:
    start, first, last = time.perf_counter(), None, None
    for response in stream_generate(lm.model, lm.tokenizer, mx.array(ids), max_tokens=max_tokens,
                                    sampler=make_sampler(0.0)):
        if first is None:
            first = time.perf_counter()
        last = response
    # mlx-lm reports its own prompt and generation speeds; TTFT is measured here.
    return last.prompt_tps, last.generation_tps, (first - start) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lm = load_model(None)
    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(args.prompt_tokens)]
    print(f"model: {lm.description}")
    print(f"{args.prompt_tokens}-token prompt, {args.max_tokens} generated tokens, greedy, best of {args.rounds}")
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for name, fn in (("mlxcel-py engine", ours), ("mlx_lm stream_generate", theirs)):
            p, g, t = fn(lm, ids, args.max_tokens)
            old = best.get(name, (0.0, 0.0, float("inf")))
            best[name] = (max(old[0], p), max(old[1], g), min(old[2], t))
    print(f"{'':>24} {'prompt tok/s':>13} {'gen tok/s':>10} {'TTFT ms':>8}")
    for name, (p, g, t) in best.items():
        print(f"{name:>24} {p:>13.1f} {g:>10.1f} {t:>8.0f}")
    (p1, g1, _), (p2, g2, _) = best.values()
    print(f"ratio ours/mlx_lm: prompt {p1 / p2:.2f}, generation {g1 / g2:.2f}")


if __name__ == "__main__":
    main()
