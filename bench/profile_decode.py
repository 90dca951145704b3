"""Where a decode step's time goes: per op class, at batch 1, 4 and 8, next to the memory-bus floor.

Usage: .venv/bin/python bench/profile_decode.py [--model PATH] [--batch 1 4 8] [--steps 12]
                                                [--paths mlx numpy] [--no-engine]

Two paths over the same weights: `mlx` is mlx-lm's `model(tokens, cache=...)` (what the runner
ran before models/cpu/decoder.py), `numpy` is CpuDecoder. MLX is lazy, so its per-class times
come from a copy of mlx-lm's llama forward with an `mx.eval` after every class; that barrier
costs something per eval, so the classes sum to more than the real (unbarriered) step, and
both are printed. numpy runs eagerly: its classes are timed directly around the same calls
CpuDecoder makes. Engine bookkeeping is the engine tick minus the runner's decode call, from
bench_engine.run_ours. The floor is the bytes a step must read (weights + KV) at the read
bandwidth measured here (best of numpy sum and the streaming kernel, 1 GiB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.base import create_attention_mask  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlxcel_py.models import load_model  # noqa: E402
from mlxcel_py.models.cpu import decoder as cpu_decode  # noqa: E402
from mlxcel_py.models.cpu import decode_kernels as K  # noqa: E402

CLASSES = ("q/k/v proj", "o proj", "gate/up proj", "down proj", "LM head", "attention + KV write",
           "norms, rope, SwiGLU, residuals", "step setup (embed, mask, KV)", "sampling (greedy)")


class Timer:
    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.total[name] += time.perf_counter() - start


def read_bandwidth() -> float:
    """GB/s reading 1 GiB: the best of numpy's sum and the decode kernel streaming a weight."""
    big = np.ones((1 << 18, 1024), dtype=np.float32)
    x, out = np.ones((1, 1024), np.float32), np.empty((1, 1 << 18), np.float32)
    best = 0.0
    for fn in (lambda: big.sum(), lambda: K.linear(x, big, out)):
        fn()
        for _ in range(3):
            start = time.perf_counter()
            fn()
            best = max(best, big.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def make_batch(model, prompts: list[list[int]]) -> list:
    """Per-layer BatchKVCache rows, merged as the runner joins prefilled sequences."""
    rows = []
    for p in prompts:
        cache = make_prompt_cache(model)
        model(mx.array([p]), cache=cache)
        mx.eval([c.state for c in cache])
        rows.append(cache)
    batch = [layer.merge([layer]) for layer in rows[0]]
    for row in rows[1:]:
        for b, layer in zip(batch, row):
            b.extend(layer.merge([layer]))
    return batch


def mlx_step(model, tokens: list[int], caches: list, tm: Timer) -> mx.array:
    """mlx-lm's llama forward (models/llama.py), with an eval after each op class."""
    from mlx_lm.models import llama

    inner, rows = model.model, len(tokens)
    ew = "norms, rope, SwiGLU, residuals"
    with tm("step setup (embed, mask, KV)"):
        h = inner.embed_tokens(mx.array(tokens)[:, None])
        mask = create_attention_mask(h, caches[0])
        mx.eval(h, mask)
    for layer, c in zip(inner.layers, caches):
        a, m = layer.self_attn, layer.mlp
        with tm(ew):
            x = layer.input_layernorm(h)
            mx.eval(x)
        with tm("q/k/v proj"):
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
            mx.eval(q, k, v)
        with tm(ew):
            q = a.rope(q.reshape(rows, 1, a.n_heads, -1).transpose(0, 2, 1, 3), offset=c.offset)
            k = a.rope(k.reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3), offset=c.offset)
            v = v.reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            mx.eval(q, k, v)
        with tm("attention + KV write"):
            keys, values = c.update_and_fetch(k, v)
            o = llama.scaled_dot_product_attention(q, keys, values, cache=c, scale=a.scale, mask=mask)
            o = o.transpose(0, 2, 1, 3).reshape(rows, 1, -1)
            mx.eval(o)
        with tm("o proj"):
            o = a.o_proj(o)
            mx.eval(o)
        with tm(ew):
            h = h + o
            x = layer.post_attention_layernorm(h)
            mx.eval(h, x)
        with tm("gate/up proj"):
            g, u = m.gate_proj(x), m.up_proj(x)
            mx.eval(g, u)
        with tm(ew):
            s = llama.swiglu(g, u)
            mx.eval(s)
        with tm("down proj"):
            d = m.down_proj(s)
            mx.eval(d)
        with tm(ew):
            h = h + d
            mx.eval(h)
    with tm(ew):
        h = inner.norm(h)
        mx.eval(h)
    with tm("LM head"):
        logits = inner.embed_tokens.as_linear(h)[:, -1, :] if model.args.tie_word_embeddings else model.lm_head(h)[:, -1, :]
        mx.eval(logits)
    return logits


