"""Sampling on the CPU decode step's own (numpy) logits, without a round trip through MLX.

The CPU decode step hands back float32 numpy logits. Sampling them with MLX costs a copy into an
mx.array, a hop to MLX's stream thread per evaluation and MLX's CPU ops over the whole vocabulary:
measured on a 2-core AMD EPYC (Zen 3, avx2) at SmolLM2's 49,152 tokens, 0.27 ms a row for an argmax,
0.38 for an argmax after a logit_bias, 3.2 ms for a seeded temperature draw (a log-softmax, MLX's
counter-based uniform over the vocabulary, a Gumbel argmax), against a 13 ms decode step.

Here a row whose sampler needs nothing but a logit_bias, temperature and mlx-lm's top-p / min-p /
top-k filters is sampled in numpy: an argmax when greedy (the same float32 sums, so the same token
as the MLX path), else one inverse-CDF draw over the kept tokens from the sampler's own numpy
Generator (seeded requests are reproducible; the MLX path draws other numbers for the same seed,
so a seeded row keeps to one path: the choice depends on the row's sampler only, never on its
batchmates). Rows with penalties, grammars, logprobs or a thinking state take the MLX path."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import numpy as np
from numba import njit

if TYPE_CHECKING:
    from .sampling import SequenceSampler

_UNSEEDED = np.random.default_rng()  # unseeded requests share one generator, as MLX's global one
NUCLEUS_BUCKETS = 4096  # top-p's one pass sorts only the tokens of the bucket where the mass crosses


def numpy_sampler_ok(sampler: "SequenceSampler") -> bool:
    """Whether this row can be sampled here: no processor but a logit_bias, nothing read back."""
    p = sampler.params
    thinking = sampler.thinking is not None and not sampler.thinking.answering
    return not (sampler._penalty is not None or sampler.matcher is not None or thinking or p.logprobs
                or p.post_sampling_probs or p.presence_penalty or p.frequency_penalty or sampler.chain is not None
                or sampler.dry is not None)


def _biased(row: np.ndarray, bias: tuple[tuple[int, float], ...]) -> np.ndarray:
    if not bias:
        return row
    row = row.copy()
    ids = np.fromiter((i for i, _ in bias), np.int64, len(bias))
    row[ids] += np.fromiter((v for _, v in bias), np.float32, len(bias))  # mlx-lm's `logits.at[ids].add`
    return row


def _log_softmax(row: np.ndarray) -> np.ndarray:
    top = row.max()
    return row - (top + np.log(np.exp(row - top, dtype=np.float32).sum(dtype=np.float32)))


def _nucleus_threshold(x: np.ndarray, top: float, top_p: float, best: Optional[np.ndarray] = None) -> float:
    """mlx-lm's apply_top_p on the biased logits x (max `top`): the lowest value kept, that of the
    smallest best-first set whose mass reaches top_p of the whole. `best`: the top-k's values, when a
    top-k cuts the set anyway (-inf then if the nucleus is wider than they are); else one bucketed
    pass over the vocabulary (`_nucleus_scan`), never a sort of it."""
    shift = np.float32(top)
    if best is None:
        return float(_nucleus_scan(x, shift, top_p))
    total = float(np.exp(x - shift, dtype=np.float32).sum(dtype=np.float64))
    values = np.sort(best)[::-1]
    mass = np.cumsum(np.exp(values - shift, dtype=np.float32), dtype=np.float64)
    reached = np.nonzero(mass >= top_p * total)[0]
    return float(values[reached[0]]) if reached.size else float("-inf")


@njit(cache=True, nogil=True)
def _nucleus_scan(x, shift, top_p):  # pragma: no cover - jitted
    """_nucleus_threshold without a top-k: the values bucketed by rank of magnitude (NUCLEUS_BUCKETS
    over [min, max] of the finite ones) with each bucket's mass exp(x - shift), the buckets summed from
    the top to the one that crosses top_p of the whole, then only that bucket's values sorted. x.min()
    where rounding leaves the mark unreached (every token kept), as the sorted cumulative sum did."""
    low, high = np.inf, -np.inf
    for i in range(x.size):
        if np.isfinite(x[i]):
            low, high = min(low, x[i]), max(high, x[i])
    buckets = NUCLEUS_BUCKETS
    scale = (buckets - 1) / (high - low) if high > low else 0.0
    mass, count = np.zeros(buckets, np.float64), np.zeros(buckets, np.int64)
    for i in range(x.size):
        if np.isfinite(x[i]):
            b = int((high - x[i]) * scale)
            mass[b] += np.exp(x[i] - shift)
            count[b] += 1
    target, run, b = top_p * mass.sum(), 0.0, 0
    while b < buckets and run + mass[b] < target:
        run += mass[b]
        b += 1
    if b == buckets:
        return x.min()
    values, k = np.empty(count[b], np.float32), 0
    for i in range(x.size):
        if np.isfinite(x[i]) and int((high - x[i]) * scale) == b:
            values[k] = x[i]
            k += 1
    values = np.sort(values)[::-1]
    for j in range(k):
        run += np.exp(values[j] - shift)
        if run >= target:
            return values[j]
    return values[k - 1]


def _floor(x: np.ndarray, sampler: "SequenceSampler") -> np.float32:
    """The lowest biased logit mlx-lm's top-p, min-p and top-k filters keep: each keeps a best-first
    prefix, so together they keep the tokens >= the highest of their floors, in any order."""
    p = sampler.params
    top, floor, best = float(x.max()), float("-inf"), None
    if p.min_p > 0.0:
        floor = top + math.log(p.min_p)  # log-softmax's shift cancels: p >= min_p * p_max
    if 0 < p.top_k < x.size:
        best = np.partition(x, x.size - p.top_k)[x.size - p.top_k:]
        floor = max(floor, float(best.min()))
    if 0.0 < p.top_p < 1.0:
        floor = max(floor, _nucleus_threshold(x, top, p.top_p, best))
    return np.float32(floor)


def kept_logprobs(row: np.ndarray, sampler: "SequenceSampler") -> np.ndarray:
    """The float32 log-softmax of the biased row with the tokens sample_row's draw leaves out as -inf."""
    x = _biased(row, sampler.params.logit_bias)
    return np.where(x >= _floor(x, sampler), _log_softmax(x), np.float32(-np.inf))


