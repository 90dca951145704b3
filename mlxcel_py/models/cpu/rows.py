"""The CPU decode step over a KV the engine owns (engine/runner/kv_rows.py).

Each layer's K/V is one (slots, kv_heads, capacity, dim) float32 buffer; row b of a forward
lives in slot `slot[b]`, attends positions `start[b]` .. its own, and writes its `width` new
tokens at `pos[b]` ..: no left padding, no BatchKVCache bookkeeping. The products, norms, RoPE
and SwiGLU are the decoder's own (`decoder.CpuDecoder` or `native.NativeDecoder`), every
architecture's layer in arch_kernels' order (q/k norms, sandwich norms, GELU, a layer's own rope and
sliding window: gemma3); only the KV write and the attention are new kernels here. A row's bits
do not depend on the other rows, its slot or its shared prefix (decode_attention's chunks).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numba
import numpy as np
from numba import njit

from .arch import GELU_TANH, qkv_bias
from .arch_kernels import activation, add_bias, qkv_parts, residual
from .decode_attention import attend_desc
from .decode_kernels import product, rms_norm, rope, silu_mul


@njit(fastmath=True, cache=True, nogil=True)
def write_kv_rows(qkv, keys, values, slot, pos, heads, width):  # pragma: no cover - jitted
    """Store row r = b * width + j's new k and v (the parts of qkv after the q heads) at
    position pos[b] + j of slot slot[b]."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    k0, v0 = heads * dim, (heads + kv_heads) * dim
    for r in range(qkv.shape[0]):
        b, j = r // width, r % width
        s, p = slot[b], pos[b] + j
        for kv in range(kv_heads):
            for d in range(dim):
                keys[s, kv, p, d] = qkv[r, k0 + kv * dim + d]
                values[s, kv, p, d] = qkv[r, v0 + kv * dim + d]


@njit(cache=True, nogil=True)
def attend_rows(qkv, keys, values, slot, start, pos, heads, scale, width, prefix, window=0):  # pragma: no cover - jitted
    """Row r = b * width + j's query against slot slot[b]'s positions start[b] .. pos[b] + j
    (causal within a span); q is the head of qkv. Positions below prefix[b, 1] are read from the
    shared prefix row prefix[b, 0] (kv_rows.RowKV), with the bits of a private copy
    (decode_attention's loops, over numba's threads). window > 0: only the last `window` positions
    up to the query's own (a sliding-window layer; kv_rows keeps no more of them)."""
    desc = np.empty((qkv.shape[0], 5), np.int64)
    for r in range(qkv.shape[0]):
        b = r // width
        stop = pos[b] + r % width + 1
        desc[r, 0], desc[r, 1], desc[r, 2] = prefix[b, 0], slot[b], prefix[b, 1]
        desc[r, 3], desc[r, 4] = start[b] if window <= 0 else max(start[b], stop - window), stop
    return attend_desc(qkv, keys, values, desc, heads, np.float32(scale))


@njit(fastmath=True, cache=True, nogil=True)
def attention_rows(qkv, bias, q_norm, k_norm, keys, values, slot, start, pos, cos, sin, heads, scale, eps,
                   width, window, prefix):  # pragma: no cover - jitted
    """arch_kernels.attention_part over the engine's rows: from the q/k/v product to the attention
    output (before o): bias, q/k norms, RoPE, the KV write, the (windowed) attention."""
    qkv_parts(qkv, bias, q_norm, k_norm, cos, sin, heads, keys.shape[1], keys.shape[3], eps)
    write_kv_rows(qkv, keys, values, slot, pos, heads, width)
    return attend_rows(qkv, keys, values, slot, start, pos, heads, scale, width, prefix, window)


def no_prefix(rows: int) -> np.ndarray:
    """The (rows, 2) prefix array of rows that share nothing (prefix length 0)."""
    return np.zeros((rows, 2), np.int64)


def _mul(weight, x: np.ndarray, threads: int) -> np.ndarray:
    """x @ W.T: a float32 matrix through the streaming kernel (as `layer_step`), else a block Product."""
    if isinstance(weight, np.ndarray):
        return product(np.ascontiguousarray(x), weight)
    return weight(x, threads)


def qkv_rows(decoder, w, h: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Layer `w`'s q/k/v of rows `h`: the product of the normed rows, its bias (qwen2), RoPE."""
    qkv = _mul(w.qkv, rms_norm(h, w.norm1, decoder.eps), decoder.threads)
    bias = qkv_bias(w)
    if bias.shape[0]:
        add_bias(qkv, bias)
    rope(qkv, cos, sin, decoder.heads + decoder.kv_heads, decoder.head_dim)
    return qkv


def forward_rows(decoder, tokens: Sequence[int], keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                 slot: np.ndarray, start: np.ndarray, pos: np.ndarray, width: int = 1,
                 prefix: Optional[np.ndarray] = None) -> np.ndarray:
    """(B * width, vocab) float32 logits of `width` new tokens per row (`tokens` row-major), their
    K/V written into each row's slot; the caller advances the rows' lengths. `prefix` (B, 2): each
    row's shared prefix row and length (kv_rows.RowKV; None: no row shares)."""
    if prefix is None:
        prefix = no_prefix(len(slot))
    fused = getattr(decoder, "step_rows", None)  # fused_step.FusedDecoder: the whole step in one call
    if fused is not None:
        logits = fused(tokens, keys, values, slot, start, pos, width, prefix)
        if logits is not None:
            return logits
    if numba.get_num_threads() != decoder.threads:
        numba.set_num_threads(decoder.threads)
    t, eps, heads = decoder.threads, decoder.eps, decoder.heads
    trig = decoder._trig((pos[:, None] + np.arange(width)).reshape(-1))
    h = np.array(decoder._embed(np.asarray(tokens)), dtype=np.float32)
    for w, k, v in zip(decoder._layers, keys, values):
        cos, sin = trig[w.rope]
        if w.norms is not None:  # another architecture's layer (arch_kernels' order, as NativeDecoder._step)
            n = w.norms
            qkv = _mul(w.qkv, rms_norm(h, w.norm1, eps), t)
            att = attention_rows(qkv, n.qkv_bias, n.q_norm, n.k_norm, k, v, slot, start, pos, cos, sin, heads,
                                 decoder.scale, eps, width, w.window, prefix)
            residual(h, _mul(w.o, att, t), n.post_attn, eps)
            gate_up = _mul(w.gate_up, rms_norm(h, w.norm2, eps), t)
            residual(h, _mul(w.down, activation(gate_up, decoder.spec.activation == GELU_TANH), t), n.post_ffn, eps)
            continue
        qkv = qkv_rows(decoder, w, h, cos, sin)
        write_kv_rows(qkv, k, v, slot, pos, heads, width)
        h += _mul(w.o, attend_rows(qkv, k, v, slot, start, pos, heads, decoder.scale, width, prefix), t)
        h += _mul(w.down, silu_mul(_mul(w.gate_up, rms_norm(h, w.norm2, eps), t)), t)
    return decoder._lm_head(rms_norm(h, decoder._norm, eps))


def supports_rows(decoder) -> bool:
    """True when `decoder` is a CPU decode step (CpuDecoder, NativeDecoder, FusedDecoder) whose layers
    `forward_rows` can run: every ArchSpec's."""
    layers, spec = getattr(decoder, "_layers", None), getattr(decoder, "spec", None)
    return bool(layers) and spec is not None and \
        all(hasattr(w, f) for w in layers[:1] for f in ("qkv", "o", "gate_up", "down", "norms", "window", "rope"))
