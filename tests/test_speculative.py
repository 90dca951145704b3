"""Prompt-lookup speculative decoding on the tiny model: greedy output token-identical to plain
decoding (alone, batched, prompt-cache hit and miss), drafts accepted on a text to copy, and
sampled output reproducible under a fixed seed."""

import random

import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Finished, Request, SamplingParams, TokenDelta, build_engine

from config_helpers import flags_for
from tiny import TEXT, tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def prompt(n, seed):
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def copy_prompt(lm):
    """A text said twice and begun a third time: the continuation is in the prompt."""
    ids = lm.tokenizer.encode(TEXT[:300])
    return tuple(ids) * 2 + tuple(ids[:8])


def run(engine, requests):
    """Run requests to completion, tick by tick; (tokens, Finished) per request id."""
    for r in requests:
        engine.add_request(r)
    out = {r.request_id: [] for r in requests}
    done = {}
    for _ in range(5000):
        if not engine.has_work():
            break
        for e in engine.step():
            if isinstance(e, TokenDelta):
                out[e.request_id].append(e.token_id)
            elif isinstance(e, Finished):
                done[e.request_id] = e
    return {rid: (out[rid], done[rid]) for rid in out}


def engine_for(lm, ngram, parallel=4, **kw):
    return build_engine(resolve("serve", flags_for("serve", parallel=parallel, lookup_ngram=ngram, **kw),
                                env={}).engine, lm)


def greedy(rid, ids, n=40, **kw):
    return Request(rid, ids, SamplingParams(max_tokens=n, ignore_eos=True, **kw))


@pytest.mark.parametrize("parallel", [1, 4])
def test_greedy_output_is_token_identical_to_plain_decoding(lm, parallel):
    requests = [greedy("copy", copy_prompt(lm), 48), greedy("a", prompt(30, 1)), greedy("b", prompt(7, 2), 33)]
    plain = run(engine_for(lm, None, parallel), requests)
    spec = run(engine_for(lm, 3, parallel, draft_max=8), requests)
    for rid in plain:
        assert spec[rid][0] == plain[rid][0], rid
    drafted = sum(f.timings.draft_n for _, f in spec.values())
    accepted = sum(f.timings.draft_n_accepted for _, f in spec.values())
    assert drafted > 0 and accepted > 0
    assert spec["copy"][1].timings.draft_n_accepted > 0


def test_penalties_apply_at_every_verified_position(lm):
    requests = [greedy("p", copy_prompt(lm), 40, repetition_penalty=1.3, frequency_penalty=0.5)]
    assert run(engine_for(lm, 2, 1), requests)["p"][0] == run(engine_for(lm, None, 1), requests)["p"][0]


def test_a_prompt_cache_hit_decodes_like_the_miss(lm):
    first = greedy("first", copy_prompt(lm), 24)
    again = greedy("again", copy_prompt(lm) + (5, 6, 7), 40)
    engine = engine_for(lm, 3, 1, cache_min_prefix=8)
    miss = run(engine_for(lm, None, 1), [again])
    run(engine, [first])
    hit = run(engine, [again])
    assert hit["again"][1].usage.cached_tokens > 0
    assert hit["again"][0] == miss["again"][0]


def test_sampled_output_is_reproducible_with_a_seed(lm):
    requests = [greedy("s", copy_prompt(lm), 40, temperature=0.3, seed=7)]
    one = run(engine_for(lm, 2, 1), requests)["s"]
    two = run(engine_for(lm, 2, 1), requests)["s"]
    assert one[0] == two[0] and len(one[0]) == 40
    assert one[1].timings.draft_n > 0  # the verify path ran, under the request's own RNG stream


def test_speculative_sampling_follows_the_target_distribution():
    # Keep d with p(d), else draw from p without d: the token's law is p (4 tokens, 3000 draws).
    import mlx.core as mx
    import numpy as np

    from mlxcel_py.engine.runner.sampling import SequenceSampler

    target = np.array([0.1, 0.5, 0.15, 0.25])
    row = mx.array(np.log(target)[None].astype(np.float32))
    sampler = SequenceSampler(SamplingParams(temperature=1.0, top_p=1.0, seed=3))
    draws = 3000
    counts = np.zeros(4)
    kept = 0
    for _ in range(draws):
        token, accepted = sampler.choose(row, 1)
        counts[token] += 1
        kept += accepted
    assert np.abs(counts / draws - target).max() < 0.03  # about 3 standard errors
    assert kept == counts[1]  # the draft's token comes only from acceptance


def test_timings_and_metrics_count_drafts_over_http(lm):
    from prometheus_client.parser import text_string_to_metric_families

    from server_helpers import start_server, stop_server

    running = start_server(parallel=1, lookup_ngram=3, draft_max=8)
    try:
        with running.client() as http:
            body = {"prompt": list(copy_prompt(lm)), "n_predict": 48, "ignore_eos": True, "temperature": 0.0}
            timings = http.post("/completion", json=body).json()["timings"]
            assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
            chat = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).json()
            assert "draft_n" not in chat.get("timings", {})  # as llama-server: only when it drafted
            families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
        assert families["mlxcel_draft_tokens"].samples[0].value == timings["draft_n"]
        assert families["mlxcel_draft_accepted_tokens"].samples[0].value == timings["draft_n_accepted"]
    finally:
        stop_server(running)


def test_grammar_and_logprob_rows_keep_their_sampler_beside_a_drafting_row(lm):
    import json

    from mlxcel_py.engine.core.request import ConstraintSpec

    schema = {"type": "object", "properties": {"name": {"enum": ["ann", "bob"]},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    constrained = Request("j", prompt(12, 0), SamplingParams(
        max_tokens=200, temperature=1.0, seed=0, constraint=ConstraintSpec("json_schema", json.dumps(schema))))
    scored = greedy("l", prompt(20, 3), 30, logprobs=True, top_logprobs=2)
    copy = greedy("copy", copy_prompt(lm), 48)
    engine = engine_for(lm, 3, 4)
    engine.add_request(constrained)
    engine.add_request(scored)
    engine.add_request(copy)
    deltas = {"j": [], "l": [], "copy": []}
    done = {}
    for _ in range(5000):
        if not engine.has_work():
            break
        for e in engine.step():
            if isinstance(e, TokenDelta):
                deltas[e.request_id].append(e)
            elif isinstance(e, Finished):
                done[e.request_id] = e
    assert done["copy"].timings.draft_n_accepted > 0
    assert done["j"].finish_reason == "stop"
    json.loads(lm.tokenizer.decode([d.token_id for d in deltas["j"]]))
    assert len(deltas["l"]) == 30 and all(d.logprobs is not None for d in deltas["l"])
    plain = run(engine_for(lm, None, 4), [scored])["l"][0]
    assert [d.token_id for d in deltas["l"]] == plain
