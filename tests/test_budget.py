"""The ITL-budget chunk policy on a fake device whose tick time follows a known law.

Each simulated tick: chunk_for(state) -> the piece -> the law's time -> observe -> the cursor
advances (tests/budget_sim.py). 4 streams decode while a 2048- and a 6144-token prompt are
admitted one after the other."""

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy, ladder
from mlxcel_py.engine.chunking.policy import TickState
from mlxcel_py.engine.chunking.calibration import calibrate
from mlxcel_py.engine.chunking.cost_model import CostModel, TickSample, TickShape
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy

from budget_sim import CPU, GPU, Law, admit, best_fit

CASES = [(CPU, 300.0), (GPU, 12.0)]


def calibrated(law: Law, budget_ms: float, **kw) -> BudgetChunkPolicy:
    model = calibrate(law.measure, max_seconds=1e9, say=lambda _m: None).model()
    return BudgetChunkPolicy(budget_ms, model, **kw)


def next_size(policy, n):
    bigger = [s for s in policy.sizes if s > n]
    return int(bigger[0]) if bigger else None


@pytest.mark.parametrize("law,budget", CASES, ids=["cpu", "gpu"])
def test_calibrated_on_the_law_each_chunk_is_the_largest_size_that_fits(law, budget):
    policy = calibrated(law, budget)
    ticks = admit(policy, lambda _i: law)
    settled = ticks[5:]  # the first ticks hold back the start margin
    for t in settled:
        assert law.seconds(t.shape) <= budget / 1000
        bigger = next_size(policy, t.chunk)
        if bigger is not None and t.shape.tokens == t.chunk:  # a tail piece is the rest, not the chunk
            over = TickShape(bigger, t.shape.context, t.shape.rows, t.shape.row_context)
            assert law.seconds(over) > budget / 1000 / 1.01, t
    assert {t.prompt for t in ticks} == {0, 1} and policy.stats().num_over_budget == 0


def test_exact_chunks_where_the_law_makes_them_computable():
    policy = calibrated(CPU, 300.0, start_margin=0.0)
    # 4 rows at 32 tokens each, a fresh prompt: the largest ladder size n with
    # 0.03 + 0.05 + 0.06 + 128e-6 + 3.4e-3 n + 3.3e-7 n^2 <= 0.3 is 46.8 -> 40 (48 costs 0.3041 s).
    first = policy.chunk_for(TickState(4, 128, 0, 2048))
    assert first == 40 == best_fit(CPU, policy.sizes, TickState(4, 128, 0, 2048), 0.3)
    # Deep into a 6144-token prompt with 5 rows the piece is at the floor: 16 tokens, 0.276 s (24: 0.336 s).
    assert policy.chunk_for(TickState(5, 2400, 6000, 144)) == 16


def test_the_chunk_grows_as_the_budget_grows_and_shrinks_with_context():
    chunks = [calibrated(CPU, b, start_margin=0.0).chunk_for(TickState(4, 128, 0, 4096)) for b in (300, 1000, 3000)]
    # 3.3e-7 n^2 + 3.4e-3 n + 0.140128 <= B: n <= 46.6, 247.1, 782.2
    assert chunks == [40, 240, 768] == [best_fit(CPU, ladder(), TickState(4, 128, 0, 4096), b / 1000)
                                        for b in (300, 1000, 3000)]
    policy = calibrated(CPU, 3000.0, start_margin=0.0)
    # Attention adds 6.7e-7 n c: at 3 s, n <= 782.2, 576.3, 374.6
    assert [policy.chunk_for(TickState(4, 128, c, 8192)) for c in (0, 2048, 6144)] == [768, 576, 352]


@pytest.mark.parametrize("law,budget", CASES, ids=["cpu", "gpu"])
def test_converges_from_a_seed_calibrated_on_another_device(law, budget):
    policy = calibrated(law.scaled(0.5), budget)  # the seed thinks everything costs half
    ticks = admit(policy, lambda _i: law)
    first, settled = ticks[:3], ticks[15:]
    assert max(t.seconds for t in first) > budget / 1000  # the seed's chunks overshoot
    assert all(t.seconds <= budget / 1000 for t in settled)
    assert all(abs(t.predicted - t.seconds) <= 0.02 * t.seconds for t in settled)
    # Converged: the predicted tick lies within one ladder step of the budget.
    assert min(t.predicted for t in settled if t.shape.tokens == t.chunk > policy.floor) > 0.6 * budget / 1000


def test_adapts_when_costs_double_mid_run():
    policy = calibrated(CPU, 300.0)
    change = 40
    ticks = admit(policy, lambda i: CPU if i < change else CPU.scaled(2.0), prompts=(6144,), streams=2)
    before = [t.chunk for t in ticks[change - 5:change]]
    after = ticks[change + 12:]
    assert all(t.seconds <= 0.3 for t in ticks[5:change])
    assert max(t.seconds for t in ticks[change:change + 3]) > 0.3  # the change is felt, then learned
    assert all(t.seconds <= 0.3 for t in after if t.chunk > policy.floor)
    assert max(t.chunk for t in after) < min(before)


