"""The default model's 30 layers of block Products (qkv, o, gate_up, down) on B rows, alone.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_block_products.py [--rows 1 4 20 68] [--threads 2]

The per-product path a fused tick's piece rows take (models/cpu/tick.py `_mul`), timed outside the
tick: best wall and process CPU time of 3 passes, to set beside bench_tick_split.py's "products"
(docs/CONTINUOUS_BATCHING.md's quiet rerun)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 20, 68])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    preload_blas("auto")
    from mlxcel_py.models import load_model

    decoder = load_model(None, threads=args.threads).cpu_decode
    rng = np.random.default_rng(0)
    for rows in args.rows:
        inputs, best = {}, (float("inf"), float("inf"))
        for _ in range(3):
            wall, cpu = time.perf_counter(), time.process_time()
            for layer in decoder._layers:
                for name in ("qkv", "o", "gate_up", "down"):
                    product = getattr(layer, name)
                    k = product.parts[0].shape[1]
                    x = inputs.setdefault(k, rng.random((rows, k), dtype=np.float32))
                    product(x, args.threads)
            best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
        print(f"rows {rows:3d}: {best[0] * 1e3:7.1f} ms wall, {best[1] * 1e3:7.1f} ms CPU "
              f"({best[0] / rows * 1e3:.2f} ms a row)", flush=True)


if __name__ == "__main__":
    main()
