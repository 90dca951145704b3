"""A tick's cost by piece size and context with 4 rows decoding, fused against separate.

Usage: .venv/bin/python bench/bench_tick_fused.py [--repeats 3] [--rows 4] [--contexts 0,2048,6000]
       [--sizes 16,32,64,128,256]

Runs the real ModelRunner on the default model through `Step` records. Each piece is the next
one of a sequence whose KV already holds `context` positions of random keys and values (the
attention's cost does not depend on the values, so no long prefill is needed to build it). Per
shape, best of `--repeats` of process CPU time (less inflated by other processes on a shared
machine) and wall time, the arms interleaved so that load weighs on them alike:
- `fused`: one forward for the rows and the piece (pieces up to 128), the piece's attention on
  one numpy BLAS thread (models/cpu/tick.PIECE_BLAS_THREADS, the default);
- `fused 2t`: the same with numpy's own BLAS threads for the attention;
- `separate`: the decode step, then the piece's own forward (the prefill's BLAS tiles), a piece of
  up to 128 tokens with its attention on one numpy BLAS thread (prompt_side.SMALL_PIECE);
- `separate 2t`: the same with numpy's own BLAS threads.
The decode step alone is the first line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402

from mlxcel_py.engine.core.request import SamplingParams  # noqa: E402
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step  # noqa: E402
from mlxcel_py.engine.runner import prompt_side  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402
from mlxcel_py.models.cpu import tick as cpu_tick  # noqa: E402


class Ticks:
    """Scratch sequences on one runner: decode rows, and pieces after a fabricated context."""

    def __init__(self, runner, rows: int):
        self.runner, self.next_id = runner, 100
        self.rows = tuple(range(1, rows + 1))
        for sid in self.rows:
            self.runner.execute(Step(prefill=self.piece(sid, 0, 32, True)))
        for _ in range(2):
            self.runner.execute(Step(decode=self.rows))

    def piece(self, sid: int, start: int, n: int, terminal: bool = False) -> PrefillPiece:
        begin = BeginSequence(SamplingParams(temperature=0.0), ()) if start == 0 else None
        return PrefillPiece(sid, start, tuple(range(200 + start % 97, 200 + start % 97 + n)), n, terminal, None, begin)

    def at_context(self, context: int) -> int:
        """A new sequence whose KV holds `context` positions (random K/V written into its row cache)."""
        self.next_id += 1
        sid = self.next_id
        self.runner.execute(Step(prefill=self.piece(sid, 0, 16)))
        if context:
            for cache in self.runner._seqs[sid].prefill_cache:
                _, heads, _, dim = cache.keys.shape
                capacity = (context + 256 + 255) // 256 * 256
                cache.keys = mx.random.normal((1, heads, capacity, dim))
                cache.values = mx.random.normal((1, heads, capacity, dim))
                cache.offset = context
                mx.eval(cache.keys, cache.values)
        return sid

    def tick(self, context: int, n: int, arm: str) -> tuple[float, float]:
        sid = self.at_context(context)
        start = context or 16
        self.runner.fuse_max_tokens = 128 if arm.startswith("fused") else 0
        cpu_tick.PIECE_BLAS_THREADS = None if arm == "fused 2t" else 1
        prompt_side.SMALL_PIECE = 0 if arm == "separate 2t" else 128
        cpu, wall = time.process_time(), time.perf_counter()
        if arm.startswith("fused"):
            self.runner.execute(Step(decode=self.rows, prefill=self.piece(sid, start, n)))
        else:
            self.runner.execute(Step(decode=self.rows))
            self.runner.execute(Step(prefill=self.piece(sid, start, n)))
        out = time.process_time() - cpu, time.perf_counter() - wall
        self.runner.execute(Step(retire=(Retire(sid),)))
        return out

    def decode(self) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        self.runner.execute(Step(decode=self.rows))
        return time.process_time() - cpu, time.perf_counter() - wall


def best(runs) -> str:
    return f"{min(r[0] for r in runs) * 1000:7.1f} / {min(r[1] for r in runs) * 1000:7.1f}"


def tick_setup(description: str, sizes: str) -> tuple[argparse.Namespace, ModelRunner]:
    """The tick benchmarks' shared arguments (`sizes`: the default piece sizes) and a ModelRunner over
    the default model with its CPU decode step and kernels; prints the model line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--contexts", default="0,2048,6000")
    ap.add_argument("--sizes", default=sizes)
    args = ap.parse_args()
    lm = load_model(None)
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels, verify=lm.cpu_decode.verify)
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return args, runner


def main() -> None:
    args, runner = tick_setup(__doc__.splitlines()[0], "16,32,64,128,256")
    t = Ticks(runner, args.rows)
    for n in (16, 128):  # first-call compiles and allocations, untimed
        t.tick(0, n, "fused"), t.tick(0, n, "separate")
    print(f"decode {args.rows} rows alone: cpu / wall ms {best([t.decode() for _ in range(args.repeats)])}", flush=True)
    names = ["fused", "fused 2t", "separate", "separate 2t"]
    print(f"{'context':>7} {'piece':>5} | " + " | ".join(f"{a + ' cpu / wall ms':>21}" for a in names))
    for context in map(int, args.contexts.split(",")):
        for n in map(int, args.sizes.split(",")):
            arms = names if n <= 128 else ["separate"]  # longer pieces never fuse, and use numpy's threads
            runs: dict[str, list] = {a: [] for a in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    runs[arm].append(t.tick(context, n, arm))
            cells = [best(runs[a]) if a in runs else "-" for a in names]
            print(f"{context:>7} {n:>5} | " + " | ".join(f"{c:>21}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
