"""The cost of a join, without the model: a 6,144-token sequence's KV joining 4 rows of
300 positions (SmolLM2-135M's KV shape: 30 layers, 3 KV heads of 64), in mlx-lm's left-padded
BatchKVCache (merge + extend, then the CPU decode step's copy into buffers it owns) against the
engine's rows (engine/runner/kv_rows.py: the new row's copy only), and the engine's rows when the
new row shares a pinned prefix (its own positions only). Best of 3, process CPU and wall.

Usage: .venv/bin/python bench/bench_kv_join.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from mlxcel_py.engine.runner.kv_rows import RowKV  # noqa: E402
from mlxcel_py.models.cpu.decoder import _KvWriter  # noqa: E402

LAYERS, HEADS, DIM = 30, 3, 64


def row(length: int, seed: int) -> list[KVCache]:
    """One sequence's prefilled row caches of `length` random positions."""
    out = []
    for layer in range(LAYERS):
        cache = KVCache()
        keys = mx.random.normal((1, HEADS, length, DIM), key=mx.random.key(seed * 100 + layer))
        cache.update_and_fetch(keys, keys * 0.5)
        out.append(cache)
    mx.eval([c.keys for c in out])
    return out


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return (time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3


def join_batch(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    batch = [c.merge([c]) for c in rows[0]]
    for other in rows[1:]:
        for layer, cache in zip(batch, other):
            layer.extend(cache.merge([cache]))
    writer = _KvWriter()
    writer.begin(batch, len(rows))  # the decoder owns the batch's buffers before the join
    writer.end(batch, np.asarray(batch[0].offset))

    def join() -> None:
        for layer, cache in zip(batch, new):
            layer.extend(cache.merge([cache]))
        mx.eval([(b.keys, b.values) for b in batch])
        writer.begin(batch, len(rows) + 1)  # the decoder's copy at the next step

    return timed(join)


def join_rows(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    kv = RowKV.like(rows[0])
    for r in rows:
        kv.add(r)
    return timed(lambda: kv.add(new))


def join_shared(rows: list[list[KVCache]], new: list[KVCache]) -> tuple[float, float]:
    """The engine's rows when the new sequence adopted a pinned 6,000-token prefix (a shared system
    prompt): only its last 144 positions are copied."""
    kv = RowKV.like(rows[0])
    for r in rows:
        kv.add(r)
    prefix = kv.pin(new, SHARED)
    return timed(lambda: kv.add(new, kv.ref(prefix)))


SHARED = 6000


def main() -> None:
    rows, new = [row(300, i) for i in range(4)], row(6144, 9)
    for name, join in (("BatchKVCache", join_batch), ("engine rows", join_rows),
                       (f"engine rows, {SHARED:,} positions shared", join_shared)):
        runs = [join(rows, new) for _ in range(3)]
        print(f"join of a 6,144-token row next to 4 rows of 300, {name}: best CPU {min(r[0] for r in runs):.1f} ms, "
              f"wall {min(r[1] for r in runs):.1f} ms", flush=True)


if __name__ == "__main__":
    main()
