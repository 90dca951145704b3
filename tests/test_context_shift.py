"""Context shift (--context-shift) in the scheduler, on the fake runner: exact traces of when a
row shifts, what it keeps and discards, and what the records and stats say."""

import dataclasses

from mlxcel_py.engine import Finished, Request, SamplingParams, TokenDelta
from mlxcel_py.engine.core.context_shift import shift_plan
from mlxcel_py.engine.core.sequence import Sequence

from fakes import make_engine, request


def run_all(engine, limit=1000):
    events = []
    for _ in range(limit):
        if not engine.has_work():
            return events
        events += engine.step()
    raise AssertionError("the engine did not go idle")


def shifted(rid, n_prompt, max_tokens, start=1, **kw):
    base = request(rid, n_prompt, max_tokens=max_tokens, start=start)
    return dataclasses.replace(base, **kw)


def test_a_full_slot_shifts_half_of_the_tokens_and_keeps_generating():
    engine, runner = make_engine(slot_context=16, context_shift=True)
    engine.add_request(shifted("A", 10, 30))
    runner.script[1] = list(range(100, 130))
    events = run_all(engine)
    done = [e for e in events if isinstance(e, Finished)][0]
    assert done.finish_reason == "length" and done.usage.completion_tokens == 30
    assert [e.token_id for e in events if isinstance(e, TokenDelta)] == list(range(100, 130))
    # KV 15 of 16 -> keep 0, discard 15 // 2 = 7 -> KV 8; it refills in 7 decodes, and so on.
    shifts = [c for c in runner.calls if c[0] == "shift"]
    assert shifts == [("shift", 1, 0, 7, 8)] * 4
    at = [i for i, c in enumerate(runner.calls) if c[0] == "shift"]
    assert [sum(1 for c in runner.calls[:i] if c[0] == "decode") for i in at] == [5, 12, 19, 26]  # of 29
    assert done.timings.context_shifts == 4 and done.timings.discarded_tokens == 28
    stats = engine.stats()
    assert (stats.num_context_shifts, stats.num_discarded_tokens, stats.num_kv_tokens) == (4, 28, 0)


def test_the_shift_record_carries_the_kv_tokens_after_it():
    engine, runner = make_engine(slot_context=16, context_shift=True)
    engine.add_request(shifted("A", 10, 9, n_keep=3))
    runner.script[1] = list(range(100, 110))
    run_all(engine)
    (step,) = [s for s in runner.steps if s.shift]
    # Prompt 1..10 and 100..105 in the KV (15): keep 3, discard (15 - 3) // 2 = 6.
    assert step.shift[0].n_keep == 3 and step.shift[0].n_discard == 6
    assert step.shift[0].tokens == (1, 2, 3, 10, 100, 101, 102, 103, 104)
    assert step.decode == (1,)  # the same record decodes the row after shifting it


def test_without_context_shift_the_slot_ends_the_reply():
    engine, runner = make_engine(slot_context=16)
    engine.add_request(shifted("A", 10, 30))
    events = run_all(engine)
    done = [e for e in events if isinstance(e, Finished)][0]
    assert done.finish_reason == "length" and done.usage.completion_tokens == 6
    assert not any(c[0] == "shift" for c in runner.calls)


def _seq(n_prompt, n_out, slot_context, **kw):
    seq = Sequence(request=shifted("A", n_prompt, 100, **kw), seq_id=1, arrival=0.0)
    seq.output_ids = list(range(n_out))
    return shift_plan(seq, slot_context)


def test_the_plan_follows_llama_server():
    assert _seq(10, 5, 16) is None  # KV 14: the next token still leaves one position
    assert _seq(10, 6, 16) == (0, 7)
    assert _seq(10, 6, 16, n_keep=-1) == (10, 2)  # keep the whole prompt
    assert _seq(14, 2, 16, n_keep=-1) == (12, 1)  # n_keep capped at n_ctx - 4; n_discard at n_left - 1
    assert _seq(10, 6, 16, n_keep=2, n_discard=4) == (2, 4)
    assert _seq(10, 6, 16, n_keep=2, n_discard=99) == (2, 12)


def test_two_rows_shift_on_their_own_schedule():
    engine, runner = make_engine(slot_context=16, context_shift=True)
    engine.add_request(shifted("A", 10, 12))
    engine.add_request(shifted("B", 4, 12))
    events = run_all(engine)
    assert [e.usage.completion_tokens for e in events if isinstance(e, Finished)] == [12, 12]
    assert [c[1] for c in runner.calls if c[0] == "shift"] == [1]  # B's 4 + 12 never fills 16


def test_a_shifted_sequence_leaves_no_prompt_cache_snapshot():
    engine, runner = make_engine(slot_context=16, context_shift=True, cache=True)
    engine.add_request(shifted("A", 10, 12))
    engine.add_request(shifted("B", 5, 3, start=200))
    run_all(engine)
    retired = {r.seq_id: r for s in runner.steps for r in s.retire}
    assert retired[1].snapshot_id is None and retired[2].snapshot_id is not None


def test_a_drafting_row_never_drafts_past_its_slot():
    from mlxcel_py.engine.core.drafting import DraftConfig

    engine, runner = make_engine(slot_context=16, context_shift=True, drafting=DraftConfig(ngram=1, draft_max=8))
    engine.add_request(Request("A", (5, 6) * 5, SamplingParams(max_tokens=20)))
    runner.script[1] = [5, 6] * 10
    events = run_all(engine)
    assert [e.token_id for e in events if isinstance(e, TokenDelta)] == [5, 6] * 10
    for step in runner.steps:
        assert all(len(d) + 1 <= 15 for d in step.drafts)
    assert any(s.shift for s in runner.steps)


def test_a_request_may_opt_out_of_the_shift():
    engine, runner = make_engine(slot_context=16, context_shift=True)
    engine.add_request(shifted("A", 10, 30, context_shift=False))
    events = run_all(engine)
    done = [e for e in events if isinstance(e, Finished)][0]
    assert done.finish_reason == "length" and done.usage.completion_tokens == 6
    assert not any(c[0] == "shift" for c in runner.calls)