def sample_row(row: np.ndarray, sampler: "SequenceSampler") -> int:
    """One token of a (V,) float32 row for a sampler numpy_sampler_ok accepted."""
    x = _biased(row, sampler.params.logit_bias)
    if sampler.greedy:
        return int(np.argmax(x))
    # softmax is shift-invariant: the draw reads (x - max) / T over the tokens >= the filters' floor
    inv_t = np.float32(1.0 / sampler.params.temperature)
    return _draw(x, np.float32(x.max()), _floor(x, sampler), inv_t, generator(sampler).random())


@njit(cache=True, nogil=True, fastmath=False)
def _draw(x, top, floor, inv_t, u):  # pragma: no cover - jitted
    """The inverse-CDF draw at u in [0, 1) over exp((x - top) * inv_t) of the tokens >= floor."""
    weights = np.zeros(x.size, np.float32)
    total = 0.0
    for i in range(x.size):
        if x[i] >= floor:
            weights[i] = np.exp((x[i] - top) * inv_t)
            total += weights[i]
    target, run, last = u * total, 0.0, 0
    for i in range(x.size):
        if weights[i] > 0.0:
            run += weights[i]
            last = i
            if run > target:
                return i
    return last


def generator(sampler: "SequenceSampler") -> np.random.Generator:
    """The sampler's own generator (seeded from its request's seed), else the shared unseeded one."""
    return sampler.np_rng if sampler.np_rng is not None else _UNSEEDED


__all__ = ["kept_logprobs", "numpy_sampler_ok", "sample_row"]
