"""A reasoning reply's thinking in the runner's sampling (engine/runner/thinking.py, sampling.py):
the budget forces the end marker's ids after N thinking tokens, an answer-only grammar waits
for the thinking to close, and a lazy grammar (a trigger) is free text until its trigger.
Logits are made by hand, so every token is chosen by the test."""

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.engine.core.request import ConstraintSpec, SamplingParams, ThinkingSpec
from mlxcel_py.engine.runner.constraints import compiler_for
from mlxcel_py.engine.runner.sampling import SequenceSampler, sample_step
from mlxcel_py.engine.runner.thinking import ThinkingState
from mlxcel_py.errors import RequestError
from thinking_fixture import thinking_model, token_id

from config_helpers import flags_for

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def lm():
    return thinking_model()


@pytest.fixture(scope="module")
def compiler(lm):
    return compiler_for(lm)


@pytest.fixture(scope="module")
def ids(lm):
    return {t: token_id(lm, t) for t in ("<think>", "</think>", "<tool_call>")}


def favour(vocab: int, *order: int) -> mx.array:
    """(1, V) logits whose argmax is the first allowed token of `order` (the rest are far below)."""
    row = np.full(vocab, -50.0, dtype=np.float32)
    for rank, token in enumerate(order):
        row[token] = 40.0 - 30.0 * rank  # far apart: a sampler at temperature 1 takes the first too
    return mx.array(row[None, :])


def run(lm, compiler, sampler, choices: list[tuple[int, ...]]) -> list[int]:
    """One greedy step per entry of `choices` (the tokens favoured, best first); the tokens taken."""
    out = []
    for order in choices:
        (token,) = sample_step(favour(lm.logits_width, *order), [sampler], compiler)
        assert token.error is None, token.error
        out.append(token.token_id)
    return out


def test_the_budget_forces_the_end_marker_after_n_thinking_tokens(lm, compiler, ids):
    spec = ThinkingSpec((ids["<think>"],), (ids["</think>"],), open=True, budget=3)
    sampler = SequenceSampler(SamplingParams(thinking=spec))
    words = [(10,), (11,), (12,), (13,), (14,)]  # the model would keep thinking
    assert run(lm, compiler, sampler, words) == [10, 11, 12, ids["</think>"], 14]
    assert sampler.thinking.answering and sampler.thinking.num_thinking == 3
    assert not sampler.needs_processing  # past the thinking the batch's argmax fast path takes the row again


def test_thinking_opened_by_the_output_is_counted_from_its_start_marker(lm, compiler, ids):
    spec = ThinkingSpec((ids["<think>"],), (ids["</think>"],), budget=2)
    sampler = SequenceSampler(SamplingParams(thinking=spec))
    assert run(lm, compiler, sampler, [(ids["<think>"],), (10,), (11,), (12,), (13,)]) \
        == [ids["<think>"], 10, 11, ids["</think>"], 13]


def test_a_natural_end_inside_the_budget_forces_nothing(lm, compiler, ids):
    spec = ThinkingSpec((ids["<think>"],), (ids["</think>"],), open=True, budget=5)
    sampler = SequenceSampler(SamplingParams(thinking=spec))
    assert run(lm, compiler, sampler, [(10,), (ids["</think>"],), (11,), (12,), (13,), (14,), (15,)]) \
        == [10, ids["</think>"], 11, 12, 13, 14, 15]


def test_a_multi_token_end_marker_is_forced_whole_and_a_partial_one_finished(lm, compiler):
    end = (5, 6, 7)
    sampler = SequenceSampler(SamplingParams(thinking=ThinkingSpec((4,), end, open=True, budget=2)))
    assert run(lm, compiler, sampler, [(10,), (11,), (12,), (12,), (12,), (13,)]) == [10, 11, 5, 6, 7, 13]
    sampler = SequenceSampler(SamplingParams(thinking=ThinkingSpec((4,), end, open=True, budget=2)))
    assert run(lm, compiler, sampler, [(10,), (5,), (12,), (12,), (13,)]) == [10, 5, 6, 7, 13]  # 5 began it


