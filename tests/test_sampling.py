"""Sampling: logit_bias and penalties equal a hand-computed reference, logprobs are the
log-softmax of what was sampled, batched == single, and the greedy fast path is untouched."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.engine.core.request import ConstraintSpec, SamplingParams, check_logit_bias
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step
from mlxcel_py.errors import RequestError

from sampling_helpers import logprobs_of, sample_rows

V = 64


def random_logits(batch: int, seed: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((batch, V)).astype(np.float32) * 3)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_default_params_keep_the_one_argmax_fast_path():
    samplers = [SequenceSampler(SamplingParams()) for _ in range(3)]
    assert not any(s.needs_processing for s in samplers)
    logits = random_logits(3, 0)
    expect = np.argmax(np.array(logits), axis=-1).tolist()
    assert sample_rows(logits, samplers).tolist() == expect
    assert [t.token_id for t in sample_step(logits, samplers)] == expect
    assert all(s.generated == [] and s.history == [] for s in samplers)


def test_logit_bias_minus_100_on_the_argmax_changes_the_argmax():
    logits = random_logits(1, 1)
    order = np.argsort(-np.array(logits)[0])
    sampler = SequenceSampler(SamplingParams(logit_bias=((int(order[0]), -100.0),)))
    assert sampler.needs_processing
    assert sample_step(logits, [sampler])[0].token_id == order[1]
    boosted = SequenceSampler(SamplingParams(logit_bias=((int(order[-1]), 100.0),)))
    assert sample_step(logits, [boosted])[0].token_id == order[-1]


def test_a_minus_inf_bias_is_never_sampled_even_when_boosted_by_temperature():
    logits = random_logits(1, 1)
    best = int(np.argmax(np.array(logits)[0]))
    params = SamplingParams(temperature=100.0, seed=3, logit_bias=((best, -math.inf),), logprobs=True, top_logprobs=5)
    sampler = SequenceSampler(params)
    drawn = {sample_step(logits, [sampler])[0].token_id for _ in range(200)}
    assert best not in drawn and len(drawn) > 10
    record = sample_step(logits, [SequenceSampler(params)])[0].logprobs
    assert best not in dict(record.top)  # a banned token is no alternative either


def test_penalties_and_bias_equal_a_hand_computed_reference():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, logit_bias=((9, 2.0), (5, -1.0)),
                            repetition_penalty=1.5, repetition_context=4)
    prompt = [3, 4, 11]
    sampler = SequenceSampler(params, prompt_ids=prompt)
    for t in (5, 5, 7, 5, 3):
        sampler.accept(t)
    raw = np.array(random_logits(1, 2))[0]
    expect = raw.copy()
    for t in set((prompt + [5, 5, 7, 5, 3])[-4:]):  # repetition: prompt + generated, last 4 tokens
        expect[t] = expect[t] * 1.5 if expect[t] < 0 else expect[t] / 1.5
    expect[9] += 2.0
    expect[5] -= 1.0
    counts = {5: 3, 7: 1, 3: 1}  # presence and frequency: generated tokens only (prompt's 3 and 4 do not count twice)
    for t, n in counts.items():
        expect[t] -= 0.5 + 0.3 * n
    got = np.array(sampler.process(mx.array(raw[None])))[0]
    assert np.allclose(got, expect, atol=1e-5)


def test_penalties_count_every_generated_token_not_a_window():
    sampler = SequenceSampler(SamplingParams(frequency_penalty=1.0, max_tokens=100))
    for _ in range(50):
        sampler.accept(7)
    got = np.array(sampler.process(mx.zeros((1, V))))[0]
    assert got[7] == -50.0 and got[8] == 0.0


def test_top_logprobs_are_sorted_non_positive_and_the_greedy_token_comes_first():
    logits = random_logits(1, 3)
    sampler = SequenceSampler(SamplingParams(logprobs=True, top_logprobs=5, presence_penalty=1.0))
    sampler.accept(int(np.argmax(np.array(logits))))  # the penalty moves the greedy token
    processed = np.array(sampler.process(logits))[0]
    (out,) = sample_step(logits, [sampler])
    lp = out.logprobs
    reference = log_softmax(processed)
    assert out.token_id == int(np.argmax(processed)) == lp.token_id == lp.top[0][0]
    assert len(lp.top) == 5 and all(v <= 0 for _, v in lp.top)
    assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
    assert [i for i, _ in lp.top] == np.argsort(-reference)[:5].tolist()
    assert all(math.isclose(v, reference[i], abs_tol=1e-5) for i, v in lp.top)
    assert math.isclose(lp.logprob, reference[out.token_id], abs_tol=1e-5)


def test_logprobs_without_alternatives_and_the_standalone_function():
    logits = random_logits(1, 4)
    (out,) = sample_step(logits, [SequenceSampler(SamplingParams(logprobs=True, temperature=1.0, seed=3))])
    reference = log_softmax(np.array(logits)[0])
    assert out.logprobs.top == () and math.isclose(out.logprobs.logprob, reference[out.token_id], abs_tol=1e-5)
    record = logprobs_of(logits, 17, 3)
    assert record.token_id == 17 and math.isclose(record.logprob, reference[17], abs_tol=1e-5)
    assert [i for i, _ in record.top] == np.argsort(-reference)[:3].tolist()


def test_batched_sampling_equals_each_row_alone():
    params = [SamplingParams(temperature=0.8, seed=1, top_p=0.9), SamplingParams(),
              SamplingParams(temperature=1.2, seed=2, frequency_penalty=0.5, logprobs=True, top_logprobs=2),
              SamplingParams(logit_bias=((0, 5.0),))]
    batched = [SequenceSampler(p) for p in params]
    alone = [SequenceSampler(p) for p in params]
    for step in range(6):
        logits = random_logits(len(params), 10 + step)
        got = sample_step(logits, batched)
        want = [sample_step(logits[i : i + 1], [s])[0] for i, s in enumerate(alone)]
        assert got == want


def test_masked_tokens_never_appear_among_the_alternatives(tiny_compiler):
    compiler, lm = tiny_compiler
    (digit_7,) = lm.tokenizer.encode("7", add_special_tokens=False)
    sampler = SequenceSampler(SamplingParams(logprobs=True, top_logprobs=5),
                              matcher=compiler.matcher(ConstraintSpec("regex", "7")))
    logits = mx.array(np.random.default_rng(5).standard_normal((1, lm.model.args.vocab_size)).astype(np.float32))
    (out,) = sample_step(logits, [sampler], compiler)
    assert out.token_id == digit_7 and out.logprobs.top == ((digit_7, 0.0),) and out.logprobs.logprob == 0.0
    assert sampler.matcher.done


def test_a_constrained_row_does_not_change_its_unconstrained_neighbours(tiny_compiler):
    compiler, lm = tiny_compiler
    vocab = lm.model.args.vocab_size
    logits = mx.array(np.random.default_rng(6).standard_normal((2, vocab)).astype(np.float32))
    free = SequenceSampler(SamplingParams())
    bound = SequenceSampler(SamplingParams(), matcher=compiler.matcher(ConstraintSpec("regex", "x")))
    tokens = [t.token_id for t in sample_step(logits, [free, bound], compiler)]
    assert tokens == [int(np.argmax(np.array(logits)[0])), lm.tokenizer.encode("x", add_special_tokens=False)[0]]


@pytest.fixture(scope="module")
def tiny_compiler():
    from mlxcel_py.engine.runner.constraints import ConstraintCompiler

    from tiny import tiny_model

    lm = tiny_model()
    return ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids), lm


@pytest.mark.parametrize("kwargs, message", [
    ({"presence_penalty": 2.5}, "presence_penalty must be between -2 and 2 (got 2.5)"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be a finite number"),
    ({"logit_bias": ((5, 101.0),)}, "logit_bias values must be numbers between -100 and 100, or -inf (got 101.0 for token 5)"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias token ids must be non-negative integers (got -1)"),
    ({"logit_bias": ((5, 1.0), (5, 2.0))}, "logit_bias has token 5 twice"),
    ({"logit_bias": {5: 1.0}}, "logit_bias must be a tuple of (token id, bias) pairs"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs must be an integer between 0 and 20 (got 21)"),
    ({"top_logprobs": 3}, "top_logprobs needs logprobs to be true"),
    ({"logprobs": 1}, "logprobs must be true or false (got 1)"),
    ({"constraint": ConstraintSpec("json_object"), "ignore_eos": True}, "ignore_eos cannot be combined with a constraint"),
    ({"constraint": "json"}, "constraint must be a ConstraintSpec (got str)"),
])
def test_sampling_params_errors_name_the_field(kwargs, message):
    with pytest.raises(RequestError) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == message or message in str(info.value)
    assert info.value.param in kwargs


def test_a_constraint_without_its_matcher_is_refused_not_ignored():
    with pytest.raises(ValueError, match="a json_object constraint needs a matcher"):
        SequenceSampler(SamplingParams(constraint=ConstraintSpec("json_object")))


def test_logit_bias_ids_are_checked_against_the_vocabulary():
    check_logit_bias(SamplingParams(logit_bias=((63, 1.0),)), V)
    with pytest.raises(RequestError, match="logit_bias token id 64 is out of range"):
        check_logit_bias(SamplingParams(logit_bias=((64, 1.0),)), V)
