"""Time the quantized decode kernels and the tiled prefill against float32 (docs/QUANT_KERNELS.md).

    python bench/bench_quant_kernels.py [--threads 1] [--min-s 0.15] [--tables model,shapes,prefill]
        [--types Q5_0,Q5_K] [--kinds float,vector,int8v]

Prints the CPU first. `model`: every product of one decode step over a model's worth of weights
(larger than the L3 cache, as in real decode), ms per step at 1 and 4 input rows, float32
(today's cpu_decode_kernels._stream) against each GGUF type with candidates c (vector) and d
(int8v). `shapes`: per layer shape, microseconds per product and weight bytes read per second,
every candidate (float, int8, vector, int8v); the weight is reused, so a quantized one sits in
the L3 cache where float32 may not. `prefill`: the tiled prefill at 512 rows against numpy's
float32 matmul (wall time: BLAS runs its own threads). Weights are random; decode times are
process CPU time, best of 3."""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import numba
import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from mlxcel_py.models.cpu.decode_kernels import _stream
from mlxcel_py.models.cpu.quant import blocks, int8_ir, prefill, products, vector

SHAPES = [(576, 576), (1536, 576), (576, 1536), (2048, 2048), (8192, 2048), (49152, 576)]
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16]
K_SIZES = {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def cpu_line() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("Model name")), "?")
    flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split()
    marks = " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni"))
    return f"CPU: {model}, {os.cpu_count()} cores; {marks}; load {os.getloadavg()[0]:.2f}"


