"""The two O(context) spikes of a long admission's fused ticks, apart from a model.

Usage: .venv/bin/python bench/bench_tick_spikes.py [--start 4096] [--end 6144] [--piece 24] [--runs 3]

Over 30 layers of the default model's KV shapes (3 KV heads x 64, float32):
- regrow: each tick's store of a `--piece`-token piece into the row caches from `--start` to `--end`
  positions, mlx-lm's own growth (every layer regrows by 256 in the same tick) against the fused
  tick's `_store` (engine/runner/tick.py: each layer 1,024 ahead, at its own tick); per tick median,
  p95, max and the total, the arms interleaved `--runs` times;
- join: the terminal tick's copy of `--end` positions into a fresh slot of the rows (`RowKV.add`),
  and what staging costs instead: each piece's K/V written into the slot as the ticks run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.engine.runner import tick  # noqa: E402
from mlxcel_py.engine.runner.kv_rows import RowKV  # noqa: E402

LAYERS, HEADS, DIM = 30, 3, 64


def caches(offset: int, capacity: int) -> list:
    out = []
    for _ in range(LAYERS):
        c = KVCache()
        c.keys, c.values = mx.random.normal((1, HEADS, capacity, DIM)), mx.random.normal((1, HEADS, capacity, DIM))
        c.offset = offset
        mx.eval(c.keys, c.values)
        out.append(c)
    return out


def regrow(staggered: bool, start: int, end: int, piece: int) -> np.ndarray:
    """Per-tick store times (ms), the first 3 ticks left out (the fabricated start's first regrows)."""
    cache = caches(start, (start + 255) // 256 * 256)
    store, x, times = tick._store(cache), np.random.rand(HEADS, piece, DIM).astype(np.float32), []
    for _ in range((end - start) // piece):
        t = time.perf_counter()
        for layer, c in enumerate(cache):
            if staggered:
                store(layer, x, x)
            else:
                c.update_and_fetch(mx.array(x)[None], mx.array(x)[None])
                mx.eval(c.keys, c.values)
        times.append(time.perf_counter() - t)
    return np.array(times[3:]) * 1000


def join(end: int, piece: int) -> tuple[float, np.ndarray]:
    """(the join's copy in ms, the staged writes per tick in ms)."""
    cache = caches(end, (end + 1023) // 1024 * 1024)
    kv = RowKV(LAYERS, HEADS, DIM, 8, 8192)
    t = time.perf_counter()
    kv.add(cache)
    copy = (time.perf_counter() - t) * 1000
    slot, x, times = kv.stage(end), np.random.rand(HEADS, piece, DIM).astype(np.float32), []
    for p in range(0, end - piece + 1, piece):
        t = time.perf_counter()
        for layer in range(LAYERS):
            kv.keys[layer][slot, :, p:p + piece] = x
            kv.values[layer][slot, :, p:p + piece] = x
        times.append(time.perf_counter() - t)
    return copy, np.array(times) * 1000


def line(ms: np.ndarray) -> str:
    return f"median {np.median(ms):6.1f}  p95 {np.percentile(ms, 95):6.1f}  max {ms.max():6.1f}  total {ms.sum():7.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--end", type=int, default=6144)
    ap.add_argument("--piece", type=int, default=24)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {LAYERS} layers, pieces of {args.piece} from {args.start} to {args.end}")
    for _ in range(args.runs):
        for staggered in (False, True):
            name = "store, each layer ahead" if staggered else "store, mlx-lm's growth"
            print(f"{name:>24}: {line(regrow(staggered, args.start, args.end, args.piece))}", flush=True)
    for _ in range(args.runs):
        copy, staged = join(args.end, args.piece)
        print(f"join of {args.end} positions: {copy:6.0f} ms in one tick; staged writes per tick {line(staged)}", flush=True)


if __name__ == "__main__":
    main()