def numpy_step(dec, tokens: list[int], caches: list, tm: Timer) -> mx.array:
    """CpuDecoder.__call__ with its layer_step taken apart into the same kernels, timed per class."""
    rows, ew = len(tokens), "norms, rope, SwiGLU, residuals"
    with tm("step setup (embed, mask, KV)"):
        positions, left_pad, views = dec._kv.begin(caches, rows)
        cos, sin = dec._rope.at(positions)
        h = dec._embed[np.asarray(tokens)]
        idx = caches[0]._idx
    for w, (keys, values) in zip(dec._layers, views):
        with tm(ew):
            x = K.rms_norm(h, w.norm1, dec.eps)
        with tm("q/k/v proj"):
            qkv = K.product(x, w.qkv)
        with tm(ew):
            K.rope(qkv, cos, sin, dec.heads + dec.kv_heads, dec.head_dim)
        with tm("attention + KV write"):
            K.write_kv(qkv, keys, values, idx, dec.heads)
            o = K.attend(qkv, keys, values, idx + 1, left_pad, dec.heads, dec.scale)
        with tm("o proj"):
            h += K.product(o, w.o)
        with tm(ew):
            x = K.rms_norm(h, w.norm2, dec.eps)
        with tm("gate/up proj"):
            gu = K.product(x, w.gate_up)
        with tm(ew):
            s = K.silu_mul(gu)
        with tm("down proj"):
            h += K.product(s, w.down)
    with tm("step setup (embed, mask, KV)"):
        dec._kv.end(caches, positions)
    with tm(ew):
        h = K.rms_norm(h, dec._norm, dec.eps)
    with tm("LM head"):
        logits = mx.array(K.linear(h, dec._head))
    return logits


def profile(path: str, lm, prompts: list[list[int]], steps: int) -> tuple[dict[str, float], float]:
    """(median ms per class, median ms of the real step) over `steps` steps, after 2 warm-ups."""
    model, dec = lm.model, lm.cpu_decode
    per_step: dict[str, list[float]] = defaultdict(list)
    caches, tokens = make_batch(model, prompts), [p[-1] for p in prompts]
    for i in range(steps + 2):
        tm = Timer()
        logits = (numpy_step(dec, tokens, caches, tm) if path == "numpy" else mlx_step(model, tokens, caches, tm))
        with tm("sampling (greedy)"):
            tokens = mx.argmax(logits, axis=-1).tolist()
        if i >= 2:
            for name in CLASSES:
                per_step[name].append(tm.total[name])
    real, caches, tokens = [], make_batch(model, prompts), [p[-1] for p in prompts]
    for i in range(steps + 2):
        start = time.perf_counter()
        if path == "numpy":
            logits = dec(tokens, caches)
        else:
            logits = model(mx.array(tokens)[:, None], cache=caches)[:, -1, :]
        tokens = mx.argmax(logits, axis=-1).tolist()
        if i >= 2:
            real.append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e3 for k, v in per_step.items()}, statistics.median(real) * 1e3


def engine_overhead(lm, prompts: list[list[int]], tokens: int) -> float:
    from bench_engine import run_ours

    run_ours(lm, [tuple(p) for p in prompts], 4)
    return run_ours(lm, [tuple(p) for p in prompts], tokens)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--paths", nargs="+", default=["mlx", "numpy"], choices=["mlx", "numpy"])
    ap.add_argument("--no-engine", action="store_true", help="skip the engine bookkeeping runs")
    args = ap.parse_args()
    models = {}
    if "numpy" in args.paths:
        models["numpy"] = load_model(args.model)
    if "mlx" in args.paths:  # a second copy with mlx-lm's own weight layout and decode
        make, cpu_decode.decoder_for = cpu_decode.decoder_for, lambda model, threads=1: None
        models["mlx"] = load_model(args.model)
        cpu_decode.decoder_for = make
    lm = next(iter(models.values()))
    from bench_engine import prompts as chat_prompts

    weight_bytes = sum(v.nbytes for _, v in tree_flatten(lm.model.parameters()))
    bw = read_bandwidth()
    print(f"model: {lm.description}\nweights {weight_bytes / 1e9:.3f} GB, read bandwidth {bw:.1f} GB/s, "
          f"load {os.getloadavg()[0]:.2f}, {args.steps} steps per median")
    for rows in args.batch:
        prompts = [list(p) for p in chat_prompts(lm, rows)]
        results = {path: profile(path, m, prompts, args.steps) for path, m in models.items()}
        overhead = {path: engine_overhead(m, prompts, 32) for path, m in models.items()} if not args.no_engine else {}
        args_ = lm.model.args
        kv_bytes = rows * args_.num_hidden_layers * 2 * args_.num_key_value_heads * (args_.hidden_size // args_.num_attention_heads) * 4 * (
            statistics.mean(len(p) for p in prompts) + args.steps)
        floor = (weight_bytes + kv_bytes) / bw / 1e6
        paths = list(results)
        print(f"\nbatch {rows} (memory-bus floor {floor:.1f} ms/step = {rows * 1000 / floor:.0f} tok/s)")
        print("| op class | " + " | ".join(f"{p} ms" for p in paths) + " |")
        print("|---|" + "---:|" * len(paths))
        for name in CLASSES:
            print(f"| {name} | " + " | ".join(f"{results[p][0][name]:.2f}" for p in paths) + " |")
        print("| sum of classes | " + " | ".join(f"{sum(results[p][0].values()):.2f}" for p in paths) + " |")
        print("| real step (no barriers) | " + " | ".join(f"**{results[p][1]:.2f}**" for p in paths) + " |")
        if overhead:
            print("| engine bookkeeping per tick | " + " | ".join(f"{overhead[p]:.2f}" for p in paths) + " |")
        print("| decode tok/s (real step) | " + " | ".join(f"{rows * 1000 / results[p][1]:.1f}" for p in paths) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
