"""The scheduler on a fake runner: exact prefill traces under the load-aware chunk policy."""

import pytest

from mlxcel_py.engine import Finished, PromptProgress, PromptTooLongError, TokenDelta
from mlxcel_py.engine.core.scheduler import check_fits

from fakes import make_engine, request


def run_until(engine, predicate, limit=1000):
    events = []
    for _ in range(limit):
        events += engine.step()
        if predicate(events):
            return events
    raise AssertionError("condition not reached")


def finished(events, rid):
    return [e for e in events if isinstance(e, Finished) and e.request_id == rid]


def start_decoding(engine, rid="A", max_tokens=1000):
    engine.add_request(request(rid, 10, max_tokens=max_tokens))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) for e in ev))


def test_contended_prompt_prefills_in_512_pieces():
    engine, runner = make_engine()
    start_decoding(engine)
    engine.add_request(request("B", 1537))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) and e.request_id == "B" for e in ev))
    assert runner.prefill_lengths(2) == [512, 512, 512, 1]


def test_lone_prompt_prefills_in_2048_pieces():
    engine, runner = make_engine()
    engine.add_request(request("B", 3000))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) for e in ev))
    assert runner.prefill_lengths(1) == [2048, 952]


def test_a_whole_prompt_is_one_piece_beside_a_decoder():
    """An encoder's prompt (Request.whole_prompt) is never split, whatever the chunk; another is."""
    import dataclasses

    engine, runner = make_engine()
    start_decoding(engine)
    engine.add_request(dataclasses.replace(request("B", 1537), whole_prompt=True))
    engine.add_request(request("C", 1537))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) and e.request_id == "C" for e in ev))
    assert runner.prefill_lengths(2) == [1537]
    assert runner.prefill_lengths(3) == [512, 512, 512, 1]


def test_chunk_follows_state_when_the_decoder_finishes_mid_prompt():
    engine, runner = make_engine()
    # A decodes its first token at admission, then one more per tick: 2 ticks after B arrives it is done.
    start_decoding(engine, max_tokens=3)
    engine.add_request(request("B", 5000, max_tokens=2))
    events = run_until(engine, lambda ev: finished(ev, "B"))
    assert runner.prefill_lengths(2) == [512, 2048, 2048, 392]
    assert finished(events, "A")[0].finish_reason == "length"
    done = finished(events, "B")[0]
    assert done.finish_reason == "length" and done.usage.completion_tokens == 2
    progress = [e for e in events if isinstance(e, PromptProgress) and e.request_id == "B"]
    assert [(p.processed, p.chunk) for p in progress] == [(512, 512), (2560, 2048), (4608, 2048), (5000, 2048)]


def test_decode_runs_before_the_prefill_piece_in_each_tick():
    engine, runner = make_engine()
    start_decoding(engine)
    runner.calls.clear()
    engine.add_request(request("B", 1100))
    engine.step()
    engine.step()
    kinds = [c[0] for c in runner.calls]
    assert kinds == ["decode", "prefill", "decode", "prefill"]


@pytest.mark.parametrize("decoding", [False, True])
def test_explicit_chunk_pins_both_states(decoding):
    engine, runner = make_engine(chunk=1000)
    if decoding:
        start_decoding(engine)
    engine.add_request(request("B", 2500))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) and e.request_id == "B" for e in ev))
    assert runner.prefill_lengths(2 if decoding else 1) == [1000, 1000, 500]


def test_chunk_zero_prefills_in_one_piece_even_when_contended():
    engine, runner = make_engine(chunk=0)
    start_decoding(engine)
    engine.add_request(request("B", 3000))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) and e.request_id == "B" for e in ev))
    assert runner.prefill_lengths(2) == [3000]


def test_one_prefill_at_a_time_and_slots_limit_the_batch():
    engine, runner = make_engine(num_slots=2)
    for rid in "ABC":
        engine.add_request(request(rid, 10, max_tokens=4))
    events = run_until(engine, lambda ev: len([e for e in ev if isinstance(e, Finished)]) == 3)
    # C waits for a slot: it is prefilled only after A or B finished.
    first_c = next(i for i, c in enumerate(runner.calls) if c[0] == "prefill" and c[1] == 3)
    first_retire = next(i for i, c in enumerate(runner.calls) if c[0] == "retire")
    assert first_c > first_retire
    assert [e.usage.completion_tokens for e in events if isinstance(e, Finished)] == [4, 4, 4]


def test_eos_stops_without_emitting_the_eos_token():
    engine, runner = make_engine()
    engine.add_request(request("A", 5))
    runner.script[1] = [3, 4, 0]
    events = run_until(engine, lambda ev: finished(ev, "A"))
    deltas = [e.text for e in events if isinstance(e, TokenDelta)]
    assert deltas == ["d", "e"]
    done = finished(events, "A")[0]
    assert (done.finish_reason, done.usage.completion_tokens, done.stop_word, done.slot) == ("stop", 2, None, 0)


def test_ignore_eos_keeps_generating():
    engine, runner = make_engine()
    engine.add_request(request("A", 5, max_tokens=3, ignore_eos=True))
    runner.script[1] = [0, 0, 0]
    events = run_until(engine, lambda ev: finished(ev, "A"))
    assert finished(events, "A")[0].finish_reason == "length"
    assert len([e for e in events if isinstance(e, TokenDelta)]) == 3


