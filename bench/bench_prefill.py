"""Prefill time of one prompt at several chunk sizes, with and without the numpy CPU kernels.

Usage: .venv/bin/python bench/bench_prefill.py [--tokens 2048] [--chunks 512 1024 2048]
Run once as is, and once with OPENBLAS_CORETYPE=Prescott to see what Debian's OpenBLAS
picks on its own on a recent Xeon. Prints one row per (kernels, chunk).

`--routes [--model FILE] [--tokens 512 2048]`: one whole prefill through the engine's runner, as
rows of the fused decode step (the exact route, engine/runner/row_prefill.py) and as the mlx-lm
forward over dequantized tiles, interleaved, `--rounds` each (docs/CPU_FAST_PATH.md, "One kernel
family").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

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


def routes(model: str | None, tokens: list[int], rounds: int) -> None:
    """Seconds of one prefill through the runner: as rows of the fused step, then as tiles."""
    from mlxcel_py.engine.core.request import SamplingParams
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step
    from mlxcel_py.engine.runner import row_prefill
    from mlxcel_py.engine.runner.model_runner import ModelRunner

    lm, rows = load_model(model), row_prefill.runs_rows
    print(f"model: {lm.description}; BLAS {BLAS.name} {BLAS.note}")
    rng = random.Random(1)
    for n in tokens:
        ids, seconds = tuple(rng.randrange(100, 40000) for _ in range(n)), {"rows": [], "tiles": []}
        for _ in range(rounds):
            for route in seconds:
                row_prefill.runs_rows = rows if route == "rows" else (lambda decoder: False)
                runner = ModelRunner(lm.model, decode=lm.cpu_decode, verify=lm.cpu_decode.verify, kernels=lm.cpu_kernels)
                begin = BeginSequence(SamplingParams(max_tokens=1, temperature=0.0), ())
                start = time.perf_counter()
                runner.execute(Step(prefill=PrefillPiece(1, 0, ids, n, True, None, begin)))
                seconds[route].append(time.perf_counter() - start)
        row_prefill.runs_rows = rows
        print(f"{n} tokens: " + "; ".join(f"{r} {' '.join(f'{t:.2f}' for t in ts)} s" for r, ts in seconds.items()),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048])
    ap.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--routes", action="store_true", help="rows of the fused step against tiles, through the runner")
    ap.add_argument("--model", default=None, help="--routes: a GGUF (default: the default model)")
    args = ap.parse_args()
    if args.routes:
        return routes(args.model, args.tokens, args.rounds)
    args.tokens = args.tokens[0]
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