def test_with_noise_the_ticks_stay_near_the_budget():
    policy = calibrated(CPU, 300.0)
    ticks = admit(policy, lambda _i: CPU, noise=0.05, seed=1)[10:]
    seconds = sorted(t.seconds for t in ticks)
    p95 = seconds[int(0.95 * len(seconds))]
    assert p95 <= 0.3 * 1.05 and seconds[-1] <= 0.3 * 1.3
    assert 0.01 <= policy.margin() <= 0.3  # the noise shows up as held-back margin


def test_jittery_decode_only_ticks_between_admissions_leave_the_margin_alone():
    """Between admissions only decode runs; its short ticks jitter by a large share (+-60 % here).
    The margin is the error on ticks with a piece, so the next admission starts with the
    margin the last one ended with, not the cap, and the same chunk."""
    policy = calibrated(CPU, 300.0)
    admit(policy, lambda _i: CPU, prompts=(2048,))
    margin, chunk = policy.margin(), policy.chunk_for(TickState(4, 4 * 600, 0, 2048))
    assert margin < 0.05
    rng = __import__("random").Random(3)
    for i in range(200):
        shape = TickShape(0, 0, 4, 4 * (600 + i))
        policy.observe(TickSample(shape, CPU.seconds(shape) * rng.choice((0.4, 1.0, 1.6))))
    assert policy.model.recent_error > 0.2  # the model's own error (its Huber scale) sees the jitter
    assert policy.margin() == margin and policy.contended_error == margin
    assert policy.chunk_for(TickState(4, 4 * 600, 0, 2048)) >= chunk - 8


def test_the_next_admission_starts_from_what_the_last_one_learned():
    """The device's pieces cost more than calibration saw (a fixed cost 3x the seed's: the
    server's other threads), so the seed mispredicts. After one admission and 200 decode-only
    ticks, the second admission's first ticks fit the budget: the decode ticks did not wash
    out what the first admission taught about pieces."""
    device = replace(CPU, piece=3 * CPU.piece)
    policy = calibrated(CPU, 300.0)
    first = admit(policy, lambda _i: device, prompts=(2048,))
    assert first[0].seconds > 0.3  # the seed's first chunk overshoots
    for i in range(200):
        shape = TickShape(0, 0, 5, 5 * (600 + i))
        policy.observe(TickSample(shape, device.seconds(shape)))
    second = admit(policy, lambda _i: device, prompts=(2048,))
    assert all(t.seconds <= 0.3 for t in second[:5])
    assert second[0].chunk == best_fit(device, policy.sizes, second[0].state, 0.3 / (1 + policy.margin()))


def test_a_contended_chunk_at_most_doubles_the_recent_pieces():
    """The end of a long prompt teaches the fit about small pieces at a long context; the next
    prompt's first contended pieces grow from there by doubling, not in one jump to what an
    extrapolation of that fit allows (a 1,280-token piece stalled the streams 2.2 s here)."""
    law = replace(CPU, att=2e-6)  # attention dominates a long prompt's last pieces
    policy = calibrated(law, 1000.0)
    tail = admit(policy, lambda _i: law, prompts=(6144,), streams=2)[-16:]
    largest = max(t.shape.tokens for t in tail)
    assert largest == 64
    fresh = TickState(2, 2 * 900, 0, 2048)
    unbounded = best_fit(law, policy.sizes, fresh, 1.0 / (1 + policy.margin()))
    assert unbounded == 240  # the budget alone would allow a far bigger first piece
    second = admit(policy, lambda _i: law, prompts=(2048,), streams=2)
    assert second[0].chunk == max(n for n in policy.sizes if n <= 2 * largest)
    assert all(b.chunk <= 2 * a.chunk for a, b in zip(second, second[1:]))
    assert max(t.chunk for t in second) == unbounded or second[-1].shape.tokens < second[-1].chunk


def test_a_lone_spike_does_not_collapse_the_chunk():
    ticks = admit(calibrated(CPU, 1000.0), lambda _i: CPU, prompts=(6144,), spikes=(10,))
    calm = admit(calibrated(CPU, 1000.0), lambda _i: CPU, prompts=(6144,))
    assert ticks[10].seconds > 5.0 and calm[10].chunk == ticks[10].chunk == 176
    # The margin follows the recent error, so the next chunks shrink a little (a fit that took
    # the spike at full weight drops to 32), and within 15 ticks they are the calm run's again.
    assert all(t.chunk >= 0.75 * c.chunk for t, c in zip(ticks[11:45], calm[11:45]))
    assert all(abs(t.chunk - c.chunk) <= 16 for t, c in zip(ticks[25:45], calm[25:45]))
    assert all(t.seconds <= 1.0 for t in ticks[11:])


