"""Decode A/B per architecture, in process: mlx-lm's batched forward against the numba CPU step.

    python bench/bench_arch_decode.py [--steps 16] [--rows 1 4] [--threads 1] [--prefill 256] [--prefill-ab 2048]

For each architecture (llama, qwen2, qwen3, gemma3, phi3): a random float32 model of one shape
(12 layers, hidden 640, ffn 2048, vocab 32,768; gemma3 with its 4 x 256 heads, 1 KV head and a
window of 512 on five layers of six, the others 10 x 64 heads and 2 KV heads; ~100M parameters) built
from mlx-lm's own classes, then from identical prefilled caches (`--prefill` tokens a row) `--steps`
greedy decode steps each way. Prints ms per step and tokens/s, and the speed-up. Also the tiny GGUF
fixtures (tests/fixtures/gguf), where the step's fixed costs dominate. `--prefill-ab N`: one N-token
prefill per synthetic model through mlx-lm without and with the numpy prefill kernels.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))  # before anything imports MLX

SHAPE = dict(hidden_size=640, num_hidden_layers=12, intermediate_size=2048, vocab_size=32768,
             rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True)
PER_ARCH = {
    "llama": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=10000.0),
    "qwen2": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=1e6),
    "qwen3": dict(num_attention_heads=10, num_key_value_heads=2, head_dim=64, rope_theta=1e6),
    "gemma3_text": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                        sliding_window_pattern=6, query_pre_attn_scalar=256, rope_theta=1e6),
    "phi3": dict(num_attention_heads=10, num_key_value_heads=2, rope_theta=10000.0),
}


def synthetic(arch: str):
    import mlx.core as mx
    from mlxcel_py.models.gguf_fixups import _full_kv_caches

    module = importlib.import_module(f"mlx_lm.models.{arch}")
    args = module.ModelArgs.from_dict({"model_type": arch, **SHAPE, **PER_ARCH[arch]})
    model = module.Model(args)
    if arch == "gemma3_text":
        model.tie_word_embeddings = True
        model.pop("lm_head")
        _full_kv_caches(model)  # as the GGUF loader does: a KVCache and a window mask per layer
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def time_steps(step, tokens, steps: int) -> float:
    """Seconds per step (after one warm-up step), greedy on the step's own logits."""
    import mlx.core as mx
    import numpy as np

    tokens = np.array(step(tokens)).argmax(-1).tolist()
    start = time.perf_counter()
    for _ in range(steps):
        logits = step(tokens)
        mx.eval(logits)
        tokens = np.array(logits).argmax(-1).tolist()
    return (time.perf_counter() - start) / steps


def ab(name: str, model, rows: int, prefill: int, steps: int, threads: int) -> None:
    import mlx.core as mx

    from mlxcel_py.models.cpu.decoder import decoder_for
    from test_cpu_decode import make_batch, prompt

    from mlxcel_py.models.cpu.prefill_kernels import kernels_for

    decoder = decoder_for(model, threads)
    assert decoder is not None, name
    prompts = [prompt(prefill - 7 * r, r) for r in range(rows)]
    with kernels_for(model):  # the numpy prefill kernels: the caches only
        theirs, ours = make_batch(model, prompts), make_batch(model, prompts)
    first = [p[-1] for p in prompts]
    mlx_s = time_steps(lambda t: model(mx.array(t)[:, None], cache=theirs)[:, -1, :], first, steps)
    ours_s = time_steps(lambda t: decoder(t, ours), first, steps)
    print(f"{name:14s} rows {rows}: mlx-lm {mlx_s * 1e3:7.1f} ms/step ({rows / mlx_s:6.1f} tok/s)  "
          f"numba step {ours_s * 1e3:7.1f} ms/step ({rows / ours_s:6.1f} tok/s)  x{mlx_s / ours_s:.2f}", flush=True)


def prefill_ab(arch: str, model, tokens: int) -> None:
    """One prefill of `tokens` tokens (one piece, a fresh cache) through mlx-lm, without and with the
    numpy prefill kernels; logits compared."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.models.cpu.prefill_kernels import kernels_for
    from test_cpu_decode import prompt

    ids = mx.array([prompt(tokens, 9)])

    def once():
        start = time.perf_counter()
        out = model(ids, cache=make_prompt_cache(model))[:, -1]
        mx.eval(out)
        return time.perf_counter() - start, np.array(out)

    plain, want = once()
    with kernels_for(model):
        fast, got = once()
    print(f"{arch}-100M prefill {tokens}: mlx-lm {plain:6.2f} s, with the numpy kernels {fast:6.2f} s  "
          f"x{plain / fast:.2f} (last logits within {float(np.abs(got - want).max()):.1e})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--archs", nargs="+", default=list(PER_ARCH))
    parser.add_argument("--no-fixtures", action="store_true")
    parser.add_argument("--prefill-ab", type=int, default=0, help="also time one prefill of this many tokens")
    opts = parser.parse_args()
    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.blas import set_blas_threads

    set_blas_threads(opts.threads)
    from mlxcel_py.models.cpu.blas import loaded_blas

    print(f"BLAS {loaded_blas().name} {loaded_blas().note}; cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; threads {opts.threads}, "
          f"prefill {opts.prefill} tokens a row, {opts.steps} steps")
    for arch in opts.archs:
        model = synthetic(arch)
        for rows in opts.rows:
            ab(f"{arch}-100M", model, rows, opts.prefill, opts.steps, opts.threads)
        if opts.prefill_ab:
            prefill_ab(arch, model, opts.prefill_ab)
        del model
    if opts.no_fixtures:
        return
    for name in ("llama-f16", "qwen2-f16", "qwen3-f16", "gemma3-f16", "phi3long-f16"):
        lm = load_model(str(ROOT / "tests/fixtures/gguf" / f"{name}.gguf"), threads=opts.threads, cpu_weights="f32")
        for rows in opts.rows:
            ab(name, lm.model, rows, 64, opts.steps, opts.threads)


if __name__ == "__main__":
    main()