def timed(fn, min_s: float, repeats: int = 3, clock=time.process_time) -> float:
    """Seconds per call: the best of `repeats` runs of >= min_s / repeats each, in process CPU
    time by default, so that time spent descheduled on a shared machine does not count (the
    kernels run one thread; multi-threaded BLAS passes clock=time.perf_counter)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, n = clock(), 0
        while True:
            fn()
            n += 1
            spent = clock() - start
            if spent >= min_s / repeats and n >= 2:
                break
        best = min(best, spent / n)
    return best


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


KINDS = [("float", products.linear_float), ("int8", products.linear_int8), ("vector", products.linear_vector),
         ("int8v", products.linear_int8_vector if int8_ir.HAS_AVX2 else None)]


def _reads(kind: str, qtype: T) -> bool:
    if kind in ("vector", "int8v"):
        return int(qtype) in vector.VECTOR_TYPES
    return kind == "float" or qtype != T.F16


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
                kinds = [(kind, fn) for kind, fn in KINDS if fn is not None and _reads(kind, qtype)]
                for kind, fn in kinds:
                    t = timed(lambda: fn(x, w, out, args.threads), args.min_s)
                    print(f"| {rows_out}x{cols} | {rows} | {qtype.name} {kind} | {t * 1e6:,.0f} | {w.nbytes / t / 1e9:.2f} |", flush=True)
        del f32


def prefill_table(args, rng) -> None:
    print("\n| shape (out x in) | 512 rows | ms | scratch |\n|---|---|---:|---:|")
    for rows_out, cols in [(1536, 576), (2048, 2048), (8192, 2048)]:
        x = rng.standard_normal((512, cols)).astype(np.float32)
        f32 = (rng.standard_normal((rows_out, cols)) * 0.05).astype(np.float32)
        t = timed(lambda: x @ f32.T, args.min_s, clock=time.perf_counter)
        print(f"| {rows_out}x{cols} | float32 numpy matmul | {t * 1e3:.1f} | - |", flush=True)
        for qtype in [T[name] for name in args.types.split(",")] if args.types else (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K):
            w = weight(qtype, rows_out, cols, rng)
            if w is None:
                continue
            t = timed(lambda: prefill.matmul_tiled(x, w), args.min_s, clock=time.perf_counter)
            print(f"| {rows_out}x{cols} | {qtype.name} tiled | {t * 1e3:.1f} | {prefill.scratch_bytes(w) / 2**20:.2f} MiB |", flush=True)


# A decode step's weights, larger than the L3 cache as in a real model: (layers, shapes, LM head).
MODELS = {"SmolLM2-135M": (30, [(960, 576), (576, 576), (3072, 576), (576, 1536)], (49152, 576)),
          "1B (4 of Llama-3.2-1B's 16 layers)": (4, [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)], None)}
SCALE_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,), T.Q5_0: (0,),
                T.Q5_1: (0, 2), T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q5_K: (0, 2), T.F16: (), T.BF16: ()}


def random_blocks(qtype: T, rows: int, cols: int, rng) -> blocks.QuantWeight:
    """Random codes with small finite f16 scales (speed does not depend on the values); F16/BF16 normal values."""
    if qtype in (T.F16, T.BF16):
        values = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.05)
        data = values.astype(np.float16).view(np.uint8) if qtype == T.F16 else (values.view(np.uint32) >> 16).astype(np.uint16)
        return blocks.make(qtype, (rows, cols), data.view(np.uint8))
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for at in SCALE_FIELDS[qtype]:
        raw[:, at : at + 2] = np.array([0.001], np.float16).view(np.uint8)
    return blocks.make(qtype, (rows, cols), raw.reshape(rows, -1))


def _step_time(weights, rows: int, product, min_s: float, rng) -> float:
    xs = {cols: rng.standard_normal((rows, cols)).astype(np.float32) for _, cols in (w.shape for w in weights)}
    outs = [np.empty((rows, w.shape[0]), np.float32) for w in weights]

    def step():
        for w, out in zip(weights, outs):
            product(xs[w.shape[1]], w, out)

    return timed(step, min_s)


def model_table(args, rng) -> None:
    """Every product of one decode step (1 and 4 rows) over a model's worth of weights: ms per token."""
    print("\n| model | weights | rows | kernel | ms/step | GB/s |\n|---|---|---:|---|---:|---:|")
    f32_product = lambda x, w, out: _stream(x, w, out)  # noqa: E731
    for name, (layers, shapes, head) in MODELS.items():
        shapes = shapes * layers + ([head] if head else [])
        dense = [(rng.standard_normal(shape, dtype=np.float32) * 0.05) for shape in shapes]
        for rows in (1, 4):
            t = _step_time(dense, rows, f32_product, args.min_s, rng)
            total = sum(w.nbytes for w in dense)
            print(f"| {name} | float32 {total / 1e6:.0f} MB | {rows} | _stream | {t * 1e3:.2f} | {total / t / 1e9:.1f} |", flush=True)
        del dense
        for qtype in [T[name] for name in args.types.split(",")] if args.types else SCALE_FIELDS:
            if any(cols % GGML_QUANT_SIZES[qtype][0] for _, cols in shapes):
                continue  # llama.cpp stores such rows in another type
            weights = [random_blocks(qtype, *shape, rng) for shape in shapes]
            total = sum(w.nbytes for w in weights)
            for rows in (1, 4):
                for kind, fn in KINDS:
                    if fn is None or kind not in args.kinds.split(","):
                        continue
                    t = _step_time(weights, rows, lambda x, w, out: fn(x, w, out, args.threads), args.min_s, rng)
                    print(f"| {name} | {qtype.name} {total / 1e6:.0f} MB | {rows} | {kind} | {t * 1e3:.2f} | {total / t / 1e9:.1f} |", flush=True)
            del weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="numba threads for every kernel (1: shared machine)")
    parser.add_argument("--min-s", type=float, default=0.15, help="seconds each timing runs at least")
    parser.add_argument("--tables", default="model,shapes,prefill", help="which tables, comma-separated")
    parser.add_argument("--types", default="", help="model and prefill tables: GGUF types, comma-separated")
    parser.add_argument("--kinds", default="vector,int8v", help="model table: candidates (float,int8,vector,int8v)")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    print(cpu_line())
    print(f"numba {numba.__version__}, numpy {np.__version__}, {args.threads} thread(s)")
    rng = np.random.default_rng(0)
    for table in args.tables.split(","):
        {"model": model_table, "shapes": decode_table, "prefill": prefill_table}[table](args, rng)
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
