"""Each decode speed-up candidate, measured as a whole decode step on the default model.

Usage: .venv/bin/python bench/decode_candidates.py [--batch 1 4] [--steps 10] [--rounds 3] [--only NAME ...]

Prints ms per step (greedy sampling included), the median of `steps` steps after two warm-ups,
best of `rounds` rounds; the arms of a round run back to back so machine load hits all alike.
MLX arms run mlx-lm's llama forward, changed only as the arm says; numpy arms run CpuDecoder's
step, taken apart into its kernels where the arm swaps one (the product, or the elementwise ops).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from mlxcel_py.models.cpu.blas import preload_blas  # noqa: E402

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from mlxcel_py.models import load_model  # noqa: E402
from mlxcel_py.models.cpu import decoder as cpu_decode  # noqa: E402
from mlxcel_py.models.cpu import decode_kernels as K  # noqa: E402
from numba import njit, prange  # noqa: E402
from profile_decode import make_batch  # noqa: E402


def mlx_forward(model, tokens, caches):
    return model(mx.array(tokens)[:, None], cache=caches)[:, -1, :]


def fused_forward(fused):
    """mlx-lm's llama forward with one product for q/k/v and one for gate/up."""

    def forward(model, tokens, caches):
        inner, rows = model.model, len(tokens)
        h = inner.embed_tokens(mx.array(tokens)[:, None])
        mask = llama.create_attention_mask(h, caches[0])
        for layer, c, (wqkv, wgu) in zip(inner.layers, caches, fused):
            a = layer.self_attn
            qkv = layer.input_layernorm(h) @ wqkv.T
            nq, nk = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
            q = a.rope(qkv[..., :nq].reshape(rows, 1, a.n_heads, -1).transpose(0, 2, 1, 3), offset=c.offset)
            k = a.rope(qkv[..., nq : nq + nk].reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3), offset=c.offset)
            v = qkv[..., nq + nk :].reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            keys, values = c.update_and_fetch(k, v)
            o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=a.scale, mask=mask)
            h = h + a.o_proj(o.transpose(0, 2, 1, 3).reshape(rows, 1, -1))
            gu = layer.post_attention_layernorm(h) @ wgu.T
            ffn = gu.shape[-1] // 2
            h = h + layer.mlp.down_proj(llama.swiglu(gu[..., :ffn], gu[..., ffn:]))
        return inner.embed_tokens.as_linear(inner.norm(h))[:, -1, :]

    return forward


def compiled_forward(model):
    """mlx-lm's forward with each layer's MLP block and q/k/v+rope under mx.compile (the
    attention over a KV that grows every step would recompile every step)."""
    mlps = [mx.compile(lambda h, layer=layer: h + layer.mlp(layer.post_attention_layernorm(h))) for layer in model.model.layers]

    def qkv_fn(layer):
        a = layer.self_attn

        def fn(h, offset):
            x = layer.input_layernorm(h)
            rows = x.shape[0]
            q = a.rope(a.q_proj(x).reshape(rows, 1, a.n_heads, -1).transpose(0, 2, 1, 3), offset=offset)
            k = a.rope(a.k_proj(x).reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3), offset=offset)
            return q, k, a.v_proj(x).reshape(rows, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3)

        return mx.compile(fn)

    qkvs = [qkv_fn(layer) for layer in model.model.layers]

    def forward(model, tokens, caches):
        inner, rows = model.model, len(tokens)
        h = inner.embed_tokens(mx.array(tokens)[:, None])
        mask = llama.create_attention_mask(h, caches[0])
        for layer, c, mlp, qkv in zip(inner.layers, caches, mlps, qkvs):
            a = layer.self_attn
            q, k, v = qkv(h, c.offset)
            keys, values = c.update_and_fetch(k, v)
            o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=a.scale, mask=mask)
            h = mlp(h + a.o_proj(o.transpose(0, 2, 1, 3).reshape(rows, 1, -1)))
        return inner.embed_tokens.as_linear(inner.norm(h))[:, -1, :]

    return forward


