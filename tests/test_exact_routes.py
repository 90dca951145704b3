"""Exact on the path users run: the default model's real GGUF on the native CPU path (the fused decode
step, whose rows the prompts run through too: engine/runner/row_prefill.py). Greedy output is the same
token for token whatever route a position takes: a prompt-cache miss or hit, one request alone or
four together, prompt pieces of any size, a piece fused with decoding rows or run apart, speculative
decoding (prompt lookup, a draft model) or plain, and an agent's next turn over the cached history."""

import numpy as np
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.core.events import Finished, TokenDelta

from config_helpers import flags_for

pytestmark = pytest.mark.slow  # the real default model (make test-fast skips it)

PROMPTS = ["Name three rivers in Europe and describe each one briefly.", "What is the capital of France?",
           "Write a haiku about the sea.", "Explain what a CPU cache is in two sentences.",
           "List five fruits and their colors."]
TOKENS = 24


@pytest.fixture(scope="module")
def lm():
    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused CPU step (and its exactness across routes) needs AVX2")
    model = load_model(None)
    assert model.cpu_decode.runs_rows()  # the default serve configuration's path
    return model


def chat(lm, text: str, history=()) -> tuple[int, ...]:
    messages = [*history, {"role": "user", "content": text}]
    return tuple(lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def request(rid: str, ids, n: int = TOKENS) -> Request:
    return Request(rid, tuple(ids), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))


def engine(lm, draft=None, **kw):
    built = build_engine(resolve("serve", flags_for("serve", **kw), env={}).engine, lm, draft=draft)
    built.scheduler.gate = None  # the draft gate would stop drafting by the machine's timing
    return built


def run(built, requests, limit: int = 4000) -> dict:
    """Requests to completion, tick by tick: rid -> (token ids, cached prompt tokens)."""
    for r in requests:
        built.add_request(r)
    tokens, cached = {r.request_id: [] for r in requests}, {}
    for _ in range(limit):
        if not built.has_work():
            break
        for e in built.step():
            if isinstance(e, TokenDelta):
                tokens[e.request_id].append(e.token_id)
            elif isinstance(e, Finished):
                cached[e.request_id] = e.usage.cached_tokens
    assert set(cached) == set(tokens), "a request did not finish"
    return {rid: (tokens[rid], cached[rid]) for rid in tokens}


@pytest.fixture(scope="module")
def alone(lm):
    """Each prompt alone on a fresh engine, one after another (misses: the prompts share no prefix
    beyond the template's first tokens)."""
    built = engine(lm, parallel=4)
    return {i: run(built, [request(f"m{i}", chat(lm, p))])[f"m{i}"][0] for i, p in enumerate(PROMPTS)}


def test_a_cache_hit_equals_the_miss_alone_and_four_together(lm, alone):
    built = engine(lm, parallel=4)
    for i, p in enumerate(PROMPTS):
        first = run(built, [request(f"a{i}", chat(lm, p))])[f"a{i}"]
        again = run(built, [request(f"b{i}", chat(lm, p))])[f"b{i}"]
        assert again[1] > 0  # a hit: all but the prompt's last tokens came from the cache
        assert first[0] == again[0] == alone[i], PROMPTS[i]
    # four at once, then again (each a hit, decoding beside the others)
    for tag in ("c", "d"):
        together = run(built, [request(f"{tag}{i}", chat(lm, p)) for i, p in enumerate(PROMPTS[:4])])
        assert {i: together[f"{tag}{i}"][0] for i in range(4)} == {i: alone[i] for i in range(4)}


def test_any_prefill_chunk_and_fused_ticks_give_the_same_tokens(lm, alone):
    # 16-token pieces: prompts cut mid-template; while others decode each piece fuses with their rows
    small = engine(lm, parallel=4, prefill_chunk_size=16)
    assert small.runner.one_forward and small.runner.fuses_up_to >= 16
    together = run(small, [request(f"f{i}", chat(lm, p)) for i, p in enumerate(PROMPTS)])
    assert {i: together[f"f{i}"][0] for i in range(len(PROMPTS))} == alone


