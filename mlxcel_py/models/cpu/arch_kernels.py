"""numba kernels for the decode step of the architectures beyond plain llama (arch.py).

`arch_layer_step` is `decode_kernels.layer_step` with the parts an `ArchSpec` names: q/k/v
biases, per-head q/k RMS norms, the post-attention and post-MLP norms, GELU-tanh, and a sliding
window. An absent part is an empty array (one compiled kernel for every architecture). The native
step (native.py) runs the same sequence with its block products, through `attention_part`
and `mlp_part`, so both paths apply the parts in one order."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .decode_attention import exp2_fraction
from .decode_kernels import attend, product, rms_norm, rope, silu_mul, write_kv


SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


@njit(fastmath=True, cache=True, nogil=True)
def head_norm(qkv, weight, first, count, dim, eps):  # pragma: no cover - jitted
    """RMS norm, in place, of heads first..first + count - 1 of each row of qkv (qwen3/gemma3 q/k norms)."""
    for b in range(qkv.shape[0]):
        for h in range(first, first + count):
            base = h * dim
            total = np.float32(0.0)
            for i in range(dim):
                total += qkv[b, base + i] * qkv[b, base + i]
            scale = np.float32(1.0) / np.sqrt(total / np.float32(dim) + np.float32(eps))
            for i in range(dim):
                qkv[b, base + i] = qkv[b, base + i] * scale * weight[i]


@njit(fastmath=True, cache=True, nogil=True)
def gelu_mul(gate_up):  # pragma: no cover - jitted
    """gelu_tanh(gate) * up of a fused (B, 2F) gate|up product (mlx's `nn.gelu_approx`)."""
    ffn = gate_up.shape[1] // 2
    out = np.empty((gate_up.shape[0], ffn), dtype=np.float32)
    for b in range(gate_up.shape[0]):
        for i in range(ffn):
            g = gate_up[b, i]
            inner = SQRT_2_OVER_PI * (g + np.float32(0.044715) * g * g * g)
            out[b, i] = np.float32(0.5) * g * (np.float32(1.0) + np.tanh(inner)) * gate_up[b, ffn + i]
    return out


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", parallel=True)
def gelu_rows(g, out):  # pragma: no cover - jitted
    """out = gelu_tanh(g) of (R, F) float32 arrays in one pass, rows over numba's threads: the prefill's
    GELU (prefill_kernels.numpy_gelu_mul; numpy's nine passes took 0.11 s a 2,048-token Gemma 3 270M
    prompt)."""
    for b in prange(g.shape[0]):
        gelu_span(g, out, b, g.shape[1])


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def gelu_span(g, out, b, n):  # pragma: no cover - jitted
    """out[b, i] = gelu_tanh(g[b, i]) for i < n, as g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)) (the
    same function as 0.5 g (1 + tanh(...))), exp as decode_kernels.silu_mul_span's 2^n * p(f); a function
    of its own in the parallel loop, as silu_mul_span (numba's parfor passes reorder an inline body)."""
    bits = out.view(np.int32)
    for i in range(n):
        x = g[b, i]
        inner = SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)
        y = min(max(np.float32(-2.0) * inner * np.float32(1.4426950408889634), np.float32(-126.0)), np.float32(126.0))
        k = np.floor(y + np.float32(0.5))
        f = y - k
        bits[b, i] = (np.int32(k) + np.int32(127)) << 23
        out[b, i] = x / (np.float32(1.0) + out[b, i] * exp2_fraction(f))


@njit(fastmath=True, cache=True, nogil=True)
def add_bias(x, bias):  # pragma: no cover - jitted
    for b in range(x.shape[0]):
        for i in range(bias.shape[0]):
            x[b, i] += bias[i]


