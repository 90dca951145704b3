"""llama.cpp's sampler chain on one row of logits, in numpy: top-k, typical, top-p, min-p, XTC, dynamic
temperature, top-n-sigma and mirostat 1 and 2, as src/llama-sampler.cpp defines them (its candidate array: the
order it keeps, when it sorts, float32 sums in order), tested against llama.cpp's own samplers on fixed logits
(tests/test_sampler_chain.py, tests/fixtures/samplers_llama_cpp.json).

A request takes this chain when it sets any of those samplers or its own `samplers` order; the others keep
the plain path (sampling.py, sampling_np.py). The logits come in processed (logit_bias, penalties, a
grammar's mask: llama.cpp's penalties come first in its default order too). The draw is the sequence's own
generator, so a seeded request draws the same tokens alone or batched."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.chain_params import DEFAULT_ORDER as SERVER_ORDER
from ..core.chain_params import ChainParams

# llama-server's default order (common/common.h), less penalties and DRY: logit processors here, they run
# before the chain wherever an order names them (first, as in the default order).
APPLIED_BEFORE = ("penalties", "dry")
DEFAULT_ORDER = tuple(name for name in SERVER_ORDER if name not in APPLIED_BEFORE)
MIROSTAT_M = 100  # llama-server's candidates for mirostat 1's s_hat


@dataclass
class Candidates:
    """llama.cpp's llama_token_data_array: ids and logits in the array's order, probabilities when computed."""

    ids: np.ndarray
    logits: np.ndarray
    p: Optional[np.ndarray] = None
    sorted: bool = False

    def sort(self) -> None:
        if not self.sorted:
            order = np.argsort(-self.logits, kind="stable")
            self.ids, self.logits = self.ids[order], self.logits[order]
            self.p = None if self.p is None else self.p[order]
            self.sorted = True

    def best(self, k: int) -> None:
        """Keep the k highest, sorted: a partial sort when k is small against the array (top-k's)."""
        if self.sorted or k * 4 >= self.size:
            self.sort()
            self.keep(slice(0, k))
            return
        part = np.argpartition(-self.logits, k - 1)[:k]
        self.keep(part[np.argsort(-self.logits[part], kind="stable")])
        self.sorted = True

    def softmax(self, do_sort: bool = True) -> None:
        if do_sort:
            self.sort()
        e = np.exp(self.logits - np.float32(self.logits.max()), dtype=np.float32)
        self.p = e / np.cumsum(e, dtype=np.float32)[-1]

    def keep(self, index) -> None:
        self.ids, self.logits = self.ids[index], self.logits[index]
        self.p = None if self.p is None else self.p[index]

    @property
    def size(self) -> int:
        return int(self.ids.size)


@dataclass
class ChainSettings:
    """One request's chain (data: its SamplingParams' plain samplers and ChainParams)."""

    order: tuple[str, ...] = DEFAULT_ORDER  # the chain's steps (penalties and DRY run before it)
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    more: ChainParams = ChainParams()


def settings_for(params) -> ChainSettings:
    """A request's SamplingParams as the chain's settings."""
    order = tuple(name for name in (params.chain.order or SERVER_ORDER) if name not in APPLIED_BEFORE)
    return ChainSettings(order, params.temperature, params.top_k, params.top_p, params.min_p, params.chain)


@dataclass
class SamplerChain:
    """A sequence's chain and its state (mirostat's mu), drawing with the sequence's generator."""

    settings: ChainSettings
    rng: np.random.Generator
    mu: float = field(init=False)

    def __post_init__(self) -> None:
        self.mu = 2.0 * self.settings.more.mirostat_tau

    def candidates(self, row: np.ndarray) -> Candidates:
        """The candidates the chain leaves for `row` (V,) float32, before the draw (mirostat: its truncation)."""
        s, m = self.settings, self.settings.more
        c = Candidates(np.arange(row.size, dtype=np.int64), np.asarray(row, dtype=np.float32).copy())
        if m.mirostat:
            temp(c, s.temperature)
            c.softmax(do_sort=False)  # over the whole vocabulary, sorted only where needed
            if m.mirostat == 1:
                top_k(c, max(mirostat_k(c, self.mu, row.size), 1))
            else:  # the sorted prefix before the first surprise above mu: every token at or below it
                with np.errstate(divide="ignore"):
                    kept = np.flatnonzero(~(-np.log2(c.p) > np.float32(self.mu)))
                c.keep(kept) if kept.size else c.best(1)
            c.softmax()
            return c
        for name in s.order:
            if name == "top_k":
                top_k(c, s.top_k)
            elif name == "typ_p":
                typical(c, m.typical_p, m.min_keep)
            elif name == "top_p":
                top_p(c, s.top_p, m.min_keep)
            elif name == "min_p":
                min_p(c, s.min_p, m.min_keep)
            elif name == "xtc":
                xtc(c, m.xtc_probability, m.xtc_threshold, m.min_keep, self.rng)
            elif name == "temperature":
                temp_ext(c, s.temperature, m.dynatemp_range, m.dynatemp_exponent)
            elif name == "top_n_sigma":
                top_n_sigma(c, m.top_n_sigma)
        return c

    def distribution(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) the draw picks from (llama.cpp's dist: a softmax in the array's order)."""
        c = self.candidates(row)
        if not self.settings.more.mirostat:
            c.softmax(do_sort=False)
        return c.ids, c.p

    def sample(self, row: np.ndarray) -> int:
        ids, p = self.distribution(row)
        index = draw(p, self.rng.random())
        self.chose(float(p[index]))
        return int(ids[index])

    def sample_with_distribution(self, row: np.ndarray) -> tuple[int, np.ndarray]:
        """A token and the (V,) log-probabilities it was drawn from (-inf outside the candidates)."""
        ids, p = self.distribution(row)
        index = draw(p, self.rng.random())
        self.chose(float(p[index]))
        dist = np.full(row.size, -np.inf, np.float32)
        with np.errstate(divide="ignore"):
            dist[ids] = np.log(p)
        return int(ids[index]), dist

    def choose(self, row: np.ndarray, draft: Optional[int]) -> tuple[int, bool]:
        """A verified position's token and whether it is `draft`: keep the draft with its probability here,
        else draw from the rest renormalized (speculative sampling for a point-mass draft); mirostat learns
        the token's surprise under this distribution."""
        ids, p = self.distribution(row)
        where = np.flatnonzero(ids == draft) if draft is not None else np.empty(0, np.int64)
        if where.size and self.rng.random() < float(p[where[0]]):
            self.chose(float(p[where[0]]))
            return int(draft), True
        rest = p.astype(np.float64)
        rest[where] = 0.0
        if rest.sum() <= 0.0:  # the draft was the only candidate
            self.chose(float(p[where[0]]))
            return int(draft), True
        index = draw(rest, self.rng.random())
        self.chose(float(p[index]))
        return int(ids[index]), False

    def chose(self, p: float) -> None:
        """The chosen token's probability: mirostat's mu learns from its surprise."""
        m = self.settings.more
        if m.mirostat:
            self.mu -= m.mirostat_eta * (-math.log2(p) - m.mirostat_tau)


def draw(p: np.ndarray, u: float) -> int:
    """llama.cpp's dist: the first index whose running sum reaches u of the whole."""
    run = np.cumsum(p, dtype=np.float64)
    return int(min(np.searchsorted(run, u * run[-1]), p.size - 1))


def top_k(c: Candidates, k: int) -> None:
    if k <= 0:
        return
    c.best(min(k, c.size))


def top_p(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.softmax(do_sort=False)  # the probabilities in the array's order, then sorted (as llama.cpp's buffer)
    if not c.sorted and c.size > 1024:  # llama.cpp's heuristic: the best 256 first, the rest only if needed
        part = np.argpartition(-c.logits, 255)[:256]
        part = part[np.argsort(-c.logits[part], kind="stable")]
        cum = np.cumsum(c.p[part], dtype=np.float32)
        hit = np.flatnonzero((cum >= np.float32(p)) & (np.arange(1, 257) >= min_keep))
        if hit.size:
            c.keep(part[: int(hit[0]) + 1])
            c.sorted = True
            return
    c.sort()
    cum = np.cumsum(c.p, dtype=np.float32)
    hit = np.flatnonzero((cum >= np.float32(p)) & (np.arange(1, c.size + 1) >= min_keep))
    c.keep(slice(0, int(hit[0]) + 1 if hit.size else c.size))


def min_p(c: Candidates, p: float, min_keep: int) -> None:
    if p <= 0.0 or not c.size:
        return
    if not c.sorted:
        floor = np.float32(c.logits.max()) + np.float32(math.log(p))
        kept = np.flatnonzero(c.logits >= floor)
        if kept.size and kept.size >= min_keep:
            c.keep(kept)
            return
    c.sort()
    floor = c.logits[0] + np.float32(math.log(p))
    below = np.flatnonzero((c.logits < floor) & (np.arange(c.size) >= min_keep))
    c.keep(slice(0, int(below[below >= 1][0]) if (below >= 1).any() else c.size))


def typical(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    c.softmax()
    with np.errstate(divide="ignore"):
        logs = np.log(c.p)
    # 0 log 0 = 0: tokens top-n-sigma left at -inf count for nothing (llama.cpp's sum turns NaN there, and its
    # sort by NaN scores is unspecified), and sort last
    entropy = np.cumsum(np.where(c.p > 0, -c.p * np.where(c.p > 0, logs, 0), 0), dtype=np.float32)[-1]
    order = np.argsort(np.abs(-logs - entropy), kind="stable")
    cum = np.cumsum(c.p[order], dtype=np.float32)
    hit = np.flatnonzero((cum > np.float32(p)) & ((min_keep == 0) | (np.arange(c.size) >= min_keep - 1)))
    c.keep(order[: int(hit[0]) + 1 if hit.size else c.size])
    c.sorted = False


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, rng: np.random.Generator) -> None:
    if probability <= 0.0 or threshold > 0.5 or c.size < 2:
        return
    if rng.random() > probability:
        return
    c.softmax()
    above = c.p >= np.float32(threshold)
    last = int(np.argmin(above)) - 1 if not above.all() else c.size - 1  # the last of the leading run
    if c.size - last >= min_keep and last > 0:
        c.keep(slice(last, c.size))


def temp(c: Candidates, t: float) -> None:
    """llama.cpp's temp_impl: t <= 0 keeps the (first) highest logit and sets the rest to -inf."""
    if not c.size:
        return
    if t <= 0.0:
        best = int(np.argmax(c.logits))
        c.logits = np.where(np.arange(c.size) == best, c.logits, np.float32(-np.inf)).astype(np.float32)
        return
    c.logits = (c.logits / np.float32(t)).astype(np.float32)


def temp_ext(c: Candidates, t: float, delta: float, exponent: float) -> None:
    if delta <= 0.0:
        temp(c, t)
        return
    low, high = max(0.0, t - delta), t + delta
    if c.size <= 1:
        return
    max_entropy = -math.log(1.0 / c.size)
    c.softmax()
    positive = c.p[c.p > 0]
    entropy = -np.cumsum(positive * np.log(positive), dtype=np.float32)[-1]
    temp(c, low + (high - low) * float(np.float32(entropy / max_entropy)) ** exponent)
    e = np.exp(c.logits.astype(np.float64) - float(c.logits[0]))
    c.p = (e / e.sum()).astype(np.float32)


def top_n_sigma(c: Candidates, n: float) -> None:
    if n <= 0.0 or c.size <= 1:
        return
    valid = c.logits[c.logits != -np.inf]
    if not valid.size:
        return
    mean = np.cumsum(valid, dtype=np.float32)[-1] / np.float32(valid.size)
    std = math.sqrt(float(np.cumsum((valid.astype(np.float64) - mean) ** 2, dtype=np.float32)[-1]) / valid.size)
    cut = np.float32(valid.max()) - np.float32(n * std)
    c.logits = np.where(c.logits < cut, np.float32(-np.inf), c.logits).astype(np.float32)


def mirostat_k(c: Candidates, mu: float, n_vocab: int) -> int:
    """Mirostat 1's k: Zipf's exponent s_hat from the top MIROSTAT_M probabilities, then the k whose surprise
    matches mu; in float32 and converted as C++ converts on x86 (out of range or NaN: INT_MIN, so top-1)."""
    m = min(MIROSTAT_M - 1, c.size - 1)
    if m <= 0:
        return 1
    top = np.sort(np.partition(c.p, c.size - m - 1)[c.size - m - 1:])[::-1] if m + 1 < c.size else np.sort(c.p)[::-1]
    i = np.arange(m, dtype=np.float32)
    t = np.log((i + 2) / (i + 1)).astype(np.float32)
    b = np.log(top[:m] / top[1:m + 1]).astype(np.float32)
    f = np.float32
    with np.errstate(all="ignore"):
        s_hat = np.cumsum(t * b, dtype=np.float32)[-1] / np.cumsum(t * t, dtype=np.float32)[-1]
        eps = f(s_hat - f(1))
        k = np.power(f(eps * np.power(f(2), f(mu))) / f(f(1) - np.power(f(n_vocab), -eps)), f(1) / s_hat)
    return int(k) if np.isfinite(k) and -2**31 <= k < 2**31 else -2**31
