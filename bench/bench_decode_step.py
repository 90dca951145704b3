"""The CPU decoder's step alone, per decoder class: ms a step at batch 1 and 4, on 1 and 2 threads.

Usage: .venv/bin/python bench/bench_decode_step.py [--model PATH] [--batch 1 4] [--threads 1 2]
                                                   [--steps 25] [--context 32] [--profile]
                                                   [--hold --start-at EPOCH]

Classes: `native` is NativeDecoder (one numba call per product, Python between them), `fused`
FusedDecoder (the whole step in one numba call, quant/step.py), over the same block weights.
Each row's KV holds `--context` prompt tokens. The classes' steps are interleaved within one
process so that a shared machine's load falls on both alike; per class it prints the best and
the median wall time and the best calling-thread CPU time (with one thread, the step's compute
without the time other processes took; with two, the calling thread's share).

`--profile`: where FusedDecoder's step goes, per phase kind (quant/step.py): the step run with only
that kind's phases (every layer's), less the step with none (the call's Python and numba dispatch),
best wall and best thread-CPU time; every step decodes at the same KV position (context + 1).

`--hold`: FusedDecoder's whole step alone at that fixed position, median and best wall and thread CPU;
with `--start-at EPOCH` the timed steps begin at that time, so that two checkouts (main and a branch,
each with its own PYTHONPATH) started together measure in the same window of a shared machine's load."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

from mlxcel_py.models import default_model_path, load_model  # noqa: E402
from mlxcel_py.models.cpu.native import NativeDecoder, _ModuleBlocks, blocks_of  # noqa: E402
from mlxcel_py.models.gguf_blocks import has_blocks  # noqa: E402
from mlxcel_py.models.cpu.fused_step import FusedDecoder  # noqa: E402
from test_cpu_decode import make_batch, prompt  # noqa: E402

import numpy as np  # noqa: E402


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


def _subset(phases, tasks, kinds) -> tuple:
    """The plan's phases of `kinds` only, their tasks renumbered: (phases, tasks)."""
    out_phases, out_tasks = [], []
    for kind, layer, _, count, row in phases:  # an ATTEND phase's count is set per step (step_phases)
        if kind in kinds:
            out_phases.append((kind, layer, len(out_tasks), count, len(out_tasks)))
            out_tasks += [tuple(t) for t in tasks[row : row + count]]
    return np.array(out_phases, np.int64).reshape(-1, 5), np.array(out_tasks, np.int64).reshape(-1, 3)


def profile(lm, path, batch: int, threads: int, steps: int, context: int) -> dict:
    """{phase kind name: (best wall ms, best thread-CPU ms)} of FusedDecoder's step, 'all' and 'none' included."""
    decoder, caches, tokens, rewind = _held_decoder(lm, path, batch, threads, context)
    phases, weights = decoder._phases, decoder._weights
    plans = {"all": set(range(len(KINDS))), "none": set()} | {name: {k} for k, name in enumerate(KINDS)}
    plans = {name: _subset(phases, weights[0], kinds) for name, kinds in plans.items()}
    wall, cpu = {n: [] for n in plans}, {n: [] for n in plans}
    for rep in range(steps + 1):
        for name, (ph, tasks) in plans.items():
            decoder._phases, decoder._weights = ph, (tasks, *weights[1:])
            t, c = time.perf_counter(), time.thread_time()
            decoder(tokens, caches)
            if rep:  # the first round warms each plan
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.thread_time() - c)
            rewind()  # back to the same position
    decoder._phases, decoder._weights = phases, weights
    return {n: (1e3 * min(wall[n]), 1e3 * min(cpu[n])) for n in plans}


def hold(lm, path, batch: int, threads: int, steps: int, context: int, start_at: float) -> tuple:
    """(median wall, best wall, median CPU, best CPU) ms of FusedDecoder's step at one fixed KV position."""
    decoder, caches, tokens, rewind = _held_decoder(lm, path, batch, threads, context)
    while time.time() < start_at:
        time.sleep(0.01)
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.thread_time()
        decoder(tokens, caches)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        rewind()
    return tuple(1e3 * f(v) for v in (wall, cpu) for f in (statistics.median, min))


def _held_decoder(lm, path, batch: int, threads: int, context: int) -> tuple:
    """(FusedDecoder, caches, tokens, rewind): rewind() puts every cache back at the first step's position."""
    blocks = _ModuleBlocks() if has_blocks(lm.model) else blocks_of(lm.model, path)
    decoder = FusedDecoder(lm.model, blocks, threads)
    caches, tokens = make_batch(lm.model, [prompt(context, i) for i in range(batch)]), [5] * batch
    decoder(tokens, caches)  # the decoder's own KV buffers from here on
    keep = [(c._idx, c.offset) for c in caches]

    def rewind():
        for cache, (idx, offset) in zip(caches, keep):
            cache._idx, cache.offset = idx, offset

    for _ in range(3):
        decoder(tokens, caches)
        rewind()
    return decoder, caches, tokens, rewind


KINDS = ("norm1", "qkv", "rope+kv", "attend", "quant_attn", "o", "norm2", "gate_up", "silu", "down", "final", "head")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--profile", action="store_true", help="FusedDecoder's step per phase kind")
    ap.add_argument("--hold", action="store_true", help="FusedDecoder's whole step at a fixed KV position")
    ap.add_argument("--start-at", type=float, default=0.0, help="with --hold: time.time() to start timing at")
    args = ap.parse_args()
    path = Path(args.model or default_model_path())
    lm = load_model(args.model, threads=max(args.threads))
    print(f"{path.name}, KV {args.context} tokens a row; ms a step (best / median wall, best thread CPU)")
    for batch in args.batch:
        for threads in args.threads:
            if args.hold:
                med, best, cmed, cbest = hold(lm, path, batch, threads, args.steps, args.context, args.start_at)
                print(f"B={batch} threads={threads} fused, held: {med:.2f} / {best:.2f} ms wall (median / best), "
                      f"{cmed:.2f} / {cbest:.2f} ms cpu", flush=True)
                continue
            if args.profile:
                got = profile(lm, path, batch, threads, args.steps, args.context)
                base_wall, base_cpu = got.pop("none")
                print(f"B={batch} threads={threads} whole step {got['all'][0]:.2f} ms wall, {got['all'][1]:.2f} cpu; "
                      f"call alone {base_wall:.2f} wall, {base_cpu:.2f} cpu; per kind, less the call:")
                for name in KINDS:
                    print(f"  {name:10s} {got[name][0] - base_wall:7.2f} ms wall {got[name][1] - base_cpu:7.2f} ms cpu", flush=True)
                continue
            for name, (best, median, cpu) in measure(lm, path, batch, threads, args.steps, args.context).items():
                print(f"B={batch} threads={threads} {name:6s}: {best:7.2f} / {median:7.2f} ms wall, {cpu:7.2f} ms cpu", flush=True)


if __name__ == "__main__":
    main()