@pytest.mark.parametrize("how", ["lookup", "draft"])
def test_speculative_decoding_gives_plain_decodings_tokens(lm, alone, how):
    kw = {"lookup_ngram": 2} if how == "lookup" else {"draft_max": 4}
    built = engine(lm, draft=lm if how == "draft" else None, parallel=4, **kw)
    out = run(built, [request(f"s{i}", chat(lm, p)) for i, p in enumerate(PROMPTS)])
    assert {i: out[f"s{i}"][0] for i in range(len(PROMPTS))} == alone


def test_an_agents_next_turn_over_the_cached_history_equals_a_cold_one(lm):
    """The second turn resends the first turn and its answer: cached (the answer's K/V came from decode
    steps) or recomputed from scratch (a prefill), the reply is the same."""
    first = chat(lm, PROMPTS[3])
    warm = engine(lm, parallel=2)
    answer = run(warm, [request("t1", first, 40)])["t1"][0]
    history = [{"role": "user", "content": PROMPTS[3]},
               {"role": "assistant", "content": lm.tokenizer.decode(answer)}]
    second = chat(lm, "Now say it in one sentence.", history)
    hit = run(warm, [request("t2", second)])["t2"]
    cold = run(engine(lm, parallel=2), [request("t2", second)])["t2"]
    assert hit[1] > len(first) and cold[1] == 0  # the hit reused the first turn's prompt and part of its answer
    assert hit[0] == cold[0]


def test_a_context_shift_rebuilds_the_row_as_a_fresh_prefill_of_the_kept_tokens(lm):
    """--context-shift's "prefill" on the rows: the kept tokens rerun as rows of the step, so the row's
    K/V equal a new sequence's whose prompt is those tokens, bit for bit."""
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Shift, Step
    from mlxcel_py.engine.runner.model_runner import ModelRunner

    ids = chat(lm, PROMPTS[0])
    kept = ids[:4] + ids[22:]

    def row_after(tokens, shift=None):
        runner = ModelRunner(lm.model, decode=lm.cpu_decode)
        begin = BeginSequence(SamplingParams(max_tokens=4, temperature=0.0), ())
        runner.execute(Step(prefill=PrefillPiece(1, 0, tokens, len(tokens), True, None, begin)))
        if shift is not None:
            runner.execute(Step(shift=(shift,)))
        return runner._batch.row_kv(0)

    shifted, fresh = row_after(ids, Shift(1, 4, 18, kept)), row_after(kept)
    assert len(shifted) == len(fresh) and shifted[0][0].shape[1] == len(kept)
    for (k, v), (fk, fv) in zip(shifted, fresh):
        assert np.array_equal(k, fk) and np.array_equal(v, fv)


def test_the_server_answers_each_chat_the_same_three_times_alone_and_four_at_once(lm):
    """The acceptance as a user sees it: the default serve configuration over HTTP, temperature 0; a
    miss (cache_prompt false), hits, and four requests at once all give byte-identical texts."""
    from concurrent.futures import ThreadPoolExecutor

    from server_helpers import start_server, stop_server

    running = start_server(model=lm, parallel=4)
    try:
        with running.client() as client:
            def ask(text, cache=True):
                body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": TOKENS}
                if not cache:
                    body["cache_prompt"] = False
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                data = reply.json()
                return data["choices"][0]["message"]["content"], data["usage"]["prompt_tokens_details"]["cached_tokens"]

            cold = {p: ask(p, cache=False) for p in PROMPTS}
            assert all(c == 0 for _, c in cold.values())
            for _ in range(2):
                again = {p: ask(p) for p in PROMPTS}
                assert {p: t for p, (t, _) in again.items()} == {p: t for p, (t, _) in cold.items()}
            assert all(c > 0 for _, c in again.values())  # the repeats were hits
            with ThreadPoolExecutor(4) as pool:
                for _ in range(2):
                    together = list(pool.map(ask, PROMPTS[:4]))
                    assert [t for t, _ in together] == [cold[p][0] for p in PROMPTS[:4]]
    finally:
        stop_server(running)