def run_steps(model, prompts, steps, forward) -> float:
    caches, tokens, times = make_batch(model, prompts), [p[-1] for p in prompts], []
    for i in range(steps + 2):
        start = time.perf_counter()
        tokens = mx.argmax(forward(model, tokens, caches), axis=-1).tolist()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_pipelined(model, prompts, steps) -> float:
    """mlx-lm's generate_step overlap: build and async_eval step n+1 before reading step n."""
    caches, times = make_batch(model, prompts), []
    y = mx.argmax(mlx_forward(model, [p[-1] for p in prompts], caches), axis=-1)
    mx.async_eval(y)
    start = time.perf_counter()
    for i in range(steps + 2):
        nxt = mx.argmax(model(y[:, None], cache=caches)[:, -1, :], axis=-1)
        mx.async_eval(nxt)
        y.tolist()
        y = nxt
        now = time.perf_counter()
        if i >= 2:
            times.append(now - start)
        start = now
    return statistics.median(times) * 1e3


def graph_build_ms(model, prompts, steps) -> float:
    """Python time to build one step's MLX graph (no eval): what async_eval could hide."""
    caches, tokens, times = make_batch(model, prompts), [p[-1] for p in prompts], []
    for _ in range(steps):
        start = time.perf_counter()
        logits = mlx_forward(model, tokens, caches)
        times.append(time.perf_counter() - start)
        tokens = mx.argmax(logits, axis=-1).tolist()
    return statistics.median(times) * 1e3


def python_step(product, elementwise="numba"):
    """CpuDecoder's step with layer_step taken apart, `product` for every weight product;
    elementwise="numpy" runs norms/rope/attention/SwiGLU as numpy ops (the first version)."""

    def step(model, tokens, caches):
        dec, rows = DECODERS[id(model)], len(tokens)
        positions, left_pad, views = dec._kv.begin(caches, rows)
        cos, sin = dec._rope.at(positions)
        h, idx = dec._embed[np.asarray(tokens)], caches[0]._idx
        ops = K if elementwise == "numba" else NumpyOps
        for w, (keys, values) in zip(dec._layers, views):
            qkv = product(ops.rms_norm(h, w.norm1, dec.eps), w.qkv)
            ops.rope(qkv, cos, sin, dec.heads + dec.kv_heads, dec.head_dim)
            K.write_kv(qkv, keys, values, idx, dec.heads)
            h += product(ops.attend(qkv, keys, values, idx + 1, left_pad, dec.heads, dec.scale), w.o)
            h += product(ops.silu_mul(product(ops.rms_norm(h, w.norm2, dec.eps), w.gate_up)), w.down)
        dec._kv.end(caches, positions)
        return mx.array(product(K.rms_norm(h, dec._norm, dec.eps), dec._head))

    return step


