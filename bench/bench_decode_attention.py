"""The decode attention kernel alone (cpu_decode_attention.attend_desc): ns per (query head, position).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_decode_attention.py [--threads 1] [--contexts 256 1024]

One query row over a context of random K/V, per head layout (dim 64 with 9 query / 3 KV heads as
SmolLM2; dim 128 with 16 / 8), best thread-CPU time of 7 runs of 30 calls. To compare two checkouts, run
it in each (PYTHONPATH) one after the other, twice, alternating (docs/CPU_DECODE.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from mlxcel_py.models.cpu import decode_attention as A  # noqa: E402

LAYOUTS = ((64, 9, 3), (128, 16, 8))  # head dim, query heads, KV heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    for dim, heads, kv_heads in LAYOUTS:
        for ctx in args.contexts:
            keys, values = (rng.standard_normal((1, kv_heads, ctx, dim), dtype=np.float32) for _ in range(2))
            qkv = rng.standard_normal((1, (heads + 2 * kv_heads) * dim), dtype=np.float32)
            desc = np.array([[0, 0, 0, 0, ctx]], np.int64)  # shared row, own row, cut, first, stop
            scale = np.float32(dim ** -0.5)
            A.attend_desc(qkv, keys, values, desc, heads, scale)
            best = float("inf")
            for _ in range(7):
                start = time.thread_time()
                for _ in range(30):
                    A.attend_desc(qkv, keys, values, desc, heads, scale)
                best = min(best, (time.thread_time() - start) / 30)
            print(f"dim {dim}, heads {heads}/{kv_heads}, context {ctx}: {best * 1e6:8.1f} us a call, "
                  f"{best / (heads * ctx) * 1e9:6.2f} ns per (query head, position)", flush=True)


if __name__ == "__main__":
    main()
