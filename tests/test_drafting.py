"""Prompt-lookup drafting in the scheduler, on the fake runner: exact draft traces, what is
accepted, the adaptive pause, the per-step cap, the draft gate, and the counters in timings and stats."""

from mlxcel_py.engine import Finished, Request, SamplingParams, TokenDelta
from mlxcel_py.engine.core.drafting import DraftConfig, DraftState, lookup

from fakes import make_engine as fake_engine


def make_engine(**kw):
    """The fake engine under a frozen clock: no step takes time, so the draft gate never judges
    and the traces below are the per-row drafting alone (the gate has its own tests)."""
    return fake_engine(clock=lambda: 0.0, **kw)


def run_all(engine, limit=500):
    events = []
    for _ in range(limit):
        if not engine.has_work():
            return events
        events += engine.step()
    raise AssertionError("did not finish")


def tokens(events, rid="A"):
    return [e.token_id for e in events if isinstance(e, TokenDelta) and e.request_id == rid]


def test_lookup_takes_the_most_recent_earlier_occurrence():
    seq = (1, 2, 3, 9, 1, 2, 4, 5, 1, 2)
    assert lookup(seq, 2, 8) == (4, 5, 1, 2)
    assert lookup(seq, 2, 1) == (4,)
    assert lookup(seq, 3, 8) == ()
    assert lookup((1, 2), 2, 8) == ()


def test_draft_min_and_the_room_left_bound_a_draft():
    state = DraftState()
    history = (1, 2, 3, 4, 1, 2)
    assert state.propose(DraftConfig(2, 16, 0), history, room=10) == (3, 4, 1, 2)
    assert state.propose(DraftConfig(2, 16, 5), history, room=10) == ()
    assert state.propose(DraftConfig(2, 16, 0), history, room=3) == (3, 4)  # room - 1: one is the target's
    assert state.propose(DraftConfig(2, 16, 0), history, room=1) == ()


def test_verify_accepts_the_agreeing_prefix_plus_the_targets_token():
    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=3))
    engine.add_request(Request("A", (3, 4, 5, 6, 7, 3, 4), SamplingParams(max_tokens=6)))
    runner.script[1] = [5, 6, 7, 9, 8, 8]
    events = run_all(engine)
    # After 5, the last 2-gram (4, 5) is followed by 6, 7, 3 earlier: 6 and 7 agree, 3 does not (9).
    assert [s.drafts for s in runner.steps if s.decode] == [((6, 7, 3),), (), ()]
    assert tokens(events) == [5, 6, 7, 9, 8, 8]
    done = [e for e in events if isinstance(e, Finished)][0]
    assert (done.timings.draft_n, done.timings.draft_n_accepted) == (3, 2)
    assert done.usage.completion_tokens == 6
    stats = engine.stats()
    assert (stats.num_draft_tokens, stats.num_draft_accepted, stats.num_decode_steps) == (3, 2, 3)
    assert stats.num_kv_tokens == 0


def test_a_finish_inside_an_accepted_run_drops_the_rest():
    engine, runner = make_engine(drafting=DraftConfig(ngram=1, draft_max=4))
    engine.add_request(Request("A", (1, 2, 3, 4, 5, 1), SamplingParams(max_tokens=3)))
    runner.script[1] = [2, 3, 4, 5, 6]
    events = run_all(engine)
    # room: 2 tokens left after the first, so the draft is one token (3) and the run [3, 4] ends it.
    assert [s.drafts for s in runner.steps if s.decode] == [((3,),)]
    assert tokens(events) == [2, 3, 4]


def test_grammar_and_logprob_rows_never_draft():
    engine, runner = make_engine(drafting=DraftConfig(ngram=1))
    engine.add_request(Request("A", (1, 1, 1), SamplingParams(max_tokens=4, logprobs=True)))
    run_all(engine)
    assert all(s.drafts == () for s in runner.steps)


