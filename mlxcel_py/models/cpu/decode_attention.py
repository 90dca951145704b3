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

from .attention_ir import LANES, dots, dots2, weigh, weigh2

CHUNK = 256  # positions per partial: fixed, so the thread count changes no bit
SHARED, OWN, CUT, FIRST, STOP = range(5)  # a row descriptor's fields
SUB_BYTES = 16384  # K or V rows a pass of the group's queries (half of a 32 KB L1)
BLOCK_ROWS = 16  # rows of one sequence (a prompt piece) whose queries share each pass over K and V


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
def _pass(qs, keys, values, kv, spans, lo, scores, acc, n, weigh_now):  # pragma: no cover - jitted
    """The block's rows' scores (scores[j, :, p - lo[j]]) for their positions, or with weigh_now their
    weighted values added to acc[j, :, :dim]: row j reads positions spans[j, 0]..spans[j, 1] from KV row
    spans[j, 3] and spans[j, 1]..spans[j, 2] from KV row spans[j, 4]. The positions go SUB_BYTES of K
    (or V) at a time through every query of every row, so that all but the first read them from L1.
    A score or a weighed position has the same bits wherever a range is cut (attention_ir)."""
    dim = keys.shape[3]
    vector = dim % LANES == 0 and keys.strides[3] == 4 and values.strides[3] == 4  # attention_ir's loops
    step = max(LANES, SUB_BYTES // (4 * dim) // LANES * LANES)
    first, stop = spans[0, 0], spans[0, 2]
    for j in range(1, n):
        first, stop = min(first, spans[j, 0]), max(stop, spans[j, 2])
    for s in range(first, stop, step):
        e = min(s + step, stop)
        for j in range(n):
            for half in range(2):  # below the cut from the shared row, then the row's own
                a, b = max(s, spans[j, half]), min(e, spans[j, half + 1])
                if a >= b:
                    continue
                row, o = spans[j, 3 + half], lo[j]
                paired = 0
                if vector:  # two queries a pass: each K or V load serves both (attention_ir's pairs)
                    for g in range(0, qs.shape[1] - 1, 2):
                        if weigh_now:
                            weigh2(scores[j, g, a - o:b - o], scores[j, g + 1, a - o:b - o], values[row, kv, a:b],
                                   acc[j, g, :dim], acc[j, g + 1, :dim])
                        else:
                            dots2(qs[j, g], qs[j, g + 1], keys[row, kv, a:b], scores[j, g, a - o:b - o],
                                  scores[j, g + 1, a - o:b - o])
                    paired = qs.shape[1] // 2 * 2
                for g in range(paired, qs.shape[1]):
                    if weigh_now:
                        if vector:
                            weigh(scores[j, g, a - o:b - o], values[row, kv, a:b], acc[j, g, :dim])
                        else:
                            _weigh_any(scores[j, g, a - o:b - o], values[row, kv, a:b], acc[j, g, :dim])
                    elif vector:
                        dots(qs[j, g], keys[row, kv, a:b], scores[j, g, a - o:b - o])
                    else:
                        _dots_any(qs[j, g], keys[row, kv, a:b], scores[j, g, a - o:b - o])


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


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _same_kv(desc, a, b):  # pragma: no cover - jitted
    """Whether rows a and b read the same KV: one shared prefix row up to one cut, one own row."""
    return desc[a, SHARED] == desc[b, SHARED] and desc[a, OWN] == desc[b, OWN] and desc[a, CUT] == desc[b, CUT]


@njit(cache=True, nogil=True, error_model="numpy")
def block_rows(desc, r):  # pragma: no cover - jitted
    """The rows of the block row r starts (r, r + 1, ...: up to BLOCK_ROWS rows that read the same KV,
    never across a multiple of BLOCK_ROWS), or 0 where r does not start one (the item is another's)."""
    if r % BLOCK_ROWS and _same_kv(desc, r - 1, r):
        return 0
    n = 1
    while n < BLOCK_ROWS and r + n < desc.shape[0] and (r + n) % BLOCK_ROWS and _same_kv(desc, r, r + n):
        n += 1
    return n


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def item(qkv, keys, values, desc, heads, scale, part, i):  # pragma: no cover - jitted
    """Work item i = (row, KV head, chunk) of part's (rows, kv_heads, chunks, group, dim + 2): where the
    row starts a block (block_rows), that chunk's partial (acc, max, sum) for the KV head's group of
    every row of the block, which read each K and V position once for all their queries (a prompt
    piece's rows, a verify span); an item of a row inside a block does nothing."""
    kv_heads, chunks, group, dim = part.shape[1], part.shape[2], part.shape[3], keys.shape[3]
    r, kv, c = i // (kv_heads * chunks), (i // chunks) % kv_heads, i % chunks
    n = block_rows(desc, r)
    if n == 0:
        return
    acc = part[r:r + n, kv, c]
    lo = np.empty(n, np.int64)
    spans = np.empty((n, 5), np.int64)  # first, cut, end positions; shared row, own row (_pass)
    live = 0
    for j in range(n):
        d = desc[r + j]
        acc[j, :, :dim] = 0.0
        lo[j], hi = max(c * CHUNK, d[FIRST]), min((c + 1) * CHUNK, d[STOP])
        if hi <= lo[j]:
            acc[j, :, dim], acc[j, :, dim + 1] = -np.inf, 0.0  # no positions here: weighs nothing in combine
            hi = lo[j]
        else:
            live += 1
        spans[j, 0], spans[j, 1], spans[j, 2] = lo[j], min(max(d[CUT], lo[j]), hi), hi
        spans[j, 3], spans[j, 4] = d[SHARED], d[OWN]
    if live == 0:
        return
    qs = np.empty((n, group, dim), np.float32)
    for j in range(n):
        for g in range(group):
            for e in range(dim):
                qs[j, g, e] = qkv[r + j, (kv * group + g) * dim + e] * scale
    scores = np.empty((n, group, CHUNK), np.float32)
    _pass(qs, keys, values, kv, spans, lo, scores, acc, n, False)
    for j in range(n):
        if spans[j, 2] > lo[j]:
            _softmax(scores[j], spans[j, 2] - lo[j], acc[j])
    _pass(qs, keys, values, kv, spans, lo, scores, acc, n, True)


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
        item(qkv, keys, values, desc, heads, scale, part, i)
    out = np.empty((rows, heads * dim), np.float32)
    for r in prange(rows):
        combine(part, r, out)
    return out
