"""post_sampling_probs: the logprobs of the distribution the sampler draws from, after top-p,
min-p, top-k and temperature (llama-server's post-sampling probs), against a numpy reference
of the same chain and against the sampler's own draws."""

import math
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.engine.core.request import SamplingParams
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step
from mlxcel_py.errors import RequestError

V = 64


def _logits(seed: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((1, V)).astype(np.float32) * 2)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    finite = x[np.isfinite(x)]
    m = finite.max()
    return x - (m + np.log(np.exp(finite - m).sum()))


def reference(raw: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Our sampler's chain by its definitions: top-p (the fewest best tokens reaching p), min-p, top-k, temperature."""
    lp = _log_softmax(raw.astype(np.float64))
    order = np.argsort(-lp)
    above = np.concatenate([[0.0], np.cumsum(np.exp(lp[order]))[:-1]])  # mass of the better tokens
    keep = np.zeros(V, bool)
    keep[order[above < p.top_p]] = True
    keep &= lp >= lp.max() + math.log(p.min_p)
    kth = np.sort(np.where(keep, lp, -np.inf))[::-1][p.top_k - 1]
    keep &= lp >= kth
    return _log_softmax(np.where(keep, lp / p.temperature, -np.inf))


PARAMS = SamplingParams(temperature=0.7, top_p=0.9, min_p=0.02, top_k=8, seed=5, logprobs=True, top_logprobs=20,
                        post_sampling_probs=True)


def test_post_sampling_logprobs_equal_the_reference_chain():
    logits = _logits(1)
    ref = reference(np.array(logits)[0], PARAMS)
    survivors = {int(i) for i in np.flatnonzero(np.isfinite(ref))}
    assert 2 <= len(survivors) <= 8  # the filters bite at these settings
    got = sample_step(logits, [SequenceSampler(PARAMS)])[0]
    record = got.logprobs
    assert got.token_id in survivors
    assert record.logprob == pytest.approx(ref[got.token_id], abs=1e-5)
    assert [t for t, _ in record.top] == sorted(survivors, key=lambda t: -ref[t])  # only what can be drawn
    assert [v for _, v in record.top] == pytest.approx([ref[t] for t, _ in record.top], abs=1e-5)
    assert sum(math.exp(v) for _, v in record.top) == pytest.approx(1.0, abs=1e-5)


def test_the_sampler_draws_by_those_probabilities():
    logits = _logits(1)
    sampler = SequenceSampler(PARAMS)
    draws = Counter(sample_step(logits, [sampler])[0].token_id for _ in range(2000))
    probs = dict(sample_step(logits, [SequenceSampler(PARAMS)])[0].logprobs.top)
    assert set(draws) <= set(probs)
    for token, logprob in probs.items():
        assert draws[token] / 2000 == pytest.approx(math.exp(logprob), abs=0.04), token


def test_greedy_is_all_the_mass_on_the_argmax_and_pre_sampling_is_unchanged():
    logits = _logits(2)
    best = int(np.argmax(np.array(logits)[0]))
    greedy = SamplingParams(logprobs=True, top_logprobs=3, post_sampling_probs=True)
    record = sample_step(logits, [SequenceSampler(greedy)])[0].logprobs
    assert record.token_id == best and record.logprob == 0.0 and record.top == ((best, 0.0),)
    pre = SamplingParams(**{**{f: getattr(PARAMS, f) for f in ("temperature", "top_p", "min_p", "top_k", "seed")},
                            "logprobs": True, "top_logprobs": 3})
    record = sample_step(logits, [SequenceSampler(pre)])[0].logprobs
    expect = _log_softmax(np.array(logits)[0].astype(np.float64))
    assert record.logprob == pytest.approx(expect[record.token_id], abs=1e-5) and len(record.top) == 3


def test_post_sampling_probs_needs_logprobs():
    with pytest.raises(RequestError, match="post_sampling_probs needs logprobs to be true") as info:
        SamplingParams(post_sampling_probs=True)
    assert info.value.param == "post_sampling_probs"
