"""Time the quantized decode kernels and the tiled prefill against float32 (docs/QUANT_KERNELS.md).

    python bench/bench_quant_kernels.py [--threads 1] [--min-s 0.15]

Prints the CPU first, then per layer shape (SmolLM2-135M's and a 1B model's) and input rows:
microseconds per product and the weight bytes read per second, for float32 (today's
cpu_decode_kernels._stream) and each GGUF type with each candidate (float, int8); then the
tiled prefill at 512 rows against numpy's float32 matmul. Weights are random."""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import numba
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu_decode_kernels import _stream
from mlxcel_py.models.quant import blocks, prefill, products

SHAPES = [(576, 576), (1536, 576), (576, 1536), (2048, 2048), (8192, 2048), (49152, 576)]
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16]
K_SIZES = {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def cpu_line() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("Model name")), "?")
    flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split()
    marks = " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni"))
    return f"CPU: {model}, {os.cpu_count()} cores; {marks}; load {os.getloadavg()[0]:.2f}"


def timed(fn, min_s: float) -> float:
    fn()
    start, n = time.perf_counter(), 0
    while True:
        fn()
        n += 1
        spent = time.perf_counter() - start
        if spent >= min_s and n >= 3:
            return spent / n


def weight(qtype: T, rows: int, cols: int, rng) -> blocks.QuantWeight | None:
    if qtype in K_SIZES:
        if cols % 256:
            return None  # llama.cpp stores such rows in another type
        raw = rng.integers(0, 256, size=(rows, cols // 256 * K_SIZES[qtype]), dtype=np.uint8)
        step = K_SIZES[qtype]
        for at in {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q6_K: (208,)}.get(qtype, (0, 2)):
            raw.reshape(rows, -1, step)[..., at : at + 2] = np.array([0.001], np.float16).view(np.uint8)
        return blocks.make(qtype, (rows, cols), raw)
    dense = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    data = dense.astype(np.float16).view(np.uint8) if qtype == T.F16 else quants.quantize(dense, qtype)
    return blocks.make(qtype, (rows, cols), data)


def decode_table(args, rng) -> None:
    print("\n| shape (out x in) | rows | kernel | us/product | GB/s |\n|---|---:|---|---:|---:|")
    for rows_out, cols in SHAPES:
        f32 = (rng.standard_normal((rows_out, cols)) * 0.05).astype(np.float32)
        for rows in (1, 4):
            x = rng.standard_normal((rows, cols)).astype(np.float32)
            out = np.empty((rows, rows_out), np.float32)
            t = timed(lambda: _stream(x, f32, out), args.min_s)
            print(f"| {rows_out}x{cols} | {rows} | float32 _stream | {t * 1e6:,.0f} | {f32.nbytes / t / 1e9:.1f} |", flush=True)
            for qtype in TYPES:
                w = weight(qtype, rows_out, cols, rng)
                if w is None:
                    continue
                kinds = [("float", products.linear_float)] + ([("int8", products.linear_int8)] if qtype != T.F16 else [])
                for kind, fn in kinds:
                    t = timed(lambda: fn(x, w, out, args.threads), args.min_s)
                    print(f"| {rows_out}x{cols} | {rows} | {qtype.name} {kind} | {t * 1e6:,.0f} | {w.nbytes / t / 1e9:.2f} |", flush=True)
        del f32


def prefill_table(args, rng) -> None:
    print("\n| shape (out x in) | 512 rows | ms | scratch |\n|---|---|---:|---:|")
    for rows_out, cols in [(1536, 576), (2048, 2048), (8192, 2048)]:
        x = rng.standard_normal((512, cols)).astype(np.float32)
        f32 = (rng.standard_normal((rows_out, cols)) * 0.05).astype(np.float32)
        t = timed(lambda: x @ f32.T, args.min_s)
        print(f"| {rows_out}x{cols} | float32 numpy matmul | {t * 1e3:.1f} | - |", flush=True)
        for qtype in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K):
            w = weight(qtype, rows_out, cols, rng)
            if w is None:
                continue
            scratch = np.empty((prefill.TILE_ROWS, cols), np.float32)
            t = timed(lambda: prefill.matmul_tiled(x, w, scratch=scratch, threads=args.threads), args.min_s)
            print(f"| {rows_out}x{cols} | {qtype.name} tiled | {t * 1e3:.1f} | {scratch.nbytes / 2**20:.2f} MiB |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="numba threads for every kernel (1: shared machine)")
    parser.add_argument("--min-s", type=float, default=0.15, help="seconds each timing runs at least")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    print(cpu_line())
    print(f"numba {numba.__version__}, numpy {np.__version__}, {args.threads} thread(s)")
    rng = np.random.default_rng(0)
    decode_table(args, rng)
    prefill_table(args, rng)
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