def test_stop_string_is_held_back_and_cut():
    engine, runner = make_engine()
    engine.add_request(request("A", 5, stop=("zz", "de", "cd")))
    runner.script[1] = [1, 2, 3, 4]  # b c d e
    events = run_until(engine, lambda ev: finished(ev, "A"))
    text = "".join(e.text for e in events if isinstance(e, TokenDelta)) + finished(events, "A")[0].text
    assert text == "b"
    done = finished(events, "A")[0]
    assert (done.finish_reason, done.stop_word) == ("stop", "cd")  # the earliest match, whatever its rank


def test_max_tokens_is_capped_by_the_slot_context():
    engine, runner = make_engine(slot_context=20)
    engine.add_request(request("A", 15, max_tokens=100))
    events = run_until(engine, lambda ev: finished(ev, "A"))
    done = finished(events, "A")[0]
    assert (done.finish_reason, done.usage.completion_tokens) == ("length", 5)


def test_prompt_longer_than_a_slot_is_rejected():
    with pytest.raises(PromptTooLongError, match="100 tokens, but a slot's context holds 100") as info:
        check_fits(request("A", 100), 100)
    assert (info.value.n_prompt_tokens, info.value.n_ctx, info.value.code) == (100, 100, "context_length_exceeded")
    check_fits(request("A", 99), 100)


@pytest.mark.parametrize("phase", ["waiting", "prefill", "decode"])
def test_abort_frees_the_slot_in_every_phase(phase):
    engine, runner = make_engine(num_slots=1)
    engine.add_request(request("A", 3000, max_tokens=2))
    engine.add_request(request("B", 10, max_tokens=2))
    if phase == "prefill":
        engine.step()  # first 2048-token piece of A
    elif phase == "decode":
        run_until(engine, lambda ev: any(isinstance(e, TokenDelta) for e in ev))
    target = "B" if phase == "waiting" else "A"
    engine.abort(target)
    events = run_until(engine, lambda ev: finished(ev, "A") and finished(ev, "B"))
    assert finished(events, target)[0].finish_reason == "abort"
    other = "A" if target == "B" else "B"
    assert finished(events, other)[0].finish_reason == "length"
    assert not engine.has_work() and runner.rows == set()


def test_stats_report_slots_and_pieces():
    engine, runner = make_engine(num_slots=2)
    start_decoding(engine)
    engine.add_request(request("B", 1000))
    engine.step()
    stats = engine.stats()
    assert [s.state for s in stats.slots] == ["decode", "prefill"]
    assert stats.slots[1].processed == 512 and stats.slots[1].prompt_tokens == 1000
    assert dict(stats.prefill_pieces_by_chunk) == {512: 1, 2048: 1}


def chat_request(rid, n, boundary, **kw):
    from dataclasses import replace

    return replace(request(rid, n, **kw), history_boundary=boundary)


def test_short_history_segment_is_one_piece_and_snapshotted():
    engine, runner = make_engine(cache=True)
    engine.add_request(chat_request("A", 310, 300, max_tokens=1))
    run_until(engine, lambda ev: finished(ev, "A"))
    assert runner.prefill_lengths(1) == [300, 10]
    # the boundary snapshot was replaced by the longer prompt + reply snapshot at the finish
    assert engine.scheduler.prompt_cache.lookup(tuple(range(1, 400))).length == 310


def test_long_chat_prompt_is_still_chunked_next_to_a_decoding_stream():
    engine, runner = make_engine()
    start_decoding(engine)
    engine.add_request(chat_request("B", 1510, 1500))
    run_until(engine, lambda ev: any(isinstance(e, TokenDelta) and e.request_id == "B" for e in ev))
    assert runner.prefill_lengths(2) == [512, 512, 486]


def test_next_turn_adopts_the_cached_prefix_and_prefills_only_the_new_message():
    engine, runner = make_engine(cache=True)
    engine.add_request(chat_request("t1", 1000, 995, max_tokens=1))
    run_until(engine, lambda ev: finished(ev, "t1"))
    engine.add_request(chat_request("t2", 1200, 1190, max_tokens=1))  # shares the first 1000 tokens
    events = run_until(engine, lambda ev: finished(ev, "t2"))
    assert runner.prefill_lengths(2) == [190, 10]
    assert finished(events, "t2")[0].usage.cached_tokens == 1000


def test_the_prompt_cache_matches_cache_keys_not_ids():
    """A prompt with images is indexed by its key (each image's tokens standing for that image): the same
    ids under another key adopt nothing past the first difference; the same key adopts the whole turn."""
    from dataclasses import replace

    engine, runner = make_engine(cache=True)
    ids = tuple(range(1, 301))
    key = ids[:100] + (-7,) * 50 + ids[150:]

    def ask(rid, cache_key):
        engine.add_request(replace(request(rid, 300, max_tokens=1), cache_key=cache_key))
        return finished(run_until(engine, lambda ev: finished(ev, rid)), rid)[0].usage.cached_tokens

    assert ask("a", key) == 0
    assert ask("b", ids[:100] + (-9,) * 50 + ids[150:]) == 100  # another image: up to it
    assert ask("c", key) == 299  # the same image: all but the token left to forward
    assert ask("d", None) == 100  # plain ids share only the text before the image
