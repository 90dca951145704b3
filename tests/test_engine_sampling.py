"""Constraints, logprobs and logit processors through the real engine on the tiny model:
the runner applies what each request asks, row by row, and batching changes nothing."""

import json
import random

import jsonschema
import mlx.core as mx
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Finished, PromptProgress, Request, SamplingParams, TokenDelta, build_engine
from mlxcel_py.engine.core.request import ConstraintSpec

from config_helpers import flags_for
from tiny import tiny_model

SCHEMA = {
    "type": "object",
    "properties": {"name": {"enum": ["ann", "bob"]}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def prompt(n, seed):
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def run(lm, requests, parallel=4, **kw):
    """Run requests to completion on one engine, tick by tick; events per request id."""
    engine = build_engine(resolve("serve", flags_for("serve", parallel=parallel, **kw), env={}).engine, lm)
    for r in requests:
        engine.add_request(r)
    events = {r.request_id: [] for r in requests}
    while engine.has_work():
        for e in engine.step():
            events[e.request_id].append(e)
    return events


def text_of(lm, events):
    return lm.tokenizer.decode([e.token_id for e in events if isinstance(e, TokenDelta)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_json_schema_constraint_yields_valid_json_at_temperature_one(lm, seed):
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=200, constraint=ConstraintSpec("json_schema", json.dumps(SCHEMA)))
    events = run(lm, [Request("j", prompt(12, seed), params)])["j"]
    assert events[-1].finish_reason == "stop"  # the grammar completed and EOS followed
    jsonschema.validate(json.loads(text_of(lm, events)), SCHEMA)


def test_logprobs_are_sorted_non_positive_and_led_by_the_greedy_token(lm):
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=5)
    deltas = [e for e in run(lm, [Request("l", prompt(20, 3), params)])["l"] if isinstance(e, TokenDelta)]
    assert len(deltas) == 6
    for d in deltas:
        lp = d.logprobs
        assert lp.token_id == d.token_id and lp.logprob <= 0 and len(lp.top) == 5
        assert lp.top[0] == (d.token_id, pytest.approx(lp.logprob))
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_prompt_logprobs_equal_a_full_forward_whatever_the_chunk(lm):
    ids = prompt(40, 5)
    logits = lm.model(mx.array([list(ids)]))[0]
    reference = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    params = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=True, top_logprobs=2, prompt_logprobs=True)
    for chunk in (0, 16):
        events = run(lm, [Request("e", ids, params)], prefill_chunk_size=chunk)["e"]
        scored = [lp for e in events if isinstance(e, PromptProgress) for lp in e.logprobs]
        assert len(scored) == 40 and scored[0] is None
        for i, lp in enumerate(scored[1:], start=1):
            assert lp.token_id == ids[i]
            assert lp.logprob == pytest.approx(reference[i - 1][ids[i]], abs=1e-4)
            assert lp.top[0][1] == pytest.approx(max(reference[i - 1]), abs=1e-4)


def test_a_logit_bias_of_minus_100_on_the_greedy_token_changes_it(lm):
    ids = prompt(20, 7)
    free = run(lm, [Request("a", ids, SamplingParams(max_tokens=1, ignore_eos=True))])["a"]
    first = next(e.token_id for e in free if isinstance(e, TokenDelta))
    banned = SamplingParams(max_tokens=1, ignore_eos=True, logit_bias=((first, -100.0),))
    again = run(lm, [Request("b", ids, banned)])["b"]
    assert next(e.token_id for e in again if isinstance(e, TokenDelta)) != first


def test_mixed_rows_batched_equal_each_alone(lm):
    """A plain greedy row, a penalized row, a biased row with logprobs and a constrained row
    decode together exactly as each does alone."""
    schema = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    requests = [
        Request("plain", prompt(9, 1), SamplingParams(max_tokens=12, ignore_eos=True)),
        Request("penalty", prompt(30, 2), SamplingParams(max_tokens=12, ignore_eos=True, presence_penalty=1.5,
                                                          frequency_penalty=0.5, repetition_penalty=1.3)),
        Request("bias", prompt(17, 3), SamplingParams(max_tokens=12, ignore_eos=True, logit_bias=((7, 5.0),),
                                                       logprobs=True, top_logprobs=3)),
        Request("json", prompt(12, 4), SamplingParams(temperature=0.8, seed=9, max_tokens=60, constraint=schema)),
    ]
    together = run(lm, requests, parallel=4, prompt_cache=False)
    for r in requests:
        alone = run(lm, [r], parallel=1, prompt_cache=False)[r.request_id]
        deltas = lambda evs: [e for e in evs if isinstance(e, TokenDelta)]  # noqa: E731
        batched, single = deltas(together[r.request_id]), deltas(alone)
        assert [e.token_id for e in batched] == [e.token_id for e in single], r.request_id
        for b, s in zip(batched, single):  # a batched matmul rounds differently: values agree to 1e-4
            assert (b.logprobs is None) == (s.logprobs is None)
            if b.logprobs is not None:
                assert [t for t, _ in b.logprobs.top] == [t for t, _ in s.logprobs.top]
                assert b.logprobs.logprob == pytest.approx(s.logprobs.logprob, abs=1e-4)
        assert isinstance(alone[-1], Finished)
