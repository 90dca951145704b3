"""Prefill attention alone on each architecture's shape (2,048 queries over 2,048 keys by default): the
candidates side by side, then the chosen kernel's time split into its two products and its softmax.

(a) numpy passes, numpy's BLAS on its own threads: the kernel before (query blocks of 256, the scores
    masked, max, subtracted, exp'd and summed by numpy over the whole block);
(b) the same with numpy's BLAS on one thread;
(c) models/cpu/prefill_attention.py (tiles of ~256 rows, one BLAS thread, the numba softmax over only the seen
    keys) on one thread, and (d) on --threads threads (the shipped path).
Usage: bench/bench_prefill_attention.py [--archs llama qwen3 ...] [--tokens 2048] [--rounds 2] [--threads 2].
Prints ms per call, best of the interleaved rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

__import__("mlxcel_py")  # OPENBLAS_THREAD_TIMEOUT as the server has it, before numpy loads BLAS

import numpy as np  # noqa: E402
from mlxcel_py.models.cpu import prefill_attention as ca  # noqa: E402

SHAPES = {  # heads, KV heads, head dim: SmolLM2-135M's and bench/synthetic_archs.py's presets
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


def split(q, k, v, scale) -> dict:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=list(SHAPES), choices=list(SHAPES))
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
        heads, kv, dim = SHAPES[arch]
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
        p = split(q, k, v, scale)
        exact = 4 * heads * dim * n * (n + 1) / 2
        print(f"| {arch} | {heads} / {kv} / {dim} | " + " | ".join(f"{best[x] * 1e3:.0f}" for x in "abcd")
              + f" | {p['qk'] * 1e3:.0f} / {p['softmax'] * 1e3:.0f} / {p['pv'] * 1e3:.0f} "
              f"({p['flop'] / (p['qk'] + p['pv']) / 1e9:.0f} GFLOP/s, {p['softmax'] / p['scores'] * 1e9:.2f} ns a score)"
              f" | {p['flop'] / 1e9:.1f} ({exact / 1e9:.1f}) |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
