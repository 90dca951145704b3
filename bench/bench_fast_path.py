"""Prefill/decode timings of the default model on the CPU: the fast path against stock MLX.

Each arm runs in its own process, because the BLAS preload must precede `import mlx.core`.
    python bench/bench_fast_path.py            # all arms
    python bench/bench_fast_path.py --arm dense-openblas --tokens 512
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

# name -> (MLXCEL_BLAS, weights, prefill tokens, prefill runs); slow arms use 128 tokens, one run.
ARMS = {
    "dense-openblas": ("auto", "dense", 512, 3),
    "dense-reference": ("off", "dense", 512, 1),
    "quantized-stock": ("off", "quantized", 128, 1),
    "float16-openblas": ("auto", "float16", 128, 1),
}
DECODE_TOKENS = 16


def run_arm(blas: str, weights: str, num_tokens: int, runs: int) -> dict:
    """Load the default model one way; time a cold prefill (best of `runs`) and greedy decode steps."""
    from mlxcel_py.models.cpu.blas import preload_blas

    info = preload_blas(blas)
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.models import load_model

    model = load_model(None, dense=weights != "quantized")
    if weights == "float16":
        model.model.set_dtype(mx.float16)
    ids = mx.array([[(i * 7919) % 40000 + 100 for i in range(num_tokens)]])
    kernels = model.cpu_kernels or contextlib.nullcontext()  # the CPU prefill kernels' scope
    kernels.__enter__()
    mx.eval(model.model(ids[:, :8]))  # warm-up: first-call allocations
    head_s = time_lm_head(model.model, num_tokens)
    prefill = float("inf")
    for _ in range(runs):  # the machine may be shared: the best run is the least disturbed
        cache = make_prompt_cache(model.model)
        start = time.perf_counter()
        logits = model.model(ids, cache=cache)
        mx.eval(logits)
        prefill = min(prefill, time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        logits = model.model(mx.argmax(logits[:, -1:], axis=-1), cache=cache)
        mx.eval(logits)
    decode = (time.perf_counter() - start) / DECODE_TOKENS
    kernels.__exit__(None, None, None)
    label = "float16" if weights == "float16" else model.weights
    return {"blas": info.name, "weights": label, "tokens": num_tokens,
            "prefill_s": round(prefill, 3), "prefill_tok_s": round(num_tokens / prefill, 1),
            "decode_ms": round(decode * 1000, 1), "lm_head_s": round(head_s, 3)}


def time_lm_head(model, num_tokens: int) -> float:
    """Seconds of the output projection over every prompt position (prefill needs only the last)."""
    import mlx.core as mx

    hidden = mx.random.normal((1, num_tokens, model.args.hidden_size)).astype(model.model.norm.weight.dtype)
    mx.eval(hidden)
    start = time.perf_counter()
    head = model.lm_head if not model.args.tie_word_embeddings else model.model.embed_tokens.as_linear
    mx.eval(head(hidden))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=sorted(ARMS))
    parser.add_argument("--tokens", type=int, help="prefill length (default: per arm)")
    args = parser.parse_args()
    if args.arm:
        blas, weights, tokens, runs = ARMS[args.arm]
        print(json.dumps({"arm": args.arm, **run_arm(blas, weights, args.tokens or tokens, runs)}), flush=True)
        return
    print(f"{'arm':18} {'blas':10} {'weights':14} {'tokens':>6} {'prefill s':>10} {'tok/s':>8} "
          f"{'decode ms':>10} {'lm head s':>10}")
    for arm in ARMS:
        cmd = [sys.executable, __file__, "--arm", arm] + (["--tokens", str(args.tokens)] if args.tokens else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if out.returncode != 0:
            print(f"{arm:18} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{arm:18} {r['blas']:10} {r['weights']:14} {r['tokens']:>6} {r['prefill_s']:>10} "
              f"{r['prefill_tok_s']:>8} {r['decode_ms']:>10} {r['lm_head_s']:>10}", flush=True)


if __name__ == "__main__":
    main()
