"""Prefill time of one prompt at several chunk sizes, with and without the numpy CPU kernels.

Usage: .venv/bin/python bench/bench_prefill.py [--tokens 2048] [--chunks 512 1024 2048]
Run once as is, and once with OPENBLAS_CORETYPE=Prescott to see what Debian's OpenBLAS
picks on its own on a recent Xeon. Prints one row per (kernels, chunk).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxcel_py.models import load_model  # noqa: E402


def prefill_seconds(model, ids: list[int], chunk: int) -> float:
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    for s in range(0, len(ids), chunk):
        model.model(mx.array([ids[s : s + chunk]]), cache=cache)
        mx.eval([c.state for c in cache])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lm = load_model(None)
    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(args.tokens)]
    print(f"model: {lm.description}; BLAS {BLAS.name} {BLAS.note}; {args.tokens}-token prompt, best of {args.rounds}")
    print(f"{'kernels':>8} {'chunk':>6} {'prefill s':>10} {'tok/s':>8}")
    # The numpy kernels run only inside their scope (LoadedModel.cpu_kernels; None off the CPU path).
    for label, scope in (("numpy", lm.cpu_kernels), ("mlx", contextlib.nullcontext())):
        if scope is None:
            continue
        with scope:
            prefill_seconds(lm.model, ids[:256], 256)  # warm-up
            for chunk in args.chunks:
                best = min(prefill_seconds(lm.model, ids, chunk) for _ in range(args.rounds))
                print(f"{label:>8} {chunk:>6} {best:>10.2f} {args.tokens / best:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
