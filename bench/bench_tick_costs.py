"""Calibrate the tick cost model on the real runner, check its predictions, and
predict what `--itl-budget-ms` will do in the acceptance scenario.

Usage: .venv/bin/python bench/bench_tick_costs.py [--budget-ms 300] [--rows 4] [--max-seconds 30]

`engine.probe.TickProbe.measure(tokens, context, rows)` is the engine's calibration callable:
one tick of the real ModelRunner (a decode step over `rows` scratch sequences, then a
`tokens`-token piece of a scratch prompt whose KV holds `context` tokens), timed end to end.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy  # noqa: E402
from mlxcel_py.engine.chunking.policy import TickState  # noqa: E402
from mlxcel_py.engine.chunking.calibration import calibrate, default_grid  # noqa: E402
from mlxcel_py.engine.chunking.cost_model import CostModel, TickShape  # noqa: E402
from mlxcel_py.engine.chunking.probe import ROW_PROMPT, TickProbe  # noqa: E402
from mlxcel_py.engine.runner.model_runner import ModelRunner  # noqa: E402
from mlxcel_py.models import load_model  # noqa: E402


def row_context(probe: TickProbe) -> int:
    return len(probe.rows) * ROW_PROMPT


def predicted_ttft(model: CostModel, chunk_of, prompt: int, rows: int, row_ctx: int) -> tuple[float, int]:
    """Seconds and ticks to prefill `prompt` tokens next to `rows` decoding rows, by the model."""
    cursor, seconds, ticks = 0, 0.0, 0
    while cursor < prompt:
        n = min(chunk_of(TickState(rows, row_ctx + rows * ticks, cursor, prompt - cursor)), prompt - cursor)
        seconds += model.predict(TickShape(n, cursor, rows, row_ctx + rows * ticks))
        cursor, ticks = cursor + n, ticks + 1
    return seconds, ticks


def check_chunks(probe: TickProbe, policy: BudgetChunkPolicy, rows: int, repeats: int) -> None:
    print(f"\nchunks for a {policy.budget_ms:g} ms budget with {rows} rows decoding; measured ticks (median of {repeats})")
    print(f"{'context':>8} {'chunk':>6} {'predicted ms':>13} {'measured ms':>12}")
    for context in (0, 2048, 6144):
        state = TickState(rows, row_context(probe), context, 8192 - context)
        chunk = policy.chunk_for(state)
        predicted = policy.model.predict(TickShape(chunk, context, rows, row_context(probe)))
        times = [probe.measure(chunk, context, rows) for _ in range(repeats)]
        print(f"{context:>8} {chunk:>6} {predicted * 1000:>13.1f} {statistics.median(times) * 1000:>12.1f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-ms", type=float, default=300.0)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=30.0, help="calibration time limit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-check", action="store_true", help="calibrate and predict only")
    args = ap.parse_args()
    lm = load_model(None)
    print(f"model: {lm.description}; BLAS {BLAS.name}; load average {os.getloadavg()[0]:.1f}")
    probe = TickProbe(ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels), max_context=8192, vocab=lm.model.args.vocab_size)
    start = time.perf_counter()
    cal = calibrate(probe.measure, default_grid(2048, args.rows), max_seconds=args.max_seconds,
                    row_context=ROW_PROMPT, say=print)
    print(f"calibration wall time {time.perf_counter() - start:.1f} s (measured {cal.seconds:.1f} s)")
    model = cal.model()
    print("fit:", model.stats().describe())
    policy = BudgetChunkPolicy(args.budget_ms, model, start_margin=0.0)
    for prompt in (2048, 6144):
        ours, n_ours = predicted_ttft(model, policy.chunk_for, prompt, args.rows, row_context(probe))
        fixed, n_fixed = predicted_ttft(model, lambda _s: 512, prompt, args.rows, row_context(probe))
        print(f"predicted TTFT of a {prompt}-token prompt next to {args.rows} rows: budget {ours:.1f} s "
              f"({n_ours} ticks), chunk 512 {fixed:.1f} s ({n_fixed} ticks), ratio {ours / fixed:.2f}")
    if not args.skip_check:
        check_chunks(probe, policy, args.rows, args.repeats)


if __name__ == "__main__":
    main()
