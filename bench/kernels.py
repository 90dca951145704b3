"""CPU kernels alone, on random weights and activations (no model), one mode a subcommand:

    quant-kernels      the quantized decode kernels and the tiled prefill against float32 (docs/QUANT_KERNELS.md)
    decode-attention   the decode attention kernel (cpu_decode_attention.attend_desc): ns per (query head, position)
    prefill-attention  prefill attention on each architecture's shape: the candidates, then the chosen one's parts
    prefill-weights    prefill products over a GGUF's weights three ways: float32, MLX quantized, dequantized tiles

Importing mlxcel_py first sets OPENBLAS_THREAD_TIMEOUT as the server has it, before numpy loads its BLAS;
only prefill-weights imports MLX (with the BLAS named by $MLXCEL_BLAS preloaded first).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import mlxcel_py  # noqa: F401  (OPENBLAS_THREAD_TIMEOUT, before numpy loads BLAS)

import numba  # noqa: E402
from numba import njit  # noqa: E402
import numpy as np  # noqa: E402
from gguf import quants  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402

from mlxcel_py.models.cpu import prefill_attention as ca  # noqa: E402
from mlxcel_py.models.cpu import decode_attention as cpu_decode_attention  # noqa: E402
from mlxcel_py.models.cpu.decode_kernels import _stream  # noqa: E402
from mlxcel_py.models.cpu.quant import blocks, int8_ir, kblock, prefill, products, kquant_r8, vector  # noqa: E402
from mlxcel_py.models.cpu.quant.kblock import kblock_rows  # noqa: E402
from mlxcel_py.models.cpu.quant.kquant_r8 import r8_rows  # noqa: E402


# ---- quant-kernels -------------------------------------------------------------------------------

QUANT_KERNELS_DOC = """Time the quantized decode kernels and the tiled prefill against float32.

    python -m bench quant-kernels [--threads 1] [--min-s 0.15] [--tables model,shapes,prefill]
        [--types Q5_0,Q5_K] [--kinds float,vector,int8v]

