"""Prefill time of one prompt, `--cpu-weights f32` against `native` (GGUF blocks, dequantized tiles), interleaved.

Usage: bench/bench_prefill_cpu_weights.py [GGUF] [--tokens 512] [--chunk 512] [--runs 2]. Both models are
loaded as `serve` loads them (numpy prefill kernels on); prints seconds per run and the logits' gap.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.models import load_model  # noqa: E402


def prefill(lm, ids: list[int], chunk: int) -> tuple[float, np.ndarray]:
    cache = make_prompt_cache(lm.model)
    start = time.perf_counter()
    with lm.cpu_kernels:
        for s in range(0, len(ids), chunk):
            h = lm.model.model(mx.array([ids[s : s + chunk]]), cache=cache)
            mx.eval(h, [c.state for c in cache])
    return time.perf_counter() - start, np.array(h[0, -1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("gguf", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--runs", type=int, default=2)
    opts = ap.parse_args()
    models = {w: load_model(opts.gguf, cpu_weights=w) for w in ("f32", "native")}
    ids = [random.Random(0).randrange(3, min(1000, models["f32"].vocab_size)) for _ in range(opts.tokens)]
    print(f"{models['f32'].name}: {opts.tokens} tokens in chunks of {opts.chunk}, BLAS {BLAS.name}")
    hidden = {}
    for run in range(opts.runs):
        for name, lm in models.items():
            seconds, hidden[name] = prefill(lm, ids, opts.chunk)
            print(f"  run {run + 1} {name:<6} [{lm.weights}] {seconds:.2f} s", flush=True)
    print(f"  last hidden state gap {np.abs(hidden['f32'] - hidden['native']).max():.2e}")


if __name__ == "__main__":
    main()
