"""Prefill attention on the CPU: BLAS products over query tiles, the softmax in one numba pass, tiles in parallel.

Each task is one KV head's group of query heads over a tile of queries: scores = Q K^T through numpy's BLAS on
one thread, then one numba pass per row over only the keys the row sees (max, then exp and sum, with a
polynomial exp that vectorizes: numpy's four passes cost as much as the products), then P V. Tasks run on
`threads` Python threads (numpy and numba release the GIL). numpy's BLAS runs on one thread meanwhile: its own
threads, woken for each of the many small products, made them 2-6x slower (docs/CPU_FAST_PATH.md, Prefill).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np
from numba import njit

from .blas import numpy_blas_threads
from .decode_attention import exp2_fraction

TILE_ROWS = 256  # query rows (heads of a group x queries) a task multiplies at once
_state = {"threads": os.cpu_count() or 1, "pool": None}
_pool_lock = threading.Lock()
_local = threading.local()


@njit(fastmath=True, cache=True, nogil=True)
def softmax_ranges(s, lo, hi, per_head, totals):  # pragma: no cover - numba
    """Row r of scores s (R, W) sees columns lo[r % per_head] .. hi[r % per_head]: those become
    exp(s - max), the rest 0, and totals[r] their sum. exp is 2^n * p(f) (|f| <= 1/2, degree 6, ~1e-7)."""
    bits = s.view(np.int32)
    for r in range(s.shape[0]):
        # Unsigned: numba wraps signed indices (a branch per element), which stops the loops vectorizing (6x).
        a, b = np.uint64(lo[r % per_head]), np.uint64(hi[r % per_head])
        m = np.float32(-np.inf)
        for j in range(a, b):
            m = max(m, s[r, j])
        t = np.float32(0.0)
        for j in range(a, b):
            x = max((s[r, j] - m) * np.float32(1.4426950408889634), np.float32(-126.0))
            n = np.floor(x + np.float32(0.5))
            f = x - n
            p = exp2_fraction(f)
            bits[r, j] = (np.int32(n) + np.int32(127)) << 23
            e = s[r, j] * p
            s[r, j] = e
            t += e
        for j in range(np.uint64(0), a):
            s[r, j] = 0.0
        for j in range(max(a, b), np.uint64(s.shape[1])):
            s[r, j] = 0.0
        totals[r] = t if b > a else np.float32(1.0)  # a row that sees nothing gives 0, not NaN


def _scratch(size: int) -> np.ndarray:
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(size, np.float32)
    return buf[:size]


def _task(q, k, v, scale, out, h, group, q0, q1, c0, c1, lo, hi) -> None:
    """out[h's heads, q0:q1] for keys c0:c1, query q0+i seeing keys lo[i]..hi[i] (relative to c0)."""
    nq, width = q1 - q0, c1 - c0
    heads = slice(h * group, (h + 1) * group)
    qh = (q[heads, q0:q1] * np.float32(scale)).reshape(group * nq, -1)
    scores = _scratch(group * nq * width).reshape(group * nq, width)
    np.matmul(qh, k[h, c0:c1].T, out=scores)
    totals = np.empty(group * nq, np.float32)
    softmax_ranges(scores, lo, hi, nq, totals)
    res = scores @ v[h, c0:c1]
    res /= totals[:, None]  # normalize the (rows, dim) output, not the larger scores
    out[heads, q0:q1] = res.reshape(group, nq, -1)


def run_tiles(q, k, v, scale, tiles) -> np.ndarray:
    """Attention of q (H, L, D) over k/v (KV, S, D) for `tiles`: (q0, q1, c0, c1, lo, hi) per query tile,
    each for every KV head; the largest tiles first, over the configured threads."""
    num_heads, num_q, _ = q.shape
    group = num_heads // k.shape[0]
    out = np.empty((num_heads, num_q, v.shape[2]), dtype=np.float32)
    tasks = [(h, *t) for t in tiles for h in range(k.shape[0])]
    tasks.sort(key=lambda t: -(t[2] - t[1]) * (t[4] - t[3]))
    threads = min(_state["threads"], len(tasks))
    if threads <= 1:
        _tasks(q, k, v, scale, out, group, tasks)
    else:
        list(_pool(threads).map(lambda t: _tasks(q, k, v, scale, out, group, [t]), tasks))
    return out


def _tasks(q, k, v, scale, out, group, tasks) -> None:
    with numpy_blas_threads(1):  # this thread's own OpenBLAS count, put back after (models/cpu/blas.py)
        for t in tasks:
            _task(q, k, v, scale, out, t[0], group, *t[1:])


def tile_queries(num_q: int, group: int) -> int:
    """Queries a tile holds: TILE_ROWS rows over the group's heads (at least 16)."""
    return min(num_q, max(16, TILE_ROWS // group))


def causal_tiles(num_q: int, num_k: int, group: int) -> list:
    """Tiles of queries at the last num_q of num_k positions, each over the keys up to its last query."""
    offset, step, tiles = num_k - num_q, tile_queries(num_q, group), []
    for q0 in range(0, num_q, step):
        q1 = min(num_q, q0 + step)
        hi = np.arange(offset + q0 + 1, offset + q1 + 1, dtype=np.int64)
        tiles.append((q0, q1, 0, offset + q1, np.zeros_like(hi), hi))
    return tiles


def range_tiles(seen: np.ndarray, group: int) -> Optional[list]:
    """Tiles for a boolean (L, S) mask whose rows each see one run of keys (a sliding window's); None
    when a row's seen keys are not one run."""
    any_seen = seen.any(axis=1)
    first = np.where(any_seen, seen.argmax(axis=1), 0)
    last = np.where(any_seen, seen.shape[1] - seen[:, ::-1].argmax(axis=1), 0)
    if not np.array_equal(seen.sum(axis=1), last - first):
        return None
    step, tiles = tile_queries(seen.shape[0], group), []
    for q0 in range(0, seen.shape[0], step):
        q1 = min(seen.shape[0], q0 + step)
        rows = any_seen[q0:q1]
        c0 = int(first[q0:q1][rows].min()) if rows.any() else 0
        c1 = int(last[q0:q1][rows].max()) if rows.any() else 1
        tiles.append((q0, q1, c0, c1, (first[q0:q1] - c0).astype(np.int64), np.maximum(last[q0:q1] - c0, 0)))
    return tiles


def set_threads(threads: int) -> None:
    """The threads prefill attention's tiles run on (the loader's `--threads`)."""
    _state["threads"] = max(1, int(threads))


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pool_lock:
        pool = _state["pool"]
        if pool is None or pool._max_workers != threads:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = _state["pool"] = ThreadPoolExecutor(threads, thread_name_prefix="mlxcel-attention")
        return pool

