"""sampling_np (the CPU step's numpy logits sampled without MLX) against the MLX path it stands in
for: the same greedy tokens, the same kept sets and target logits under mlx-lm's filters, draws that
follow the target distribution, seeded rows reproducible and independent of their batchmates."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.engine.core.request import SamplingParams
from mlxcel_py.engine.runner.sampling import SequenceSampler, _sample_mlx, sample_step
from mlxcel_py.engine.runner.sampling_np import kept_logprobs, numpy_sampler_ok, sample_row

V = 4096


def logits_of(batch: int, seed: int, vocab: int = V) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((batch, vocab)) * 3).astype(np.float32)


def test_greedy_rows_with_a_logit_bias_take_the_mlx_paths_token():
    logits = logits_of(4, 0)
    for row in range(4):
        best = int(np.argmax(logits[row]))
        for bias in ((), ((best, -100.0),), ((best, -100.0), (7, 50.0)), ((3, float("-inf")),)):
            params = SamplingParams(logit_bias=bias)
            ours = sample_row(logits[row], SequenceSampler(params))
            mlx = _sample_mlx(mx.array(logits[row : row + 1]), [SequenceSampler(params)], None)[0].token_id
            assert ours == mlx


@pytest.mark.parametrize("filters", [
    dict(), dict(top_k=20), dict(top_p=0.9), dict(top_p=0.5, top_k=100), dict(min_p=0.05),
    dict(top_p=0.95, min_p=0.02, top_k=40), dict(top_p=0.999), dict(top_k=1),
])
def test_kept_logprobs_equal_mlx_lms_filters(filters):
    logits = logits_of(3, 1)
    params = SamplingParams(temperature=0.7, logit_bias=((5, 4.0),), **filters)
    for row in logits:
        sampler = SequenceSampler(params)
        ours = kept_logprobs(row, sampler) * np.float32(1 / 0.7)
        processed = sampler.process(mx.array(row[None]))
        theirs = np.array(sampler._target(processed - mx.logsumexp(processed, axis=-1, keepdims=True)))[0]
        differ = np.isfinite(ours) != np.isfinite(theirs)
        # float32 sums in another order can move top-p's boundary by a tail token or two, never more
        assert differ.sum() <= 2 and np.exp(kept_logprobs(row, SequenceSampler(SamplingParams()))[differ]).sum() < 1e-4
        kept = np.isfinite(ours) & np.isfinite(theirs)
        np.testing.assert_allclose(ours[kept], theirs[kept], rtol=0, atol=2e-5)


def _sorted_threshold(x: np.ndarray, top_p: float) -> float:
    """top-p's threshold the plain way: the whole row sorted, its cumulative mass."""
    shift = np.float32(x.max())
    total = float(np.exp(x - shift, dtype=np.float32).sum(dtype=np.float64))
    values = np.sort(x)[::-1]
    reached = np.nonzero(np.cumsum(np.exp(values - shift, dtype=np.float32), dtype=np.float64) >= top_p * total)[0]
    return float(values[reached[0]]) if reached.size else float(x.min())


@pytest.mark.parametrize("vocab", [50, 1000, 49152, 262144])
def test_the_bucketed_top_p_threshold_equals_the_sorted_ones(vocab):
    """One pass and a sort of one bucket (_nucleus_scan) against the whole row sorted: peaked and flat
    rows, ties, banned (-inf) tokens, every top_p."""
    from mlxcel_py.engine.runner.sampling_np import _nucleus_threshold

    rng = np.random.default_rng(vocab)
    for trial in range(40):
        x = (rng.standard_normal(vocab) * (0.3, 1.0, 3.0, 10.0, 30.0)[trial % 5]).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x)
        if trial % 4 == 0:
            x[rng.integers(0, vocab, 5)] = -np.inf
        top_p = (0.1, 0.5, 0.9, 0.95, 0.999)[trial % 5]
        assert _nucleus_threshold(x, float(x.max()), top_p) == _sorted_threshold(x, top_p), (trial, top_p)


def test_the_top_p_threshold_past_the_first_candidates_reads_the_whole_vocabulary():
    flat = np.zeros(V, np.float32)  # every token as likely: top_p 0.5 keeps half of them
    kept = np.isfinite(kept_logprobs(flat, SequenceSampler(SamplingParams(temperature=1.0, top_p=0.5))))
    assert kept.sum() == V  # ties at the threshold are all kept, as mlx-lm's `logprobs < threshold`
    rising = np.linspace(0, 1, V, dtype=np.float32)
    kept = np.isfinite(kept_logprobs(rising, SequenceSampler(SamplingParams(temperature=1.0, top_p=0.5))))
    assert 1000 < kept.sum() < 3000 and kept[-1] and not kept[0]


@pytest.mark.parametrize("filters", [dict(), dict(top_k=4), dict(top_p=0.8), dict(min_p=0.1),
                                     dict(top_p=0.9, top_k=5, min_p=0.02), dict(top_p=0.6, top_k=3)])
def test_draws_follow_the_target_distribution(filters):
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, -0.5], np.float32)
    sampler = SequenceSampler(SamplingParams(temperature=0.8, seed=11, **filters))
    target = kept_logprobs(row, sampler) / 0.8
    want = np.exp(target - target.max())
    want /= want.sum()
    draws = np.bincount([sample_row(row, sampler) for _ in range(8000)], minlength=row.size) / 8000
    assert np.all(draws[want == 0] == 0)  # nothing outside the kept set
    np.testing.assert_allclose(draws, want, atol=0.015)


def test_seeded_rows_are_reproducible_and_ignore_their_batchmates():
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=64)
    steps = [logits_of(3, 100 + i) for i in range(12)]

    def run(batchmates):
        samplers = [SequenceSampler(params)] + [SequenceSampler(p) for p in batchmates]
        return [sample_step(logits[: len(samplers)], samplers)[0].token_id for logits in steps]

    alone = run([])
    assert run([]) == alone
    # a logprobs row (the MLX path) and an unseeded sampled row beside it change nothing
    assert run([SamplingParams(logprobs=True), SamplingParams(temperature=1.2)]) == alone
    assert len(set(alone)) > 3  # it sampled, not an argmax


def test_rows_that_read_more_than_the_logits_take_the_mlx_path():
    assert numpy_sampler_ok(SequenceSampler(SamplingParams(temperature=0.5, top_k=3, logit_bias=((1, 2.0),))))
    for params in (SamplingParams(logprobs=True), SamplingParams(repetition_penalty=1.1),
                   SamplingParams(presence_penalty=0.5), SamplingParams(frequency_penalty=0.5),
                   SamplingParams(temperature=0.7, logprobs=True, post_sampling_probs=True)):
        assert not numpy_sampler_ok(SequenceSampler(params))
    logits = logits_of(2, 3)
    out = sample_step(logits, [SequenceSampler(SamplingParams(logprobs=True, top_logprobs=2)),
                               SequenceSampler(SamplingParams())])
    assert out[0].logprobs is not None and out[0].token_id == int(np.argmax(logits[0]))
    assert out[1].logprobs is None and out[1].token_id == int(np.argmax(logits[1]))