def test_drafting_pauses_when_drafts_keep_being_rejected():
    # A runner that refuses drafts (as the distributed ones) rejects them all: two verifies
    # bring the EMA under the floor, then 8 plain steps, two verifies, 16 plain steps, ...
    engine, runner = make_engine(drafting=DraftConfig(ngram=1, draft_max=2))
    runner.verifies = False
    engine.add_request(Request("A", (5, 5, 5, 5), SamplingParams(max_tokens=40)))
    events = run_all(engine)
    trace = "".join("D" if s.drafts else "." for s in runner.steps if s.decode)
    assert trace == "." + "DD" + "." * 8 + "DD" + "." * 16 + "DD" + "." * 8  # the last run ends at the length
    assert tokens(events) == [1] * 40


def test_a_fully_accepted_draft_resets_the_pause():
    state = DraftState()
    state.observe(4, 0)
    state.observe(4, 0)
    assert (state.paused_for, state.next_pause) == (8, 16)
    state.paused_for = 0
    state.observe(4, 4)
    assert (state.next_pause, state.ema) == (8, 1.0)


def test_the_draft_length_doubles_on_success_and_shrinks_to_the_accepted_run():
    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=16))
    text = tuple(range(3, 40))
    engine.add_request(Request("A", text + text[:2], SamplingParams(max_tokens=34)))
    runner.script[1] = runner_tokens(text)  # the copy, then a divergence
    events = run_all(engine)
    lengths = [len(s.drafts[0]) if s.drafts else 0 for s in runner.steps if s.decode]
    # 4 accepted -> 8 accepted -> 16 (rejected after 3: the 99) -> no 2-gram match any more
    assert lengths[:3] == [4, 8, 16] and set(lengths[3:]) == {0}
    assert tokens(events) == runner_tokens(text)


def runner_tokens(text):
    return list(text[2:20]) + [99] + list(range(100, 115))  # the copy, then a divergence


def test_a_verify_steps_draft_tokens_count_as_rows_for_the_chunk_and_the_cost_model():
    from mlxcel_py.engine.core.engine import tick_shape
    from mlxcel_py.engine.core.step import Step

    assert tick_shape([Step(decode=(1, 2), drafts=((5, 6), ()), decode_context=30)]).rows == 6  # 2 rows x 3
    assert tick_shape([Step(decode=(1, 2, 3), draft_lengths=(0, 4, 1), decode_context=30)]).rows == 15

    class Recording:
        alone, contended = 2048, 512

        def __init__(self):
            self.states = []

        def chunk_for(self, state):
            self.states.append(state.num_decoding)
            return 512

        def observe(self, sample):
            pass

        def stats(self):
            return None

    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=3))
    engine.scheduler.policy = policy = Recording()
    engine.add_request(Request("A", (3, 4, 5, 6, 7, 3, 4), SamplingParams(max_tokens=6)))
    runner.script[1] = [5, 6, 7, 9, 8, 8]
    engine.step()  # A's prefill (nothing decoding)
    engine.add_request(Request("B", tuple(range(100, 1100)), SamplingParams(max_tokens=1)))
    engine.step()  # A verifies a draft of 3, then B's first piece is planned
    assert policy.states == [0, 1 + 3]


