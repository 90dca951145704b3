"""The CPU decoder's step alone, per decoder class: ms a step at batch 1 and 4, on 1 and 2 threads.

Usage: .venv/bin/python bench/bench_decode_step.py [--model PATH] [--batch 1 4] [--threads 1 2]
                                                   [--steps 25] [--context 32]

Classes: `native` is NativeDecoder (one numba call per product, Python between them), `fused`
FusedDecoder (the whole step in one numba call, quant/step.py), over the same block weights.
Each row's KV holds `--context` prompt tokens. The classes' steps are interleaved within one
process so that a shared machine's load falls on both alike; per class it prints the best and
the median wall time and the best calling-thread CPU time (with one thread, the step's compute
without the time other processes took; with two, the calling thread's share)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from mlxcel_py.models.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

from mlxcel_py.models import default_model_path, load_model  # noqa: E402
from mlxcel_py.models.cpu_decode_native import NativeDecoder, _ModuleBlocks, blocks_of  # noqa: E402
from mlxcel_py.models.gguf_blocks import has_blocks  # noqa: E402
from mlxcel_py.models.cpu_step_native import FusedDecoder  # noqa: E402
from test_cpu_decode import make_batch, prompt  # noqa: E402


def measure(lm, path, batch: int, threads: int, steps: int, context: int) -> dict:
    """{class: (best wall ms, median wall ms, best thread-CPU ms)} for one batch size and thread count."""
    blocks = _ModuleBlocks() if has_blocks(lm.model) else blocks_of(lm.model, path)
    decoders = {name: cls(lm.model, blocks, threads)
                for name, cls in (("native", NativeDecoder), ("fused", FusedDecoder))}
    caches = {name: make_batch(lm.model, [prompt(context, i) for i in range(batch)]) for name in decoders}
    tokens, wall, cpu = [5] * batch, {n: [] for n in decoders}, {n: [] for n in decoders}
    for name, decoder in decoders.items():
        decoder(tokens, caches[name])  # compile / warm
    for _ in range(steps):
        for name, decoder in decoders.items():
            t, c = time.perf_counter(), time.thread_time()
            decoder(tokens, caches[name])
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.thread_time() - c)
    return {n: (1e3 * min(wall[n]), 1e3 * statistics.median(wall[n]), 1e3 * min(cpu[n])) for n in decoders}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--context", type=int, default=32)
    args = ap.parse_args()
    path = Path(args.model or default_model_path())
    lm = load_model(args.model, threads=max(args.threads))
    print(f"{path.name}, KV {args.context} tokens a row; ms a step (best / median wall, best thread CPU)")
    for batch in args.batch:
        for threads in args.threads:
            for name, (best, median, cpu) in measure(lm, path, batch, threads, args.steps, args.context).items():
                print(f"B={batch} threads={threads} {name:6s}: {best:7.2f} / {median:7.2f} ms wall, {cpu:7.2f} ms cpu", flush=True)


if __name__ == "__main__":
    main()