Prints the CPU first. `model`: every product of one decode step over a model's worth of weights
(larger than the L3 cache, as in real decode), ms per step at 1 and 4 input rows, float32
(today's cpu_decode_kernels._stream) against each GGUF type with candidates c (vector) and d
(int8v). `shapes`: per layer shape, microseconds per product and weight bytes read per second,
every candidate (float, int8, vector, int8v); the weight is reused, so a quantized one sits in
the L3 cache where float32 may not. `prefill`: the tiled prefill at 512 rows against numpy's
float32 matmul (wall time: BLAS runs its own threads). Weights are random; decode times are
process CPU time, best of 3."""


QUANT_SHAPES = [(576, 576), (1536, 576), (576, 1536), (2048, 2048), (8192, 2048), (49152, 576)]
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


QUANT_KINDS = [("float", products.linear_float), ("int8", products.linear_int8), ("vector", products.linear_vector),
         ("int8v", products.linear_int8_vector if int8_ir.HAS_AVX2 else None)]


def _reads(kind: str, qtype: T) -> bool:
    if kind in ("vector", "int8v"):
        return int(qtype) in vector.VECTOR_TYPES
    return kind == "float" or qtype != T.F16


def decode_table(args, rng) -> None:
    print("\n| shape (out x in) | rows | kernel | us/product | GB/s |\n|---|---:|---|---:|---:|")
    for rows_out, cols in QUANT_SHAPES:
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
                kinds = [(kind, fn) for kind, fn in QUANT_KINDS if fn is not None and _reads(kind, qtype)]
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
                for kind, fn in QUANT_KINDS:
                    if fn is None or kind not in args.kinds.split(","):
                        continue
                    t = _step_time(weights, rows, lambda x, w, out: fn(x, w, out, args.threads), args.min_s, rng)
                    print(f"| {name} | {qtype.name} {total / 1e6:.0f} MB | {rows} | {kind} | {t * 1e3:.2f} | {total / t / 1e9:.1f} |", flush=True)
            del weights


def quant_kernels_main() -> None:
    parser = argparse.ArgumentParser(description=QUANT_KERNELS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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


# ---- decode-attention ----------------------------------------------------------------------------

DECODE_ATTENTION_DOC = """The decode attention kernel alone (cpu_decode_attention.attend_desc): ns per (query head, position).

    python -m bench decode-attention [--threads 1] [--contexts 256 1024]

One query row over a context of random K/V, per head layout (dim 64 with 9 query / 3 KV heads as
SmolLM2; dim 128 with 16 / 8), best thread-CPU time of 7 runs of 30 calls. To compare two checkouts, run
it in each (PYTHONPATH) one after the other, twice, alternating (docs/CPU_DECODE.md)."""


LAYOUTS = ((64, 9, 3), (128, 16, 8))  # head dim, query heads, KV heads


def decode_attention_main() -> None:
    ap = argparse.ArgumentParser(description=DECODE_ATTENTION_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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
            cpu_decode_attention.attend_desc(qkv, keys, values, desc, heads, scale)
            best = float("inf")
            for _ in range(7):
                start = time.thread_time()
                for _ in range(30):
                    cpu_decode_attention.attend_desc(qkv, keys, values, desc, heads, scale)
                best = min(best, (time.thread_time() - start) / 30)
            print(f"dim {dim}, heads {heads}/{kv_heads}, context {ctx}: {best * 1e6:8.1f} us a call, "
                  f"{best / (heads * ctx) * 1e9:6.2f} ns per (query head, position)", flush=True)


# ---- prefill-attention ---------------------------------------------------------------------------

PREFILL_ATTENTION_DOC = """Prefill attention alone on each architecture's shape (2,048 queries over 2,048 keys by default): the
candidates side by side, then the chosen kernel's time split into its two products and its softmax.

(a) numpy passes, numpy's BLAS on its own threads: the kernel before (query blocks of 256, the scores
    masked, max, subtracted, exp'd and summed by numpy over the whole block);
(b) the same with numpy's BLAS on one thread;
(c) models/cpu/prefill_attention.py (tiles of ~256 rows, one BLAS thread, the numba softmax over only the seen
    keys) on one thread, and (d) on --threads threads (the shipped path).
Usage: python -m bench prefill-attention [--archs llama qwen3 ...] [--tokens 2048] [--rounds 2] [--threads 2].
Prints ms per call, best of the interleaved rounds.
"""


ATTENTION_SHAPES = {  # heads, KV heads, head dim: SmolLM2-135M's and bench/synthetic.py's presets
    "llama": (9, 3, 64), "qwen2": (14, 2, 64), "qwen3": (16, 8, 128), "gemma3": (4, 1, 256), "phi3": (16, 16, 64)}
_HIDDEN = np.triu(np.full((256, 256), -np.inf, dtype=np.float32), k=1)


def numpy_passes(q, k, v, scale):
    """(a)/(b): the numpy kernel before models/cpu/prefill_attention.py (its long-context form, every block)."""
    num_heads, num_q, _ = q.shape
    group, offset = num_heads // k.shape[0], k.shape[1] - num_q
    out = np.empty((num_heads, num_q, v.shape[2]), dtype=np.float32)
    for b0 in range(0, num_q, 256):
        b1 = min(num_q, b0 + 256)
        nb, kend = b1 - b0, offset + b1
        for h in range(k.shape[0]):
            heads = slice(h * group, (h + 1) * group)
            qh = (q[heads, b0:b1] * np.float32(scale)).reshape(group * nb, -1)
            scores = (qh @ k[h, :kend].T).reshape(group, nb, kend)
            scores[:, :, offset + b0:kend] += _HIDDEN[:nb, :nb]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            total = scores.sum(axis=-1, keepdims=True)
            res = (scores.reshape(group * nb, kend) @ v[h, :kend]).reshape(group, nb, -1)
            out[heads, b0:b1] = res / total
    return out


def tiled(q, k, v, scale):
    return ca.run_tiles(q, k, v, scale, ca.causal_tiles(q.shape[1], k.shape[1], q.shape[0] // k.shape[0]))


def tiled_parts(q, k, v, scale) -> dict:
    """(c)'s time in its parts over every tile, one thread: QK^T, softmax, PV (seconds) and FLOPs."""
    group, parts = q.shape[0] // k.shape[0], {"qk": 0.0, "softmax": 0.0, "pv": 0.0, "flop": 0, "scores": 0}
    with ca._one_blas_thread:
        for q0, q1, c0, c1, lo, hi in ca.causal_tiles(q.shape[1], k.shape[1], group):
            for h in range(k.shape[0]):
                qh = (q[h * group:(h + 1) * group, q0:q1] * np.float32(scale)).reshape(group * (q1 - q0), -1)
                s, tot = np.empty((qh.shape[0], c1 - c0), np.float32), np.empty(qh.shape[0], np.float32)
                t0 = time.perf_counter()
                np.matmul(qh, k[h, c0:c1].T, out=s)
                t1 = time.perf_counter()
                ca.softmax_ranges(s, lo, hi, q1 - q0, tot)
                t2 = time.perf_counter()
                s @ v[h, c0:c1]
                t3 = time.perf_counter()
                parts["qk"] += t1 - t0
                parts["softmax"] += t2 - t1
                parts["pv"] += t3 - t2
                parts["flop"] += 4 * s.size * q.shape[2]
                parts["scores"] += s.size
    return parts


def prefill_attention_main() -> None:
    ap = argparse.ArgumentParser(description=PREFILL_ATTENTION_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=list(ATTENTION_SHAPES), choices=list(ATTENTION_SHAPES))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    rng, n = np.random.default_rng(0), args.tokens
    print(f"load {os.getloadavg()[0]:.2f}; {n} queries over {n} keys; ms per call, best of {args.rounds}")
    print("| arch | heads / KV / dim | (a) numpy passes | (b) + 1 BLAS thread | (c) tiled, 1 thread | "
          f"(d) tiled, {args.threads} threads | (c) split: QK / softmax / PV ms | GFLOP (exact causal) |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for arch in args.archs:
        heads, kv, dim = ATTENTION_SHAPES[arch]
        q = rng.standard_normal((heads, n, dim), dtype=np.float32)
        k, v = rng.standard_normal((kv, n, dim), dtype=np.float32), rng.standard_normal((kv, n, dim), dtype=np.float32)
        scale, best = dim ** -0.5, {}
        tiled(q, k, v, scale)  # compile
        for _ in range(args.rounds):
            for name, threads, fn in (("a", None, numpy_passes), ("b", 1, numpy_passes), ("c", 1, tiled),
                                      ("d", args.threads, tiled)):
                ca.set_threads(threads or 1)
                t0 = time.perf_counter()
                if name == "b":
                    with ca._one_blas_thread:
                        fn(q, k, v, scale)
                else:
                    fn(q, k, v, scale)
                best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
        p = tiled_parts(q, k, v, scale)
        exact = 4 * heads * dim * n * (n + 1) / 2
        print(f"| {arch} | {heads} / {kv} / {dim} | " + " | ".join(f"{best[x] * 1e3:.0f}" for x in "abcd")
              + f" | {p['qk'] * 1e3:.0f} / {p['softmax'] * 1e3:.0f} / {p['pv'] * 1e3:.0f} "
              f"({p['flop'] / (p['qk'] + p['pv']) / 1e9:.0f} GFLOP/s, {p['softmax'] / p['scores'] * 1e9:.2f} ns a score)"
              f" | {p['flop'] / 1e9:.1f} ({exact / 1e9:.1f}) |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


# ---- prefill-weights -----------------------------------------------------------------------------

PREFILL_WEIGHTS_DOC = """Prefill products over a GGUF's weights three ways: the time of x @ W.T for every layer matrix.

(a) float32 weights through MLX's matmul (OpenBLAS: today's `--cpu-weights f32` prefill),
(b) MLX's quantized layers (mx.quantized_matmul over the blocks repacked as affine groups of 32),
(c) one dequantized tile (prefill.TILE_BYTES) at a time into a reused scratch + OpenBLAS (quant/prefill.py).
Usage: python -m bench prefill-weights [GGUF] [--tokens 512 2048] [--repeat 2] [--ways abc]. Prints ms per
token-piece summed over the layer matrices (the LM head apart), best of the repeats.
"""


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def prefill_weights_main() -> None:
    ap = argparse.ArgumentParser(description=PREFILL_WEIGHTS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ways", default="abc", help="which of a, b, c to time (b takes ~30x a's time here)")
    opts = ap.parse_args()
    from mlxcel_py.models.cpu.blas import preload_blas, set_blas_threads

    blas = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX
    import mlx.core as mx

    from mlxcel_py.models.gguf_file import read_gguf
    from mlxcel_py.models.gguf_tensors import dense, quantized
    from mlxcel_py.models.loader import default_model_path
    from mlxcel_py.models.cpu.quant.blocks import from_tensor_info

    set_blas_threads(opts.threads)
    gguf = read_gguf(Path(opts.gguf or default_model_path()))
    infos = [i for n, i in gguf.tensors.items() if n.startswith("blk.") and len(i.shape) == 2]
    blocks = [from_tensor_info(i) for i in infos]
    f32 = [dense(i) for i in infos]
    qs = [quantized(i, mx.float32) for i in infos]
    mx.eval(f32, [[q.weight, q.scales, q.biases] for q in qs])
    print(f"{gguf.path.name}: {len(infos)} matrices, BLAS {blas.name}, {opts.threads} threads")
    for m in opts.tokens:
        x = np.random.default_rng(0).standard_normal((m, infos[0].shape[-1]), dtype=np.float32)
        xs = {k: mx.array(np.ascontiguousarray(x[:, :1]).repeat(k, 1)) for k in {i.shape[-1] for i in infos}}
        xn = {k: np.array(v) for k, v in xs.items()}

        def run_a():
            mx.eval([xs[w.shape[1]] @ w.T for w in f32])

        def run_b():
            mx.eval([mx.quantized_matmul(xs[w.shape[1]], q.weight, q.scales, q.biases, transpose=True,
                                         group_size=32, bits=q.bits) for w, q in zip(f32, qs)])

        def run_c():
            for w in blocks:
                prefill.matmul_tiled(xn[w.shape[1]], w)

        ways = (("a f32+BLAS", run_a), ("b mx.quantized_matmul", run_b), ("c tiles+BLAS", run_c))
        for name, fn in (w for w in ways if w[0][0] in opts.ways):
            fn()  # warm up (numba compile, BLAS buffers)
            print(f"  {m:>5} tokens  {name:<22} {_best(fn, opts.repeat) * 1e3:9.1f} ms")


# kquant-repack: the Q4_K and Q6_K products over the file's rows (quant/kblock.py) against the same weights
# repacked eight rows at a time (quant/kquant_r8.py), per type, row width, input rows and threads.
K_TYPES = ("Q4_K", "Q6_K")
KQUANT_REPACK_DOC = """The K-quant products two ways: kblock (one weight row a call, the file's layout) and r8 (eight rows
a call, kquant_r8.repack's layouts), over the same random Q4_K or Q6_K weights and int8 input rows.

Usage: python -m bench kquant-repack [--types Q4_K Q6_K] [--hidden 1536 2048 3072 4096] [--ffn 8960]
                                  [--inputs 1 4] [--threads 1 2] [--repeat 15] [--mb 256]

Per type and hidden size (the row width) the weights are layers of a gate/up product's, 2 x `--ffn` rows,
as many as make `--mb` MB so that a round reads from memory, not the caches. Columns: `GB/s` (the
file's bytes over the best round's wall time, the two kernels' rounds alternating in one process);
`in-L2 ns` (one thread, ~400 KB of rows read 200 times: the compute per block and input row, the memory
out of the way). The CPU is named on the first line. About 1 minute a type on 2 cores."""


@njit(cache=True)
def _r8_loop_kblock(qtype, reps, raw, xq, xd, xs, out, units):  # pragma: no cover - jitted
    for _ in range(reps):
        kblock_rows(qtype, raw, 0, raw.shape[0], xq, xd, xs, out, 0, units)


@njit(cache=True)
def _r8_loop_r8(qtype, reps, raw, xq, xd, xs, out, units):  # pragma: no cover - jitted
    for _ in range(reps):
        r8_rows(qtype, raw, 0, raw.shape[0], xq, xd, xs, out, 0, units)


def _k_rows(name: str, rows: int, width: int, rng) -> np.ndarray:
    """Random blocks of type `name` with finite float16 scales (d, and Q4_K's dmin)."""
    raw = rng.integers(0, 256, (rows, width // 256, kquant_r8.BLOCK_BYTES[int(T[name])]), dtype=np.uint8)
    at = [0, 2] if name == "Q4_K" else [208]
    for a in at:
        raw[:, :, a: a + 2] = np.array([0.01], np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def _r8_memory(qtype: int, raws, r8s, x, threads: int, repeat: int) -> tuple[float, float]:
    """Best GB/s of each kernel over the layers' products in turn (the pair alternating each round)."""
    units = x.shape[1] // 256
    q = kblock.quantize(x)
    out = np.zeros((x.shape[0], raws[0].shape[0]), np.float32)
    best = [np.inf, np.inf]
    for _ in range(repeat):
        for i in range(2):
            t = time.perf_counter()
            for raw, r8 in zip(raws, r8s):
                if i == 0:
                    kblock.stream_kblock(qtype, *q, raw, out, threads, units)
                else:
                    kquant_r8.stream_r8(qtype, *q, r8, out, threads, units)
            best[i] = min(best[i], time.perf_counter() - t)
    total = sum(r.nbytes for r in raws)
    return total / best[0] / 1e9, total / best[1] / 1e9


def _r8_in_l2(name: str, width: int, inputs: int, rng) -> tuple[float, float]:
    qtype = int(T[name])
    rows = max(8, int(400e3 / (width // 256 * kquant_r8.BLOCK_BYTES[int(T[name])])) // 8 * 8)
    raw = _k_rows(name, rows, width, rng)
    r8 = kquant_r8.repack(raw, qtype)
    q = kblock.quantize(rng.standard_normal((inputs, width)).astype(np.float32))
    out = np.zeros((inputs, rows), np.float32)
    got = []
    for loop, w in ((_r8_loop_kblock, raw), (_r8_loop_r8, r8)):
        loop(qtype, 1, w, *q, out, width // 256)
        best = np.inf
        for _ in range(5):
            t = time.perf_counter()
            loop(qtype, 200, w, *q, out, width // 256)
            best = min(best, time.perf_counter() - t)
        got.append(best / 200 / (rows * width // 256) / inputs * 1e9)
    return got[0], got[1]


def kquant_repack_main() -> None:
    ap = argparse.ArgumentParser(description=KQUANT_REPACK_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=list(K_TYPES), choices=list(K_TYPES))
    ap.add_argument("--hidden", type=int, nargs="+", default=[1536, 2048, 3072, 4096])
    ap.add_argument("--ffn", type=int, default=8960)
    ap.add_argument("--inputs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--mb", type=int, default=256, help="weight bytes a round reads (past the caches)")
    args = ap.parse_args()
    if not kquant_r8.AVAILABLE:
        raise SystemExit("kquant-repack: the repacked product needs x86 with AVX2 and FMA")
    rng = np.random.default_rng(0)
    print(cpu_line())
    print(f"{'type':4s} {'hidden':>6} {'inputs':>6} {'thr':>3} {'kblock GB/s':>11} {'r8 GB/s':>8} {'in-L2 ns kblock':>15} {'r8':>5}")
    for name in args.types:
        qtype = int(T[name])
        for width in args.hidden:
            raw = _k_rows(name, 2 * args.ffn // 8 * 8, width, rng)
            layers = max(1, -(-args.mb * 1_000_000 // raw.nbytes))  # copies, so the rounds read past the caches
            raws = [raw] + [raw.copy() for _ in range(layers - 1)]
            r8s = [kquant_r8.repack(r, qtype) for r in raws]
            for inputs in args.inputs:
                x = rng.standard_normal((inputs, width)).astype(np.float32)
                ns = _r8_in_l2(name, width, inputs, rng)
                for threads in args.threads:
                    a, b = _r8_memory(qtype, raws, r8s, x, threads, args.repeat)
                    print(f"{name:4s} {width:6d} {inputs:6d} {threads:3d} {a:11.1f} {b:8.1f} {ns[0]:15.2f} {ns[1]:5.2f}",
                          flush=True)
