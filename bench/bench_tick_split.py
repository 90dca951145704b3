"""Where a fused tick's time goes, by piece size and context, 4 rows decoding.

Usage: .venv/bin/python bench/bench_tick_split.py [--repeats 3] [--rows 4] [--contexts 0,2048,6000]
       [--sizes 16,32,64]

The real ModelRunner's one-forward tick (models/cpu/tick.py) on the default model, its parts timed
by wrapping them: the block products (`_mul`), the piece's attention (`causal_attention`), the
decode rows' attention and KV writes (`attend_rows`, `write_kv_rows`), the piece's KV `store`, and
the rest (norms, RoPE, embedding, LM head, sampling, glue). Contexts are fabricated as in
bench_tick_fused.py (random K/V). Per shape the tick with the least wall time of `--repeats`.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_tick_fused import Ticks, tick_setup  # noqa: E402

from mlxcel_py.engine.runner import tick as runner_tick  # noqa: E402
from mlxcel_py.models.cpu import tick as cpu_tick  # noqa: E402

PARTS = ("products", "piece attn", "rows attn", "store")
_acc: dict[str, float] = defaultdict(float)


def _timed(name: str, fn):
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            _acc[name] += time.perf_counter() - t
    return wrapper


def install() -> None:
    """Wrap the tick's parts where models/cpu/tick.py looks them up."""
    cpu_tick._mul = _timed("products", cpu_tick._mul)
    cpu_tick.causal_attention = _timed("piece attn", cpu_tick.causal_attention)
    cpu_tick.attend_rows = _timed("rows attn", cpu_tick.attend_rows)
    cpu_tick.write_kv_rows = _timed("rows attn", cpu_tick.write_kv_rows)
    store = runner_tick._store
    runner_tick._store = lambda cache, *rest: _timed("store", store(cache, *rest))


def main() -> None:
    args, runner = tick_setup(__doc__.splitlines()[0], "16,32,64")
    install()
    t = Ticks(runner, args.rows)
    for n in (16, 64):
        t.tick(0, n, "fused")
    print(f"{'context':>7} {'piece':>5} | {'tick wall':>9} {'cpu':>7} | " + " ".join(f"{p:>10}" for p in PARTS)
          + f" {'rest':>7}  (ms)")
    for context in map(int, args.contexts.split(",")):
        for n in map(int, args.sizes.split(",")):
            runs = []
            for _ in range(args.repeats):
                _acc.clear()
                cpu, wall = t.tick(context, n, "fused")
                runs.append((wall, cpu, dict(_acc)))
            wall, cpu, parts = min(runs, key=lambda r: r[0])
            rest = wall - sum(parts.values())
            cells = " ".join(f"{parts.get(p, 0) * 1000:10.1f}" for p in PARTS)
            print(f"{context:>7} {n:>5} | {wall * 1000:9.1f} {cpu * 1000:7.1f} | {cells} {rest * 1000:7.1f}", flush=True)


if __name__ == "__main__":
    main()