def test_alone_picks_the_throughput_best_size():
    # tokens per second n / (0.05 + 1e-3 n + 2e-7 n^2) peaks at n = 500: ladder sizes 480 and 512.
    law = Law(tick=0.02, piece=0.03, token=1e-3, att=0.0, sq=2e-7, row=0.01, row_ctx=0.0)
    policy = calibrated(law, 300.0)
    rate = {int(n): n / law.seconds(TickShape(int(n))) for n in policy.sizes}
    best = max(rate, key=rate.get)
    assert best == 512 and policy.chunk_for(TickState(0, 0, 0, 8192)) == 512
    # Bounded by what is left: 300 tokens as one piece beats 288 + 12.
    assert policy.chunk_for(TickState(0, 0, 7892, 300)) == 300
    # Without an n^2 cost a bigger piece is always better: the ceiling.
    assert calibrated(Law(sq=0.0), 300.0).chunk_for(TickState(0, 0, 0, None)) == 2048


def test_falls_back_to_the_static_policy_until_the_model_is_ready():
    model = CostModel.fit([TickSample(TickShape(0, 0, 4), 0.09), TickSample(TickShape(512, 0, 0), 1.8)])
    policy = BudgetChunkPolicy(300.0, model)
    assert not model.ready
    assert policy.chunk_for(TickState(4, 128, 0, 4096)) == 512
    assert policy.chunk_for(TickState(0, 0, 0, 4096)) == 2048
    policy.observe(TickSample(TickShape(512, 0, 4), CPU.seconds(TickShape(512, 0, 4))))
    policy.observe(TickSample(TickShape(2048, 0, 0), CPU.seconds(TickShape(2048, 0, 0))))
    assert model.ready and policy.chunk_for(TickState(4, 128, 0, 4096)) < 512


def test_prefill_chunk_policy_answers_the_same_interface_unchanged():
    policy = PrefillChunkPolicy.resolve(None)
    assert [policy.chunk_for(TickState(n, 10 * n, 100, 5000)) for n in (0, 1, 7)] == [2048, 512, 512]
    assert PrefillChunkPolicy.resolve(1000).chunk_for(TickState(3)) == 1000
    policy.observe(TickSample(TickShape(1), 1.0))  # learns nothing, changes nothing
    assert policy == PrefillChunkPolicy(2048, 512)


def test_stats_and_describe():
    policy = calibrated(CPU, 300.0)
    admit(policy, lambda _i: CPU, prompts=(512,))
    stats = policy.stats()
    assert stats.budget_ms == 300.0 and stats.last_contended_chunk == policy.contended
    assert stats.num_contended_ticks > 0 and stats.num_over_budget == 0 and stats.model.ready
    policy.observe(TickSample(TickShape(), 0.001))  # an idle tick teaches nothing
    assert policy.stats().model.num_observed == stats.model.num_observed
    assert policy.describe() == "itl_budget_ms=300 (chunk per tick in 16..2048; alone: best measured throughput)"
    assert policy.alone == 2048


def test_ladder():
    sizes = ladder()
    assert sizes[:4] == (16, 24, 32, 40) and sizes[-3:] == (1792, 1920, 2048) and len(sizes) == 47
    assert all(s % 8 == 0 for s in sizes)
    assert all((b - a) / a <= 0.125 for a, b in zip(sizes, sizes[1:]) if a >= 64)
    assert ladder(20, 100) == (20, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100)
    with pytest.raises(ValueError):
        ladder(0, 10)


def test_bad_budget():
    with pytest.raises(ValueError, match="budget_ms must be positive"):
        BudgetChunkPolicy(0, CostModel.fit([]))


coefs = st.floats(0.0, 1e-2, allow_subnormal=False)
states = st.builds(TickState, st.integers(0, 64), st.integers(0, 10**6), st.integers(0, 10**5),
                   st.one_of(st.none(), st.integers(1, 10**5)))


@settings(max_examples=150, deadline=None)
@given(st.lists(coefs, min_size=7, max_size=7), states, st.floats(1.0, 5000.0))
def test_chunk_is_always_a_ladder_size_within_bounds(theta, state, budget):
    law = Law(*(v * s for v, s in zip(theta, (10, 10, 1e-1, 1e-4, 1e-4, 1, 1e-4))))
    policy = calibrated(law, budget)
    chunk = policy.chunk_for(state)
    assert policy.floor <= chunk <= policy.ceiling
    assert chunk in policy.sizes or chunk == state.remaining


@settings(max_examples=80, deadline=None)
@given(st.lists(coefs, min_size=7, max_size=7), states, st.floats(1.0, 5000.0), st.integers(1, 8))
def test_contended_chunk_is_monotone(theta, state, budget, more):
    law = Law(*(v * s for v, s in zip(theta, (10, 10, 1e-1, 1e-4, 1e-4, 1, 1e-4))))
    policy, roomier = calibrated(law, budget), calibrated(law, budget * 2)
    busy = TickState(state.num_decoding + 1, state.decode_context, state.prefill_context, state.remaining)
    busier = TickState(busy.num_decoding + more, busy.decode_context, busy.prefill_context + more, busy.remaining)
    assert roomier.chunk_for(busy) >= policy.chunk_for(busy) >= policy.chunk_for(busier)