def test_a_forced_marker_is_taken_even_where_logit_bias_bans_it(lm, compiler, ids):
    end = ids["</think>"]
    params = SamplingParams(logit_bias=((end, float("-inf")),), logprobs=True,
                            thinking=ThinkingSpec((ids["<think>"],), (end,), open=True, budget=1))
    sampler = SequenceSampler(params)
    assert run(lm, compiler, sampler, [(10,), (11,), (12,)]) == [10, end, 12]


def test_budget_zero_closes_the_thinking_at_once(lm, compiler, ids):
    sampler = SequenceSampler(SamplingParams(thinking=ThinkingSpec((ids["<think>"],), (ids["</think>"],),
                                                                   open=True, budget=0)))
    assert run(lm, compiler, sampler, [(10,), (11,)]) == [ids["</think>"], 11]


def _answer_only(compiler, open_: bool, ids, budget: int = -1) -> SequenceSampler:
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    thinking = ThinkingSpec((ids["<think>"],), (ids["</think>"],), open=open_, budget=budget, constrain_answer=True)
    params = SamplingParams(temperature=1.0, seed=0, constraint=spec, thinking=thinking)
    return SequenceSampler(params, matcher=compiler.matcher(spec))


def _finish_randomly(lm, compiler, sampler, seed: int) -> list[int]:
    """Sample from random logits until EOS, under whatever mask applies (a sampler at temperature 1)."""
    out, key = [], mx.random.key(seed)
    for _ in range(400):
        key, sub = mx.random.split(key)
        (token,) = sample_step(3.0 * mx.random.normal((1, lm.logits_width), key=sub), [sampler], compiler)
        if token.token_id in lm.eos_token_ids:
            return out
        out.append(token.token_id)
    raise AssertionError("no EOS")


@pytest.mark.parametrize("seed", range(3))
def test_an_answer_only_schema_leaves_the_thinking_free_and_constrains_the_answer(lm, compiler, ids, seed):
    sampler = _answer_only(compiler, True, ids)
    letters = lm.tokenizer.encode("Paris is", add_special_tokens=False)
    thought = run(lm, compiler, sampler, [(t,) for t in letters])  # no JSON grammar would take these
    assert thought == letters and not sampler.matcher.ll.is_accepting()
    assert run(lm, compiler, sampler, [(ids["</think>"],)]) == [ids["</think>"]]
    answer = lm.tokenizer.decode(_finish_randomly(lm, compiler, sampler, seed))
    jsonschema.validate(json.loads(answer), SCHEMA)


def test_before_anything_the_answer_grammar_or_the_start_marker_may_come(lm, compiler, ids):
    brace = lm.tokenizer.encode("{", add_special_tokens=False)[0]
    word = lm.tokenizer.encode("Paris", add_special_tokens=False)[0]
    thinks = _answer_only(compiler, False, ids)
    assert run(lm, compiler, thinks, [(word, ids["<think>"], brace)]) == [ids["<think>"]]  # word is masked
    assert run(lm, compiler, thinks, [(word,)]) == [word] and thinks.thinking.phase == "think"
    answers = _answer_only(compiler, False, ids)
    assert run(lm, compiler, answers, [(word, brace, ids["<think>"])]) == [brace] and answers.thinking.answering


def test_an_answer_only_schema_with_a_budget(lm, compiler, ids):
    sampler = _answer_only(compiler, True, ids, budget=2)
    assert run(lm, compiler, sampler, [(10,), (11,), (12,)]) == [10, 11, ids["</think>"]]
    jsonschema.validate(json.loads(lm.tokenizer.decode(_finish_randomly(lm, compiler, sampler, 0))), SCHEMA)


def _tool_spec(trigger: str) -> ConstraintSpec:
    schema = {"type": "object", "properties": {"name": {"const": "add"}, "arguments": SCHEMA},
              "required": ["name", "arguments"], "additionalProperties": False}
    return ConstraintSpec("tool_call", json.dumps({"start": "<tool_call>", "end": "</tool_call>", "schema": schema}),
                          trigger=trigger)


