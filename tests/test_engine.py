"""The real engine on a tiny random-weight model: batched == single, cache hit == miss, resumes, aborts."""

import random

import mlx.core as mx
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import EngineWorker, Finished, PromptProgress, Request, SamplingParams, TokenDelta, build_engine
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step

from config_helpers import flags_for
from tiny import greedy_tokens, tiny_model

TIMEOUT = 60


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def run_all(worker, requests):
    """Submit all at once; collect (tokens, final event) per request id."""
    handles = [worker.submit(r) for r in requests]
    out = {}
    for h in handles:
        tokens, progress = [], []
        while True:
            ev = h.get(timeout=TIMEOUT)
            if isinstance(ev, TokenDelta):
                tokens.append(ev.token_id)
            elif isinstance(ev, PromptProgress):
                progress.append(ev)
            elif isinstance(ev, Finished):
                out[h.request_id] = (tokens, ev, progress)
                break
    return out


def make_worker(lm, **kw):
    cfg = resolve("serve", flags_for("serve", **kw), env={})
    return EngineWorker(build_engine(cfg.engine, lm)).start()


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def test_batched_decode_equals_each_sequence_alone(lm):
    prompts = [prompt(n, seed) for seed, n in enumerate((7, 40, 90, 23))]
    requests = [Request(f"r{i}", p, greedy(24)) for i, p in enumerate(prompts)]
    worker = make_worker(lm, parallel=4, prompt_cache=False)
    try:
        together = run_all(worker, requests)
    finally:
        worker.stop()
    for i, p in enumerate(prompts):
        assert together[f"r{i}"][0] == greedy_tokens(lm.model, p, 24), f"request {i}"


def test_one_slot_engine_matches_the_reference_greedy_loop(lm):
    p = prompt(50, 11)
    worker = make_worker(lm, parallel=1)
    try:
        tokens, done, _ = run_all(worker, [Request("g", p, greedy(32))])["g"]
    finally:
        worker.stop()
    assert tokens == greedy_tokens(lm.model, p, 32)
    assert (done.finish_reason, done.usage.completion_tokens) == ("length", 32)


def test_cache_hit_at_a_split_point_gives_the_logits_of_the_miss(lm):
    cfg = resolve("serve", flags_for("serve", parallel=1, prefill_chunk_size=64, cache_min_prefix=8), env={})
    p = prompt(200, 3)

    def final_logits(engine, request):
        """The logits the first token is sampled from (captured at the runner's sampler)."""
        seen = []
        sample = engine.runner._sample
        engine.runner._sample = lambda logits, ids: seen.append(logits) or sample(logits, ids)
        engine.add_request(request)
        while engine.has_work():
            engine.step()
        engine.runner._sample = sample
        return seen[0]

    cold_engine = build_engine(cfg.engine, lm)
    cold = final_logits(cold_engine, Request("cold", p, greedy(1), cache_prompt=False))
    engine = build_engine(cfg.engine, lm)
    final_logits(engine, Request("warm-up", p[:128], greedy(1)))  # snapshots exactly p[:128]
    traced = []
    execute = engine.runner.execute
    engine.runner.execute = lambda step: traced.append(step.prefill) or execute(step)
    hit = final_logits(engine, Request("hit", p, greedy(1)))
    assert [(pc.start, pc.end) for pc in traced if pc is not None] == [(128, 192), (192, 200)]
    assert engine.stats().num_cached_prompt_tokens == 128
    assert mx.array_equal(hit, cold).item()


def test_chat_turn_adopts_the_history_boundary_snapshot(lm):
    from mlxcel_py.models import encode_chat

    first = [{"role": "user", "content": "tell me about the sea " * 8}]
    turn1 = encode_chat(lm.tokenizer, first)
    worker = make_worker(lm, parallel=1, cache_min_prefix=8)
    try:
        _, done1, _ = run_all(worker, [Request("t1", turn1.ids, greedy(4), turn1.history_boundary)])["t1"]
        second = first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        turn2 = encode_chat(lm.tokenizer, second)
        _, done2, _ = run_all(worker, [Request("t2", turn2.ids, greedy(4), turn2.history_boundary)])["t2"]
    finally:
        worker.stop()
    assert done1.usage.cached_tokens == 0
    assert done2.usage.cached_tokens >= turn1.history_boundary


def test_prompt_whose_chunk_changes_mid_prefill_completes(lm):
    # Driven tick by tick (no thread) so "the stream finishes after the first piece" is exact.
    engine = build_engine(resolve("serve", flags_for("serve", parallel=2, prompt_cache=False), env={}).engine, lm)
    engine.add_request(Request("stream", prompt(10, 1), greedy(3)))
    events = engine.step()  # stream prefilled; its first token sampled: it decodes from now on
    engine.add_request(Request("long", prompt(3000, 2), greedy(5)))
    while engine.has_work():
        events += engine.step()
    pieces = [e.processed for e in events if isinstance(e, PromptProgress) and e.request_id == "long"]
    done = [e for e in events if isinstance(e, Finished) and e.request_id == "long"][0]
    assert pieces == [512, 2560, 3000]  # 512 while the stream decodes, then 2048 once it is done
    assert (done.finish_reason, done.usage.completion_tokens) == ("length", 5)


def test_aborted_request_frees_its_slot(lm):
    worker = make_worker(lm, parallel=1, prompt_cache=False)
    try:
        first = worker.submit(Request("first", prompt(20, 4), greedy(100000)))
        assert isinstance(first.get(timeout=TIMEOUT), PromptProgress)
        queued = worker.submit(Request("next", prompt(20, 5), greedy(3)))
        first.abort()
        events = list(first)
        assert events[-1].finish_reason == "abort"
        done = list(queued)[-1]
        assert (done.finish_reason, done.usage.completion_tokens) == ("length", 3)
        assert all(s.state == "idle" for s in worker.stats().slots) or worker.stats().num_busy_slots == 0
    finally:
        worker.stop()


def test_prefill_piece_only_computes_logits_when_terminal(lm):
    engine = build_engine(resolve("serve", flags_for("serve", prefill_chunk_size=16), env={}).engine, lm)
    p = prompt(40, 9)
    begin = BeginSequence(greedy(1), ())
    pieces = [PrefillPiece(1, s, p[s : s + 16], 16, s + 16 >= 40, None, begin if s == 0 else None) for s in (0, 16, 32)]
    outs = [engine.runner.execute(Step(prefill=piece)) for piece in pieces]
    assert [o.first_token for o in outs[:-1]] == [None, None]
    assert outs[-1].first_token == greedy_tokens(lm.model, p, 1)[0]