@njit(fastmath=True, cache=True, nogil=True)
def qkv_parts(qkv, bias, q_norm, k_norm, cos, sin, heads, kv_heads, dim, eps):  # pragma: no cover - jitted
    """The q/k/v product's parts before the KV write, in place: bias, q/k norms, RoPE (this and
    rows.attention_rows share them)."""
    if bias.shape[0]:
        add_bias(qkv, bias)
    if q_norm.shape[0]:
        head_norm(qkv, q_norm, 0, heads, dim, eps)
        head_norm(qkv, k_norm, heads, kv_heads, dim, eps)
    rope(qkv, cos, sin, heads + kv_heads, dim)


@njit(fastmath=True, cache=True, nogil=True)
def attention_part(qkv, bias, q_norm, k_norm, keys, values, idx, left_pad, cos, sin, heads, scale, eps,
                   width, window):  # pragma: no cover - jitted
    """From the q/k/v product to the attention output (before o): bias, q/k norms, RoPE, the KV write."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    qkv_parts(qkv, bias, q_norm, k_norm, cos, sin, heads, kv_heads, dim, eps)
    write_kv(qkv, keys, values, idx, heads, width)
    return attend(qkv, keys, values, idx + 1, left_pad, heads, scale, width, window)


@njit(fastmath=True, cache=True, nogil=True)
def residual(h, y, post_norm, eps):  # pragma: no cover - jitted
    """h += y, through the sandwich norm first when there is one (gemma3)."""
    if post_norm.shape[0]:
        h += rms_norm(y, post_norm, eps)
    else:
        h += y


@njit(fastmath=True, cache=True, nogil=True)
def activation(gate_up, gelu):  # pragma: no cover - jitted
    return gelu_mul(gate_up) if gelu else silu_mul(gate_up)


@njit(fastmath=True, cache=True, nogil=True)
def arch_layer_step(h, norm1, wqkv, bias, q_norm, k_norm, wo, post_attn, norm2, wgu, wd, post_ffn,
                    keys, values, idx, left_pad, cos, sin, heads, scale, eps, gelu, window,
                    width=1):  # pragma: no cover - jitted
    """One layer of any ArchSpec for `width` new tokens per row, h (B * width, hidden) in place (see
    decode_kernels.layer_step for the KV contract)."""
    qkv = product(rms_norm(h, norm1, eps), wqkv)
    att = attention_part(qkv, bias, q_norm, k_norm, keys, values, idx, left_pad, cos, sin, heads, scale,
                         eps, width, window)
    residual(h, product(att, wo), post_attn, eps)
    residual(h, product(activation(product(rms_norm(h, norm2, eps), wgu), gelu), wd), post_ffn, eps)


def warm_up() -> None:
    """Compile (or load from numba's cache) the arch kernels for the types a step passes."""
    f32 = np.float32
    h, w, none = np.zeros((1, 8), f32), np.zeros((8, 8), f32), np.zeros(0, f32)
    kv, trig, pad = np.zeros((1, 1, 4, 4), f32), np.zeros((1, 2), f32), np.zeros(1, np.int64)
    for width, gelu in ((1, True), (1, False)):
        arch_layer_step(h, h[0], np.zeros((16, 8), f32), none, none, none, w, none, h[0], np.zeros((16, 8), f32),
                        w, none, kv, kv.copy(), 0, pad, trig, trig, 2, 0.5, 1e-5, gelu, 0, width)
    h2, trig2 = np.zeros((2, 8), f32), np.zeros((2, 2), f32)
    arch_layer_step(h2, h[0], np.zeros((16, 8), f32), none, none, none, w, none, h[0], np.zeros((16, 8), f32),
                    w, none, kv, kv.copy(), 0, pad, trig2, trig2, 2, 0.5, 1e-5, False, 0, 2)
    attention_part(np.zeros((1, 16), f32), none, none, none, kv, kv.copy(), 0, pad, trig, trig, 2, 0.5, 1e-5, 1, 0)
    residual(h, h.copy(), none, 1e-5)
    activation(np.zeros((1, 16), f32), True)
