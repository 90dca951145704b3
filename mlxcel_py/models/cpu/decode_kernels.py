"""numba kernels for one decode step of a llama layer on the CPU (models/cpu/decoder.py).

The products: a decode step multiplies 1-8 rows by each weight matrix. OpenBLAS (through MLX
or numpy) packs the whole weight for such a GEMM and reads it two or three times; a GEMV
streams it once, but only for one row. `_stream` reads 4 weight rows at a time and multiplies
them with 4 input rows at once (16 accumulators, each a SIMD register once LLVM vectorizes
the k loop), so the weight crosses the memory bus once and the FMA units stay busy; leftover
input rows take a 4x1 kernel. The 4-row weight blocks are split over numba's threads (`--threads`;
each output row is computed whole by one thread, so the count changes no bit): on a quiet
machine two threads nearly halve a product, on a shared one their barrier, once per product,
costs more than they give (docs/CPU_DECODE.md).

The rest of the layer (RMS norms, RoPE, the KV write, attention, SwiGLU, residuals) is small
but is 20-odd numpy calls a layer; `layer_step` runs it all in one call.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .decode_attention import attend_desc, exp2_fraction


# Rows above which OpenBLAS's GEMM (its packing amortized) is as fast as `_stream`.
MAX_STREAM_ROWS = 16


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _tile4(x, w, out, b, n):  # pragma: no cover - jitted
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
    for k in range(x.shape[1]):
        w0, w1, w2, w3 = w[n, k], w[n + 1, k], w[n + 2, k], w[n + 3, k]
        x0, x1, x2, x3 = x[b, k], x[b + 1, k], x[b + 2, k], x[b + 3, k]
        a00 += x0 * w0
        a01 += x0 * w1
        a02 += x0 * w2
        a03 += x0 * w3
        a10 += x1 * w0
        a11 += x1 * w1
        a12 += x1 * w2
        a13 += x1 * w3
        a20 += x2 * w0
        a21 += x2 * w1
        a22 += x2 * w2
        a23 += x2 * w3
        a30 += x3 * w0
        a31 += x3 * w1
        a32 += x3 * w2
        a33 += x3 * w3
    out[b, n], out[b, n + 1], out[b, n + 2], out[b, n + 3] = a00, a01, a02, a03
    out[b + 1, n], out[b + 1, n + 1], out[b + 1, n + 2], out[b + 1, n + 3] = a10, a11, a12, a13
    out[b + 2, n], out[b + 2, n + 1], out[b + 2, n + 2], out[b + 2, n + 3] = a20, a21, a22, a23
    out[b + 3, n], out[b + 3, n + 1], out[b + 3, n + 2], out[b + 3, n + 3] = a30, a31, a32, a33


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _row4(x, w, out, b, n):  # pragma: no cover - jitted
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for k in range(x.shape[1]):
        xv = x[b, k]
        a0 += xv * w[n, k]
        a1 += xv * w[n + 1, k]
        a2 += xv * w[n + 2, k]
        a3 += xv * w[n + 3, k]
    out[b, n], out[b, n + 1], out[b, n + 2], out[b, n + 3] = a0, a1, a2, a3


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _row1(x, w, out, b, n):  # pragma: no cover - jitted
    acc = np.float32(0.0)
    for k in range(x.shape[1]):
        acc += x[b, k] * w[n, k]
    out[b, n] = acc


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", parallel=True)
def _stream(x, w, out):  # pragma: no cover - jitted
    rows, n_dim = x.shape[0], w.shape[0]
    rows4, n4 = rows - rows % 4, n_dim - n_dim % 4
    for block in prange(n4 // 4):  # 4 weight rows stay in L1 while every input row passes them
        n = block * 4
        for b in range(0, rows4, 4):
            _tile4(x, w, out, b, n)
        for b in range(rows4, rows):
            _row4(x, w, out, b, n)
    for n in range(n4, n_dim):
        for b in range(rows):
            _row1(x, w, out, b, n)


def linear(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`x @ w.T` for float32 x (B, K) and a C-contiguous float32 w (N, K); returns (B, N)."""
    if x.shape[0] > MAX_STREAM_ROWS:
        return np.matmul(x, w.T, out=out)
    if out is None:
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    _stream(np.ascontiguousarray(x), w, out)
    return out


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def rms_norm(h, weight, eps):  # pragma: no cover - jitted
    out = np.empty_like(h)
    for b in range(h.shape[0]):
        total = np.float32(0.0)
        for i in range(h.shape[1]):
            total += h[b, i] * h[b, i]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(h.shape[1]) + np.float32(eps))
        for i in range(h.shape[1]):
            out[b, i] = h[b, i] * scale * weight[i]
    return out


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def rope(qkv, cos, sin, num_heads, head_dim):  # pragma: no cover - jitted
    """Rotate-half RoPE, in place, of the first `num_heads` heads of each row (q, then k)."""
    half = head_dim // 2
    for b in range(qkv.shape[0]):
        for h in range(num_heads):
            base = h * head_dim
            for i in range(half):
                x1, x2 = qkv[b, base + i], qkv[b, base + half + i]
                qkv[b, base + i] = x1 * cos[b, i] - x2 * sin[b, i]
                qkv[b, base + half + i] = x1 * sin[b, i] + x2 * cos[b, i]


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def write_kv(qkv, keys, values, idx, heads, width=1):  # pragma: no cover - jitted
    """Store row r = b * width + j's new k and v (the parts of qkv after the q heads) at
    position idx + j of cache row b (width 1: one new token per row)."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    k0, v0 = heads * dim, (heads + kv_heads) * dim
    for r in range(qkv.shape[0]):
        b, j = r // width, r % width
        for kv in range(kv_heads):
            for d in range(dim):
                keys[b, kv, idx + j, d] = qkv[r, k0 + kv * dim + d]
                values[b, kv, idx + j, d] = qkv[r, v0 + kv * dim + d]


@njit(cache=True, nogil=True, error_model="numpy")
def attend(qkv, keys, values, end, left_pad, heads, scale, width=1, window=0):  # pragma: no cover - jitted
    """Row r = b * width + j's query against keys/values[b, kv, left_pad[b]:end + j] (causal
    within a verified span; width 1: one query per row); q is the head of qkv. window > 0: only
    the last `window` positions up to the query's own (a sliding-window layer, as llama.cpp).
    The loops are decode_attention's, over numba's threads."""
    desc = np.empty((qkv.shape[0], 5), np.int64)
    for r in range(qkv.shape[0]):
        b, stop = r // width, end + r % width
        first = left_pad[b] if window <= 0 else max(left_pad[b], stop - window)
        desc[r, 0], desc[r, 1], desc[r, 2], desc[r, 3], desc[r, 4] = b, b, first, first, stop
    return attend_desc(qkv, keys, values, desc, heads, np.float32(scale))


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def silu_mul(gate_up):  # pragma: no cover - jitted
    """SwiGLU of a fused (B, 2F) gate|up product: silu(gate) * up (silu_mul_span, row by row)."""
    ffn = gate_up.shape[1] // 2
    out = np.empty((gate_up.shape[0], ffn), dtype=np.float32)
    for b in range(gate_up.shape[0]):
        _silu_mul_span_inline(gate_up, 0, gate_up, ffn, out, b, ffn)
    return out


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", parallel=True)
def silu_mul_rows(g, x, out):  # pragma: no cover - jitted
    """out = silu(g) * x of (R, F) float32 arrays in one pass, rows over numba's threads: the prefill's
    SwiGLU (prefill_kernels.make_swiglu). `out` comes from the caller: numba's own 64 MiB allocation
    page-faulted afresh each call (31-33 ms for 2,048 x 8,192, against 8-9 ms into numpy's
    np.empty_like; Zen 5 VM)."""
    for b in prange(g.shape[0]):
        silu_mul_span(g, 0, x, 0, out, b, g.shape[1])


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def silu_mul_span(gate, g0, up, u0, out, b, n):  # pragma: no cover - jitted
    """out[b, i] = silu(gate[b, g0 + i]) * up[b, u0 + i] for i < n, exp(-gate) as 2^n * p(f) (the decode
    attention's degree-6 polynomial, relative error ~1e-7): it vectorizes, where np.exp is a scalar libm
    call an element (7.2 ns an element on Zen 1). A function of its own, called from the parallel
    prefill loop (prefill_kernels.silu_mul_rows): written inline there, numba's parfor passes moved the read
    of `out` above the write of its exponent bits (NaN)."""
    bits = out.view(np.int32)
    for i in range(n):
        g = gate[b, g0 + i]
        x = min(max(-g * np.float32(1.4426950408889634), np.float32(-126.0)), np.float32(126.0))
        k = np.floor(x + np.float32(0.5))
        f = x - k
        bits[b, i] = (np.int32(k) + np.int32(127)) << 23
        out[b, i] = g / (np.float32(1.0) + out[b, i] * exp2_fraction(f)) * up[b, u0 + i]


# The same body inlined at numba's level, for the serial callers: there `out` is the caller's own new
# array, and the loops vectorize as they did written in place (a call: decode's silu_mul 2.2 -> 4.9 us a
# 1 x 8,192 row, Zen 5). Not for a parallel loop (silu_mul_span's docstring).
_silu_mul_span_inline = njit(fastmath=True, nogil=True, error_model="numpy", inline="always")(silu_mul_span.py_func)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def product(x, w):  # pragma: no cover - jitted
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    _stream(x, w, out)
    return out


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def layer_step(h, norm1, wqkv, wo, norm2, wgu, wd, keys, values, idx, left_pad, cos, sin,
               heads, scale, eps, width=1):  # pragma: no cover - jitted
    """One llama layer for `width` new tokens per row: h (B * width, hidden) updated in place,
    and row b's k/v written at positions idx..idx + width - 1 of keys/values (B, kv_heads,
    capacity, head_dim). Width 1 is a decode step; more, a draft's verify forward."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    qkv = product(rms_norm(h, norm1, eps), wqkv)
    rope(qkv, cos, sin, heads + kv_heads, dim)
    write_kv(qkv, keys, values, idx, heads, width)
    h += product(attend(qkv, keys, values, idx + 1, left_pad, heads, scale, width), wo)
    h += product(silu_mul(product(rms_norm(h, norm2, eps), wgu)), wd)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for the types a decode step passes,
    so the first request does not pay for it (~10 s uncached on a busy 2-core machine)."""
    f32 = np.float32
    h, w = np.zeros((1, 8), f32), np.zeros((8, 8), f32)
    kv = np.zeros((1, 1, 4, 4), f32)
    trig = np.zeros((1, 2), f32)
    layer_step(h, h[0], np.zeros((16, 8), f32), w, h[0], np.zeros((16, 8), f32), w, kv, kv.copy(), 0,
               np.zeros(1, np.int64), trig, trig, 2, 0.5, 1e-5)
    h2, trig2 = np.zeros((2, 8), f32), np.zeros((2, 2), f32)  # a verify span of 2 tokens
    layer_step(h2, h[0], np.zeros((16, 8), f32), w, h[0], np.zeros((16, 8), f32), w, kv, kv.copy(), 0,
               np.zeros(1, np.int64), trig2, trig2, 2, 0.5, 1e-5, 2)
    linear(rms_norm(h, h[0], 1e-5), w)
