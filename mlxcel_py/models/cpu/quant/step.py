"""A whole llama (or qwen2: a q/k/v bias) decode step over GGUF blocks in one numba call.

NativeDecoder runs 121 products a step (30 layers x 4 + the LM head), each its own `prange`
region (a fork/join of numba's pool) behind Python glue and an activation quantize: two
threads bought 1.2x. Here the step is one parallel region whose threads work through a fixed
plan of phases (norm, q/k/v product, RoPE + KV write, attention per head, o, norm, gate/up,
SwiGLU, down, ..., LM head). A phase is split into tasks (a product into runs of whole output
rows, attention into (row, KV head, 256-position chunk) items merged by the next phase, the small
row-wise work into one task, or a prompt's rows into shares: `row_tasks`); a thread claims the next task from an atomic counter and, before
running it, waits until every task of the earlier phases is done (a second counter; a long wait
sleeps on it, atomics.py), as ggml's threadpool does between graph nodes. A thread only waits on
lower-numbered tasks, all claimed by running threads, so no thread count or
scheduling can deadlock, and one thread alone runs the plan in order. No kernel the plan runs may
raise (a raising thread never counts its task done, so the others would wait forever): they compile
with numpy's error model, where a division by zero (a NaN activation's empty softmax) gives inf/NaN.

Each output row is computed whole by one thread with NativeDecoder's own kernels (vector.product_rows,
quantize_rows_q8, decode_kernels' norm/RoPE/SwiGLU, the same attention loops), so the
logits do not depend on the thread count, and equal NativeDecoder's up to the 1-ulp rounding
that numba's cached and freshly compiled builds of the same IR already differ by (measured:
the same product run from a cold and a warm cache differs by 1e-6)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..arch_kernels import add_bias
from ..decode_attention import combine, item
from ..decode_kernels import rms_norm, rope, silu_mul
from .atomics import count_done, fetch_add, wait_at_least
from .kblock import KBLOCK_TYPES, kblock_rows, quantize_rows_q8k
from .kernels import quantize_rows_q8
from .kquant_r8 import Q5_0_QTYPE as Q5_0_R8, Q6_K_QTYPE as Q6_K_R8, Q8_0_QTYPE as Q8_0_R8, QTYPE as Q4_K_R8, \
    ROWS as R8_ROWS, r8_rows
from .vector import product_rows

Q4_K, Q6_K = 12, 14
KBLOCK = bool(KBLOCK_TYPES)  # Q4_K and Q6_K products over super-block activations (kblock.py)


# Phase kinds, in a layer's order; a product reads the int8 activations the phase before it wrote.
NORM1, QKV, ROPE, ATTEND, QUANT_ATTN, O, NORM2, GATE_UP, SILU, DOWN, FINAL, HEAD = range(12)
PRODUCTS = (QKV, O, GATE_UP, DOWN, HEAD)
ROW_WISE = (NORM1, ROPE, QUANT_ATTN, NORM2, SILU, FINAL)  # each row on its own: split by rows (row_tasks)
ROWS_PER_TASK, MAX_ROW_TASKS = 4, 16
CLAIMED, SLEEPERS, DONE = 0, 8, 16  # counter slots, 64 bytes apart or more (lines of their own); 9: sleeps


@njit(cache=True, nogil=True, error_model="numpy")
def _quantize(x, q):  # pragma: no cover - jitted
    """x (B, K) -> q = (codes, scales, code sums, d * sums), as vector.quantize_x computes them, then
    (codes, scales, sums) per 256 as kblock.quantize does, where q has room for them (K a multiple of 256)."""
    xq, xd, xsum, xs, kq, kd, ks = q
    quantize_rows_q8(x, xq, xd, xsum)
    for b in range(x.shape[0]):
        for g in range(x.shape[1] // 16):
            xs[b, g] = xd[b, g >> 1] * np.float32(xsum[b, g])
    if kq.shape[1] == x.shape[1]:
        quantize_rows_q8k(x, kq, kd, ks)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _product(raw, qtype, units, col, r0, r1, q, out):  # pragma: no cover - jitted
    """Output columns col + r0 .. col + r1 of out = x @ W.T (rows r0..r1 of W's blocks raw)."""
    xq, xd, xsum, xs, kq, kd, ks = q
    if qtype == Q4_K_R8 or qtype == Q6_K_R8:  # kquant_r8's groups: r0, r1 multiples of 8
        r8_rows(qtype, raw, r0 // R8_ROWS, r1 // R8_ROWS, kq, kd, ks, out, col, units)
    elif qtype == Q5_0_R8 or qtype == Q8_0_R8:  # the same over the activations per 32 (int32 sums per 16)
        r8_rows(qtype, raw, r0 // R8_ROWS, r1 // R8_ROWS, xq, xd, xsum, out, col, units)
    elif KBLOCK and (qtype == Q4_K or qtype == Q6_K):
        kblock_rows(qtype, raw, r0, r1, kq, kd, ks, out, col, units)
    else:
        product_rows(qtype, raw, r0, r1, xq, xd, xs, out, col, units)


def row_tasks(rows: int) -> int:
    """How many tasks a row-wise phase of `rows` batch rows is split into: one for a decode step's few
    rows; a prompt's rows in up to MAX_ROW_TASKS (its norms, SwiGLU and quantizing were one thread's
    while the other waited: 10% of a 256-row step of the default model)."""
    return max(1, min(rows // ROWS_PER_TASK, MAX_ROW_TASKS))


def input_sets(rows: int, widths, kblock=None) -> tuple:
    """Zeroed int8 input sets (run_step's q) for `rows` rows of each width in `widths`; the per-256
    arrays are empty (and `_quantize` skips them) where no K-quant product reads the set: `kblock[i]`
    false, or the width not a multiple of 256."""
    def one(k: int, read: bool) -> tuple:
        kk = k if KBLOCK and read and k % 256 == 0 else 0
        return (np.zeros((rows, k), np.int8), np.zeros((rows, k // 32), np.float32), np.zeros((rows, k // 16), np.int32),
                np.zeros((rows, k // 16), np.float32), np.zeros((rows, kk), np.int8), np.zeros((rows, kk // 256), np.float32),
                np.zeros((rows, kk // 16), np.int16))
    return tuple(one(k, read) for k, read in zip(widths, kblock or (True,) * len(widths)))


@njit(cache=True, nogil=True, error_model="numpy")
def _write_kv(qkv, keys, values, kv_row, pos, heads):  # pragma: no cover - jitted
    kv_heads, dim = keys.shape[1], keys.shape[3]
    k0, v0 = heads * dim, (heads + kv_heads) * dim
    for b in range(qkv.shape[0]):
        for kv in range(kv_heads):
            for d in range(dim):
                keys[kv_row[b], kv, pos[b], d] = qkv[b, k0 + kv * dim + d]
                values[kv_row[b], kv, pos[b], d] = qkv[b, v0 + kv * dim + d]


@njit(cache=True, nogil=True, error_model="numpy")
def _add(h, y):  # pragma: no cover - jitted
    for b in range(h.shape[0]):
        for i in range(h.shape[1]):
            h[b, i] += y[b, i]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sets(q, r0, r1):  # pragma: no cover - jitted
    """Rows r0..r1 of an int8 input set (`input_sets`)."""
    xq, xd, xs, xx, kq, kd, ks = q
    return xq[r0:r1], xd[r0:r1], xs[r0:r1], xx[r0:r1], kq[r0:r1], kd[r0:r1], ks[r0:r1]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _run(kind, layer, local, count, task, w, kv, rows, acts, q, f):  # pragma: no cover - jitted
    """Task `local` of `count` (global `task`) of a phase of `kind` for `layer`; see run_step for the
    arguments. A row-wise phase's task is its share of the batch rows (`row_tasks`), always as a slice,
    so each row runs the same compiled code whatever the split."""
    tasks, segs, raws, norms1, norms2, final_norm, biases = w
    keys, values = kv
    kv_row, desc, pos, cos, sin = rows
    h, qkv, attn, o, gate_up, down, logits, part = acts
    q_hid, q_attn, q_act = q
    heads, kv_heads, dim, scale, eps = f
    r0, r1 = local * h.shape[0] // count, (local + 1) * h.shape[0] // count
    if kind == QKV or kind == O or kind == GATE_UP or kind == DOWN or kind == HEAD:
        seg, n0, n1 = tasks[task, 0], tasks[task, 1], tasks[task, 2]
        qt, units, col = segs[seg, 0], segs[seg, 1], segs[seg, 2]
        if kind == QKV:
            _product(raws[seg], qt, units, col, n0, n1, q_hid, qkv)
        elif kind == O:
            _product(raws[seg], qt, units, col, n0, n1, q_attn, o)
        elif kind == GATE_UP:
            _product(raws[seg], qt, units, col, n0, n1, q_hid, gate_up)
        elif kind == DOWN:
            _product(raws[seg], qt, units, col, n0, n1, q_act, down)
        else:
            _product(raws[seg], qt, units, col, n0, n1, q_hid, logits)
    elif kind == NORM1:
        if layer > 0:
            _add(h[r0:r1], down[r0:r1])
        _quantize(rms_norm(h[r0:r1], norms1[layer], eps), _sets(q_hid, r0, r1))
    elif kind == ROPE:
        if biases.shape[1]:  # qwen2's q/k/v bias
            add_bias(qkv[r0:r1], biases[layer])
        rope(qkv[r0:r1], cos[r0:r1], sin[r0:r1], heads + kv_heads, dim)
        _write_kv(qkv[r0:r1], keys[layer], values[layer], kv_row[r0:r1], pos[r0:r1], heads)
    elif kind == ATTEND:  # (row, KV head, chunk) `local`'s partial, with its block's (decode_attention.item)
        item(qkv, keys[layer], values[layer], desc, heads, np.float32(scale), part, local)
    elif kind == QUANT_ATTN:  # the partials merged in chunk order, then quantized
        for b in range(r0, r1):
            combine(part, b, attn)
        _quantize(attn[r0:r1], _sets(q_attn, r0, r1))
    elif kind == NORM2:
        _add(h[r0:r1], o[r0:r1])
        _quantize(rms_norm(h[r0:r1], norms2[layer], eps), _sets(q_hid, r0, r1))
    elif kind == SILU:
        _quantize(silu_mul(gate_up[r0:r1]), _sets(q_act, r0, r1))
    elif kind == FINAL:
        _add(h[r0:r1], down[r0:r1])
        _quantize(rms_norm(h[r0:r1], final_norm, eps), _sets(q_hid, r0, r1))


@njit(cache=True, nogil=True, error_model="numpy")
def _work(counters, phases, w, kv, rows, acts, q, f):  # pragma: no cover - jitted
    """One thread's share of the plan: claim a task, wait for the phases before it, run it."""
    p, n_phases = 0, phases.shape[0]
    while True:
        task = fetch_add(counters, CLAIMED, 1)
        while p < n_phases and task >= phases[p, 2] + phases[p, 3]:
            p += 1
        if p >= n_phases:
            return
        wait_at_least(counters, DONE, phases[p, 2], SLEEPERS)
        local = task - phases[p, 2]
        _run(phases[p, 0], phases[p, 1], local, phases[p, 3], phases[p, 4] + local, w, kv, rows, acts, q, f)
        count_done(counters, DONE, SLEEPERS)


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def run_step(threads, phases, w, kv, rows, acts, q, f):  # pragma: no cover - jitted
    """One decode step: acts' h (B, hidden) holds the embedded tokens and ends as the last
    hidden state, acts' logits (B, vocab) the LM head's output, each layer's new k/v written.

    phases (P, 5): kind, layer, first task, task count, its first row of `tasks`; w = (tasks (T, 3):
    segment, first and end row of a product task; segs (S, 3): GGUF type, loop units, output column;
    raws: each segment's blocks; norms1, norms2 (layers, hidden); final norm; biases (layers, qkv
    width) added to the q/k/v product, or (layers, 0): none); kv = per-layer keys,
    values (rows, kv_heads, capacity, dim); rows = (kv_row (B,), desc (B, 5): each row's
    decode_attention descriptor, pos (B,), cos, sin (B, dim / 2)); acts = (h, qkv, attn, o,
    gate_up, down, logits, part) float32 buffers, part the attention's partials (B, kv_heads, chunks,
    group, dim + 2), an ATTEND phase's tasks its items; q = three (codes, scales, sums, d * sums,
    codes, scales and sums per 256) sets for hidden, attention and FFN inputs (`input_sets`); f = (heads, kv_heads, head_dim,
    scale, eps)."""
    counters = np.zeros(32, np.int64)
    # a parallel region takes arrays and scalars, not tuples: unpacked here, packed again inside
    tasks, segs, raws, norms1, norms2, final_norm, biases = w
    keys, values = kv
    kv_row, desc, pos, cos, sin = rows
    h, qkv, attn, o, gate_up, down, logits, part = acts
    (q0, d0, s0, x0, k0, e0, t0), (q1, d1, s1, x1, k1, e1, t1), (q2, d2, s2, x2, k2, e2, t2) = q
    heads, kv_heads, dim, scale, eps = f
    for _ in prange(threads):
        _work(counters, phases, (tasks, segs, raws, norms1, norms2, final_norm, biases), (keys, values),
              (kv_row, desc, pos, cos, sin), (h, qkv, attn, o, gate_up, down, logits, part),
              ((q0, d0, s0, x0, k0, e0, t0), (q1, d1, s1, x1, k1, e1, t1), (q2, d2, s2, x2, k2, e2, t2)),
              (heads, kv_heads, dim, scale, eps))
