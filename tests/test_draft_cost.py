"""The cost-aware draft length (engine/core/drafting.py `DraftGate.length_cap`): a verify's cost by
its padded width, measured against a plain step, picks the draft length with the most expected
tokens per second; traces on the fake runner under a clock it advances itself."""

from mlxcel_py.engine import Request, SamplingParams
from mlxcel_py.engine.core.drafting import FIRST_LIMIT, GATE_SAMPLES, LONGEST, DraftConfig, DraftGate, DraftState

from fakes import make_engine
from test_drafting import run_all, tokens


def test_the_per_token_acceptance_follows_each_verify():
    state = DraftState()
    state.observe(4, 4)
    assert state.alpha == 1.0
    state.observe(4, 1)  # one accepted, then a rejection: 1 / 2 per token
    assert state.alpha == 0.75
    state.observe(2, 0)
    assert state.alpha == 0.375


def _measured(verify_seconds: dict[int, float], plain_seconds: float = 1.0) -> DraftGate:
    gate = DraftGate()
    for step in range(GATE_SAMPLES):
        gate.observe(1, step, 1, plain_seconds, drafted=False)
    for width, seconds in verify_seconds.items():
        gate.observe(1, 10, width + 1, 99.0, drafted=True, width=width)  # a first call: not trusted
        gate.observe(1, 11, width + 1, seconds, drafted=True, width=width)
    return gate


def test_the_cap_maximizes_expected_tokens_over_the_measured_cost():
    assert DraftGate().length_cap(1, 0.9) is None  # nothing timed: the row's own length rules
    held = DraftGate()
    held.observe(1, 0, 5, 9.0, drafted=True, width=4)
    assert held.length_cap(1, 0.9) == FIRST_LIMIT  # timed, but no trusted verify and plain cost yet
    # verify / plain: 2x at 4 tokens, 4x at 8, interpolated from a plain step's 1x at 0
    gate = _measured({4: 2.0, 8: 4.0})
    # a = 0.9: expected tokens / cost for k = 3, 4, 5: 3.44 / 1.75, 4.10 / 2.0, 4.69 / 2.5
    assert gate.length_cap(1, 0.9) == 4
    assert gate.length_cap(1, 0.5) == 1  # 1.5 / 1.25 beats 1.75 / 1.5
    assert gate.length_cap(2, 0.9) is None  # another batch size has its own costs


def test_where_a_verify_costs_what_a_step_does_the_cap_is_the_longest():
    gate = _measured({4: 1.0, 16: 1.02})
    assert gate.length_cap(1, 1.0) == LONGEST  # --draft-max bounds it in the plan


def test_the_engine_drafts_the_length_its_cost_curve_pays_for():
    # Verify steps cost 1.1 s up to 3 draft tokens, 1 s more per token beyond (a kernel's pass
    # of 4 rows); plain steps 1 s. A row copying its prompt drafts 4 (the first one untrusted,
    # until verify and plain costs are measured), the gate samples 3 plain steps, then the curve
    # extrapolated from width 4 tries longer drafts and, once they are measured, holds it to 4.
    now = [0.0]
    engine, runner = make_engine(drafting=DraftConfig(ngram=2, draft_max=16), clock=lambda: now[0])
    execute = runner.execute

    def timed(step):
        width = max((len(d) for d in step.drafts), default=0)
        now[0] += 1.0 if not width else 1.1 + max(0, width - 3)
        return execute(step)

    runner.execute = timed
    text = tuple(range(10, 200))
    engine.add_request(Request("A", text + text[:2], SamplingParams(max_tokens=120)))
    runner.script[1] = list(text[2:122])
    events = run_all(engine)
    lengths = [max((len(d) for d in s.drafts), default=0) for s in runner.steps if s.decode]
    # 8 is tried twice (its first verify untrusted), costs 6.1 s against the 3.2 s extrapolated: back to 4
    assert lengths[:8] == [4, 4, 4, 0, 0, 0, 8, 8] and set(lengths[8:-1]) == {4}, lengths
    assert tokens(events) == list(text[2:122])
