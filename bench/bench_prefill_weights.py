"""Prefill products over a GGUF's weights three ways: the time of x @ W.T for every layer matrix.

(a) float32 weights through MLX's matmul (OpenBLAS: today's `--cpu-weights f32` prefill),
(b) MLX's quantized layers (mx.quantized_matmul over the blocks repacked as affine groups of 32),
(c) one dequantized tile (prefill.TILE_BYTES) at a time into a reused scratch + OpenBLAS (quant/prefill.py).
Usage: bench/bench_prefill_weights.py [GGUF] [--tokens 512 2048] [--repeat 2] [--ways abc]. Prints ms per
token-piece summed over the layer matrices (the LM head apart), best of the repeats.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas, set_blas_threads  # noqa: E402

BLAS = preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from pathlib import Path  # noqa: E402

from mlxcel_py.models.gguf_file import read_gguf  # noqa: E402
from mlxcel_py.models.gguf_tensors import dense, quantized  # noqa: E402
from mlxcel_py.models.loader import default_model_path  # noqa: E402
from mlxcel_py.models.cpu.quant import prefill  # noqa: E402
from mlxcel_py.models.cpu.quant.blocks import from_tensor_info  # noqa: E402


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("gguf", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ways", default="abc", help="which of a, b, c to time (b takes ~30x a's time here)")
    opts = ap.parse_args()
    set_blas_threads(opts.threads)
    gguf = read_gguf(Path(opts.gguf or default_model_path()))
    infos = [i for n, i in gguf.tensors.items() if n.startswith("blk.") and len(i.shape) == 2]
    blocks = [from_tensor_info(i) for i in infos]
    f32 = [dense(i) for i in infos]
    qs = [quantized(i, mx.float32) for i in infos]
    mx.eval(f32, [[q.weight, q.scales, q.biases] for q in qs])
    print(f"{gguf.path.name}: {len(infos)} matrices, BLAS {BLAS.name}, {opts.threads} threads")
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


if __name__ == "__main__":
    main()
