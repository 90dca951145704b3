"""The decode attention kernel: every CPU decode path's (the fused step quant/step.py, the engine
rows (rows.attend_rows), BatchKVCache's decode_kernels.attend) loops in one home.

A query row's positions are cut into CHUNK-position pieces at ABSOLUTE multiples of CHUNK (not
relative to the row's start, its shared-prefix cut or the thread count). A work item is (query row,
KV head, chunk): the KV head's GQA group of query heads together (one pass over K and V serves the
group), scores for the chunk's positions, their max, exp (a degree-6 polynomial, relative error
~1e-7, as prefill_attention.softmax_ranges) and sum, and the V accumulation: a partial (acc, max, sum).
`combine` merges a row's partials in chunk order. Each item's bits depend on its absolute positions
only, so a shared prefix row gives the bits of a private copy, and any thread count the same bits.

A row is described by five int64s (DESC): the KV row positions below `cut` are read from (the shared
prefix row), the row's own KV row, the cut, and its first and end (exclusive) positions.

The scores and the V accumulation are attention_ir's explicit vectors (a head dimension that is a
multiple of 8; numba's loops otherwise)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .attention_ir import LANES, dots, weigh

CHUNK = 256  # positions per partial: fixed, so the thread count changes no bit
SHARED, OWN, CUT, FIRST, STOP = range(5)  # a row descriptor's fields
SUB_BYTES = 16384  # K or V rows a pass of the group's queries (half of a 32 KB L1)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", inline="always")
def exp2_fraction(f):  # pragma: no cover - jitted
    """2^f for |f| <= 1/2 as a degree-6 polynomial (relative error ~1e-7): with the integer part put
    into a float's exponent bits, the exp that vectorizes (this module's softmax, prefill_attention's,
    decode_kernels.silu_mul_span, arch_kernels.gelu_span)."""
    return np.float32(1.0) + f * (np.float32(0.6931471805599453) + f * (np.float32(0.2402265069591007) + f * (
        np.float32(0.05550410866482158) + f * (np.float32(0.009618129107628477) + f * (
            np.float32(0.0013333558146428443) + f * np.float32(0.00015403530393381606))))))


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", inline="always")
def _dots_any(q, k, out):  # pragma: no cover - jitted
    """out[j] = q . k[j]: attention_ir.dots for a head dimension that is not a multiple of 8."""
    for j in range(k.shape[0]):
        s = np.float32(0.0)
        for d in range(q.shape[0]):
            s += q[d] * k[j, d]
        out[j] = s


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", inline="always")
def _weigh_any(p, v, acc):  # pragma: no cover - jitted
    """acc += p @ v, positions in order: attention_ir.weigh for a dimension not a multiple of 8."""
    for j in range(v.shape[0]):
        for d in range(acc.shape[0]):
            acc[d] += p[j] * v[j, d]


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", inline="always")
def _segment(qs, keys, values, row, kv, a, b, lo, scores, acc, weigh_now):  # pragma: no cover - jitted
    """Positions a..b (from KV row `row`) of every query of the group: their scores (scores[:, a - lo:]),
    or with weigh_now their weighted values added to acc[:, :dim]. The group's queries take the
    positions SUB_BYTES of K (or V) at a time, so that all but the first read them from L1."""
    dim = keys.shape[3]
    vector = dim % LANES == 0 and keys.strides[3] == 4 and values.strides[3] == 4  # attention_ir's loops
    step = max(LANES, SUB_BYTES // (4 * dim) // LANES * LANES)
    for s in range(a, b, step):
        e = min(s + step, b)
        for g in range(qs.shape[0]):
            if weigh_now:
                if vector:
                    weigh(scores[g, s - lo:e - lo], values[row, kv, s:e], acc[g, :dim])
                else:
                    _weigh_any(scores[g, s - lo:e - lo], values[row, kv, s:e], acc[g, :dim])
            elif vector:
                dots(qs[g], keys[row, kv, s:e], scores[g, s - lo:e - lo])
            else:
                _dots_any(qs[g], keys[row, kv, s:e], scores[g, s - lo:e - lo])


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", inline="always")
def _softmax(scores, n, acc):  # pragma: no cover - jitted
    """scores[g, :n] -> exp(scores - max); acc[g, dim] = the max, acc[g, dim + 1] = the sum."""
    bits, dim = scores.view(np.int32), acc.shape[1] - 2
    for g in range(scores.shape[0]):
        m = np.float32(-np.inf)
        for j in range(np.uint64(0), np.uint64(n)):
            m = max(m, scores[g, j])
        t = np.float32(0.0)
        for j in range(np.uint64(0), np.uint64(n)):  # 2^i * p(f), |f| <= 1/2: vectorizes, unlike np.exp
            x = max((scores[g, j] - m) * np.float32(1.4426950408889634), np.float32(-126.0))
            i = np.floor(x + np.float32(0.5))
            f = x - i
            p = exp2_fraction(f)
            bits[g, j] = (np.int32(i) + np.int32(127)) << 23
            e = scores[g, j] * p
            scores[g, j] = e
            t += e
        acc[g, dim], acc[g, dim + 1] = m, t


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def item(qkv, keys, values, desc, heads, scale, part, i, scores):  # pragma: no cover - jitted
    """Work item i = (row, KV head, chunk) of part's (rows, kv_heads, chunks, group, dim + 2):
    that chunk's partial (acc, max, sum) for the KV head's group; scores: (group, CHUNK) scratch."""
    kv_heads, chunks, group, dim = part.shape[1], part.shape[2], part.shape[3], keys.shape[3]
    r, kv, c = i // (kv_heads * chunks), (i // chunks) % kv_heads, i % chunks
    acc = part[r, kv, c]
    acc[:, :dim] = 0.0
    lo, hi = max(c * CHUNK, desc[r, FIRST]), min((c + 1) * CHUNK, desc[r, STOP])
    if hi <= lo:
        acc[:, dim], acc[:, dim + 1] = -np.inf, 0.0  # no positions here: weighs nothing in combine
        return
    qs = np.empty((group, dim), np.float32)
    for g in range(group):
        for d in range(dim):
            qs[g, d] = qkv[r, (kv * group + g) * dim + d] * scale
    cut, shared, own = min(max(desc[r, CUT], lo), hi), desc[r, SHARED], desc[r, OWN]  # below the cut: the shared row
    _segment(qs, keys, values, shared, kv, lo, cut, lo, scores, acc, False)
    _segment(qs, keys, values, own, kv, cut, hi, lo, scores, acc, False)
    _softmax(scores, hi - lo, acc)
    _segment(qs, keys, values, shared, kv, lo, cut, lo, scores, acc, True)
    _segment(qs, keys, values, own, kv, cut, hi, lo, scores, acc, True)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def combine(part, r, out):  # pragma: no cover - jitted
    """out[r] (heads * dim) = row r's partials merged in chunk order: sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M)."""
    kv_heads, chunks, group, dim = part.shape[1], part.shape[2], part.shape[3], part.shape[4] - 2
    for kv in range(kv_heads):
        for g in range(group):
            o = out[r, (kv * group + g) * dim:(kv * group + g + 1) * dim]
            top = np.float32(-np.inf)
            for c in range(chunks):
                top = max(top, part[r, kv, c, g, dim])
            o[:] = 0.0
            total = np.float32(0.0)
            for c in range(chunks):
                if part[r, kv, c, g, dim + 1] > 0.0:
                    w = np.exp(part[r, kv, c, g, dim] - top)
                    total += w * part[r, kv, c, g, dim + 1]
                    for d in range(dim):
                        o[d] += w * part[r, kv, c, g, d]
            for d in range(dim):
                o[d] /= total


def chunks_for(stop) -> int:
    """Chunks that cover positions 0 .. max(stop) - 1 (the part buffer's third axis)."""
    return (int(np.max(stop)) + CHUNK - 1) // CHUNK


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy", parallel=True)
def attend_desc(qkv, keys, values, desc, heads, scale):  # pragma: no cover - jitted
    """(rows, heads * dim) attention of qkv's query heads, row r as desc[r] says, items over numba's threads."""
    rows, kv_heads, dim = qkv.shape[0], keys.shape[1], keys.shape[3]
    group = heads // kv_heads
    chunks = (desc[:, STOP].max() + CHUNK - 1) // CHUNK
    part = np.empty((rows, kv_heads, chunks, group, dim + 2), np.float32)
    for i in prange(rows * kv_heads * chunks):
        item(qkv, keys, values, desc, heads, scale, part, i, np.empty((group, CHUNK), np.float32))
    out = np.empty((rows, heads * dim), np.float32)
    for r in prange(rows):
        combine(part, r, out)
    return out