def test_a_steps_padded_draft_positions_are_held_to_draft_max():
    # Four rows copying their prompt: alone a row would verify a draft of 4 (the first length);
    # together every row is padded to the widest, so each is cut to draft_max 8 // 4 = 2 tokens.
    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=8), num_slots=4)
    text = tuple(range(10, 90))
    for seq_id, rid in enumerate("ABCD", start=1):
        engine.add_request(Request(rid, text + text[:2], SamplingParams(max_tokens=60)))
        runner.script[seq_id] = list(text[2:62])
    events = run_all(engine)
    drafting = [s for s in runner.steps if s.decode and s.drafts]
    assert all(max(len(d) for d in s.drafts) <= max(1, 8 // len(s.decode)) for s in drafting)
    first_four = next(s for s in drafting if len(s.decode) == 4)
    assert [len(d) for d in first_four.drafts] == [2, 2, 2, 2]
    assert all(tokens(events, rid) == list(text[2:62]) for rid in "ABCD")


def test_the_gate_stops_a_batch_size_whose_verify_steps_lose():
    from mlxcel_py.engine.core.drafting import GATE_PROBE, GATE_SAMPLES, DraftGate

    gate = DraftGate()
    step = 0
    for _ in range(GATE_SAMPLES):  # verify steps: 4 rows, 6 tokens in 1 s
        assert gate.allows(4, step)
        gate.observe(4, step, 6, 1.0, drafted=True)
        step += 1
    assert not gate.allows(4, step)  # no plain rate yet: the next steps sample it
    for _ in range(GATE_SAMPLES):  # plain steps: 4 tokens in 0.4 s (10 tok/s beats 6)
        gate.observe(4, step, 4, 0.4, drafted=False)
        step += 1
    assert gate.allows(4, step)
    gate.observe(4, step, 6, 1.0, drafted=True)  # judged: verify loses, off for GATE_PROBE steps
    assert not gate.allows(4, step + 1) and not gate.allows(4, step + GATE_PROBE - 1)
    assert gate.allows(4, step + GATE_PROBE)
    assert gate.allows(1, step)  # another batch size has its own rates


def test_the_gate_keeps_drafting_where_verify_steps_win():
    from mlxcel_py.engine.core.drafting import GATE_SAMPLES, DraftGate

    gate = DraftGate()
    for step in range(GATE_SAMPLES):
        gate.observe(1, step, 4, 0.2, drafted=True)  # 20 tok/s
    for step in range(GATE_SAMPLES, 2 * GATE_SAMPLES):
        gate.observe(1, step, 1, 0.1, drafted=False)  # 10 tok/s
    assert all(gate.allows(1, step) for step in range(2 * GATE_SAMPLES, 2 * GATE_SAMPLES + 30))


def test_the_engine_times_decode_steps_and_the_gate_turns_drafting_off():
    # A runner whose verify steps cost 10 s and plain steps 1 s on a clock it advances itself:
    # a row copying its prompt drafts at first, then the gate sees the loss and decodes plainly.
    now = [0.0]
    engine, runner = fake_engine(drafting=DraftConfig(ngram=2, draft_max=4), clock=lambda: now[0])
    execute = runner.execute

    def timed(step):
        now[0] += 10.0 if step.drafts else 1.0
        return execute(step)

    runner.execute = timed
    text = tuple(range(10, 200))
    engine.add_request(Request("A", text + text[:2], SamplingParams(max_tokens=120)))
    runner.script[1] = list(text[2:122])
    events = run_all(engine)
    trace = "".join("D" if s.drafts else "." for s in runner.steps if s.decode)
    assert trace.startswith("DDD...D") and "D" not in trace[7:7 + 60], trace
    assert tokens(events) == list(text[2:122])


def test_a_closed_gate_still_lets_a_seeded_sampled_row_draft():
    # Its output must not depend on the machine's timing: speculative sampling draws its RNG
    # otherwise than plain decoding, so only its own (deterministic) drafting state decides.
    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=4))
    engine.scheduler.gate.allows = lambda rows, step: False
    text = tuple(range(10, 40))
    engine.add_request(Request("S", text + text[:2], SamplingParams(max_tokens=8, temperature=0.7, seed=3)))
    engine.add_request(Request("G", text + text[:2], SamplingParams(max_tokens=8)))
    run_all(engine)
    rows = [dict(zip(s.decode, s.drafts)) for s in runner.steps if s.decode and s.drafts]
    assert rows and all(drafts.get(1) for drafts in rows) and not any(drafts.get(2) for drafts in rows)