class NumpyOps:
    """The first version's elementwise steps: plain numpy calls (~25 a layer)."""

    @staticmethod
    def rms_norm(h, weight, eps):
        return h * (1.0 / np.sqrt(np.mean(np.square(h), axis=-1, keepdims=True) + np.float32(eps))) * weight

    @staticmethod
    def rope(qkv, cos, sin, num_heads, dim):
        rows, half = qkv.shape[0], dim // 2
        x = qkv[:, : num_heads * dim].reshape(rows, num_heads, dim)
        x1, x2 = x[..., :half].copy(), x[..., half:].copy()
        c, s_ = cos[:, None], sin[:, None]
        x[..., :half] = x1 * c - x2 * s_
        x[..., half:] = x1 * s_ + x2 * c

    @staticmethod
    def attend(qkv, keys, values, end, left_pad, heads, scale):
        rows, kv_heads, _, dim = keys.shape
        q = qkv[:, : heads * dim].reshape(rows, kv_heads, heads // kv_heads, dim) * np.float32(scale)
        scores = np.matmul(q, keys[:, :, :end].transpose(0, 1, 3, 2))
        scores += np.where(np.arange(end)[None] < left_pad[:, None], -np.inf, 0.0).astype(np.float32)[:, None, None]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        out = np.matmul(scores, values[:, :, :end]) / scores.sum(axis=-1, keepdims=True)
        return out.reshape(rows, heads * dim)

    @staticmethod
    def silu_mul(gu):
        ffn = gu.shape[1] // 2
        g = gu[:, :ffn]
        return g / (1.0 + np.exp(-g)) * gu[:, ffn:]


@njit(fastmath=True, cache=True, parallel=True)
def _dots_parallel(x, w):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for n in prange(w.shape[0]):
        for b in range(x.shape[0]):
            acc = np.float32(0.0)
            for k in range(x.shape[1]):
                acc += x[b, k] * w[n, k]
            out[b, n] = acc
    return out


@njit(fastmath=True, cache=True)
def _dots(x, w):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for n in range(w.shape[0]):
        for b in range(x.shape[0]):
            acc = np.float32(0.0)
            for k in range(x.shape[1]):
                acc += x[b, k] * w[n, k]
            out[b, n] = acc
    return out


def numpy_arm(step):
    return lambda lm, prompts, steps: run_steps(lm.model, prompts, steps, step)


DECODERS: dict = {}  # id(model) -> the CpuDecoder the loader chose for it (LoadedModel.cpu_decode)


def split_calls(x, w):
    """The fused products as separate calls (q, k, v / gate, up): what fusing saves."""
    n = w.shape[0]
    parts = {960: (576, 768), 3072: (1536,)}.get(n)
    if not parts:
        return K.product(x, w)
    return np.concatenate([K.product(x, w[a:b]) for a, b in zip((0, *parts), (*parts, n))], axis=1)


def per_row_gemv(x, w):
    return np.stack([w @ row for row in x])


def arms(base, fast):
    fused = [(mx.concatenate([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight]),
              mx.concatenate([l.mlp.gate_proj.weight, l.mlp.up_proj.weight])) for l in base.model.model.layers]
    mx.eval(fused)
    return {
        "mlx-lm forward (before)": lambda lm, p, s: run_steps(base.model, p, s, mlx_forward),
        "mlx: async_eval pipelining": lambda lm, p, s: run_pipelined(base.model, p, s),
        "mlx: graph building alone": lambda lm, p, s: graph_build_ms(base.model, p, s),
        "mlx: fused qkv, gate+up": lambda lm, p, s: run_steps(base.model, p, s, fused_forward(fused)),
        "mlx: mx.compile per layer": lambda lm, p, s: run_steps(base.model, p, s, compiled_forward(base.model)),
        "numpy: OpenBLAS x @ w.T": numpy_arm(python_step(lambda x, w: x @ w.T)),
        "numpy: OpenBLAS GEMV per row": numpy_arm(python_step(per_row_gemv)),
        "numpy: dot-per-output kernel, 2 threads": numpy_arm(python_step(_dots_parallel)),
        "numpy: dot-per-output kernel, 1 thread": numpy_arm(python_step(_dots)),
        "numpy: tiled kernel, numpy elementwise": numpy_arm(python_step(K.product, "numpy")),
        "numpy: tiled kernel, q/k/v and gate/up unfused": numpy_arm(python_step(split_calls)),
        "numpy: tiled kernel, kernels called from Python": numpy_arm(python_step(K.product)),
        "numpy: tiled kernel, layer_step (chosen)": numpy_arm(lambda m, t, c: DECODERS[id(m)](t, c)),
    }


def transposed_arm(base_path):
    """mlx-lm forward with every Linear weight stored transposed (x @ W.T becomes a plain NN GEMM)."""
    lm = load_model(base_path)
    for _, m in lm.model.named_modules():
        if type(m).__name__ == "Linear":
            m.weight = mx.contiguous(m.weight.T).T
    mx.eval(lm.model.parameters())
    return lambda _lm, p, s: run_steps(lm.model, p, s, mlx_forward)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="+", default=None)
    args = ap.parse_args()
    fast = load_model(args.model)
    DECODERS[id(fast.model)] = fast.cpu_decode
    make, cpu_decode.decoder_for = cpu_decode.decoder_for, lambda model, threads=1: None
    base = load_model(args.model)
    table = arms(base, fast)
    table["mlx: weights pre-transposed"] = transposed_arm(args.model)
    cpu_decode.decoder_for = make
    if args.only:
        table = {k: v for k, v in table.items() if any(o in k for o in args.only)}
    from bench_engine import prompts as chat_prompts

    print(f"model: {fast.description}; load {os.getloadavg()[0]:.2f}")
    for rows in args.batch:
        prompts = [list(p) for p in chat_prompts(fast, rows)]
        runs: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(args.rounds):
            for name, fn in table.items():
                runs[name].append(fn(fast, prompts, args.steps))
        best = {name: min(v) for name, v in runs.items()}
        print(f"\nbatch {rows}, load {os.getloadavg()[0]:.2f}\n| candidate | ms/step | tok/s |\n|---|---:|---:|")
        for name, ms in best.items():
            print(f"| {name} | {ms:.1f} | {rows * 1000 / ms:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