@pytest.mark.parametrize("seed", range(3))
def test_a_lazy_grammar_is_free_text_until_its_trigger_then_the_grammar(lm, compiler, ids, seed):
    spec = _tool_spec("<tool_call>")
    params = SamplingParams(temperature=1.0, seed=seed, constraint=spec)
    sampler = SequenceSampler(params, matcher=compiler.matcher(spec))
    assert sampler.matcher.trigger == (ids["<tool_call>"],)
    words = lm.tokenizer.encode("Let me add", add_special_tokens=False)
    assert run(lm, compiler, sampler, [(t,) for t in words]) == words and not sampler.matcher.active
    run(lm, compiler, sampler, [(ids["<tool_call>"],)])
    assert sampler.matcher.active
    text = "<tool_call>" + lm.tokenizer.decode(_finish_randomly(lm, compiler, sampler, seed))
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text[len("<tool_call>\n"):-len("\n</tool_call>")])
    assert call["name"] == "add" and jsonschema.validate(call["arguments"], SCHEMA) is None


def test_a_lazy_grammar_that_never_triggers_leaves_the_text_free(lm, compiler):
    spec = _tool_spec("<tool_call>")
    sampler = SequenceSampler(SamplingParams(constraint=spec), matcher=compiler.matcher(spec))
    eos = min(lm.eos_token_ids)
    assert run(lm, compiler, sampler, [(20,), (21,), (eos,)]) == [20, 21, eos] and not sampler.matcher.done


def test_the_state_machine_alone():
    state = ThinkingState(ThinkingSpec((1, 2), (3,), budget=1))
    assert [state.accept(t) for t in (1,)] == [False] and state.forced == 2  # the rest of the start marker
    assert state.accept(2) is False and state.phase == "think" and state.forced is None
    assert state.accept(9) is False and state.forced == 3
    with pytest.raises(ValueError, match="token 8 was sampled where 3 was forced"):
        state.accept(8)
    assert state.accept(3) is False and state.answering and state.accept(9) is True


@pytest.mark.parametrize("kwargs,message", [
    ({"start_ids": (), "end_ids": (1,)}, "the thinking markers must be non-empty tuples of token ids"),
    ({"start_ids": (1,), "end_ids": (-1,)}, "the thinking markers must be non-empty tuples of token ids"),
    ({"start_ids": (1,), "end_ids": (2,), "budget": -2}, "the thinking budget must be -1 or between 0 and"),
])
def test_a_thinking_spec_is_validated(kwargs, message):
    with pytest.raises(RequestError, match=message):
        ThinkingSpec(**kwargs)


def test_budgeted_and_answer_only_rows_batched_equal_each_alone(lm, ids):
    """Through the real engine: a budgeted row, an answer-only schema row and a plain row decode
    together as each does alone, and the budgeted row's thinking ends where the budget says."""
    from mlxcel_py.config import resolve
    from mlxcel_py.engine import Request, TokenDelta, build_engine

    def run(requests, parallel):
        engine = build_engine(resolve("serve", flags_for("serve", parallel=parallel, prompt_cache=False),
                                      env={}).engine, lm)
        for r in requests:
            engine.add_request(r)
        out = {r.request_id: [] for r in requests}
        while engine.has_work():
            for e in engine.step():
                if isinstance(e, TokenDelta):
                    out[e.request_id].append(e.token_id)
        return out

    think = ThinkingSpec((ids["<think>"],), (ids["</think>"],), open=True, budget=3)
    schema = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    requests = [
        Request("budget", (5, 6, 7, 8), SamplingParams(max_tokens=8, ignore_eos=True, thinking=think)),
        Request("json", (9, 10, 11), SamplingParams(temperature=0.8, seed=3, max_tokens=120, constraint=schema,
                                                     thinking=ThinkingSpec(think.start_ids, think.end_ids, True, 2,
                                                                           constrain_answer=True))),
        Request("plain", (12, 13), SamplingParams(max_tokens=8, ignore_eos=True)),
    ]
    together = run(requests, 3)
    for r in requests:
        assert together[r.request_id] == run([r], 1)[r.request_id], r.request_id
    assert together["budget"][3] == ids["</think>"] and ids["</think>"] not in together["budget"][:3]
    cut = together["json"].index(ids["</think>"])
    assert cut <= 2 and jsonschema.validate(json.loads(lm.tokenizer.decode(together["json"][cut + 1:])), SCHEMA) is None
