"""The tick cost model: exact fits of a known law, forgetting, priors, outliers, bounds."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mlxcel_py.engine.chunking.cost_model import FEATURES, CostModel, TickSample, TickShape, solve_nonnegative

from budget_sim import CPU, GPU, Law

SHAPES = [TickShape(0, 0, 1), TickShape(0, 0, 4), TickShape(32, 0, 0), TickShape(128, 0, 0),
          TickShape(128, 0, 4), TickShape(512, 0, 0), TickShape(512, 512, 0), TickShape(512, 1024, 0),
          TickShape(2048, 0, 0), TickShape(64, 3000, 2, 500)]
HELD_OUT = [TickShape(48, 6144, 4, 400), TickShape(1024, 2048, 0), TickShape(0, 0, 7, 9000), TickShape(16, 0, 1)]
COEFS = ("tick", "piece", "token", "att", "sq", "row", "row_ctx")


def samples(law: Law, shapes=SHAPES):
    return [TickSample(s, law.seconds(s)) for s in shapes]


@pytest.mark.parametrize("law", [CPU, GPU], ids=["cpu", "gpu"])
def test_fit_recovers_a_law_that_the_features_span(law):
    model = CostModel.fit(samples(law))
    got = dict(model.coefficients())
    for name, key in zip(FEATURES, COEFS):
        assert got[name] == pytest.approx(getattr(law, key), rel=5e-3, abs=1e-12)
    for shape in HELD_OUT:
        assert model.predict(shape) == pytest.approx(law.seconds(shape), rel=1e-3)
    assert model.ready and model.recent_error is None


def test_predict_many_matches_predict():
    model = CostModel.fit(samples(CPU))
    sizes = np.array([16, 64, 512, 2048])
    many = model.predict_many(sizes, 3000, 4, 600)
    assert many.tolist() == pytest.approx([model.predict(TickShape(int(n), 3000, 4, 600)) for n in sizes])


def test_one_piece_length_is_not_ready_until_a_second_length_is_seen():
    model = CostModel.fit(samples(CPU, [TickShape(0, 0, 4), TickShape(512, 0, 0), TickShape(512, 512, 0)]))
    assert not model.ready
    model.observe(TickSample(TickShape(512, 1024, 4), CPU.seconds(TickShape(512, 1024, 4))))
    assert not model.ready
    model.observe(TickSample(TickShape(48, 1536, 4), CPU.seconds(TickShape(48, 1536, 4))))
    assert model.ready


def test_an_online_change_is_learned_and_unexcited_directions_keep_the_seed():
    model = CostModel.fit(samples(CPU))
    doubled = CPU.scaled(2.0)
    # Online ticks at 4 rows with a piece: tick, piece and rows move only together.
    shapes = [TickShape(32 + 16 * (i % 4), 64 * i, 4, 200 + 4 * i) for i in range(60)]
    for shape in shapes:
        model.observe(TickSample(shape, doubled.seconds(shape)))
    near = TickShape(48, 64 * 60, 4, 440)
    assert model.predict(near) == pytest.approx(doubled.seconds(near), rel=0.01)
    assert model.recent_error < 0.01
    # What no online tick measured keeps the seed's value times the speed factor (2 here):
    # theta - 2 seed has no component in the null space of the online features.
    assert model.speed_factor() == pytest.approx(2.0, rel=1e-3)
    x = np.array([s.features() for s in shapes])
    null = np.linalg.svd(x)[2][np.linalg.matrix_rank(x):]
    assert len(null) == 4  # two directions these ticks leave unexcited, and the two fused-piece terms
    assert null @ (model.theta - model.prior()) == pytest.approx([0.0] * 4, abs=1e-9)
    assert model.predict(TickShape(0, 0, 1)) == pytest.approx(doubled.seconds(TickShape(0, 0, 1)), rel=1e-3)


def test_with_no_online_ticks_the_prediction_is_the_seed():
    model = CostModel.fit(samples(GPU))
    before = [model.predict(s) for s in HELD_OUT]
    assert model.stats().num_observed == 0
    model.observe(TickSample(TickShape(64, 0, 4), GPU.seconds(TickShape(64, 0, 4))))  # agrees with the seed
    assert [model.predict(s) for s in HELD_OUT] == pytest.approx(before, rel=1e-3)


def test_a_lone_spike_barely_moves_the_fit():
    model = CostModel.fit(samples(CPU))
    shape = TickShape(48, 1000, 4, 200)
    truth = CPU.seconds(shape)
    for _ in range(10):
        model.observe(TickSample(shape, truth))
    weight = model.observe(TickSample(shape, 10 * truth))
    assert weight < 0.05 and model.num_outliers == 1
    assert model.predict(shape) == pytest.approx(truth, rel=0.05)


def test_recent_error_is_the_ewma_of_relative_error():
    model = CostModel.fit(samples(CPU), error_alpha=0.5)
    shape = TickShape(64, 0, 4)
    truth = CPU.seconds(shape)
    model.observe(TickSample(shape, truth / 0.8))  # predicted 0.8 of actual: relative error 0.2
    assert model.recent_error == pytest.approx(0.2, rel=1e-4)
    model.observe(TickSample(shape, model.predict(shape)))  # exact: error 0
    assert model.recent_error == pytest.approx(0.1, rel=1e-4)


def test_coefficients_never_go_negative():
    # Data that least squares would explain with a negative per-token cost.
    data = [TickSample(TickShape(n, 0, 0), 1.0 - n / 4096) for n in (32, 128, 512, 2048)]
    model = CostModel.fit(data)
    assert all(v >= 0 for _, v in model.coefficients())
    assert model.predict(TickShape(2048, 0, 0)) >= model.predict(TickShape(32, 0, 0))


def test_stats_report_the_fit():
    model = CostModel.fit(samples(CPU))
    model.observe(TickSample(TickShape(64, 0, 4), CPU.seconds(TickShape(64, 0, 4))))
    stats = model.stats()
    assert stats.num_calibration_samples == len(SHAPES) and stats.num_observed == 1 and stats.ready
    assert [n for n, _ in stats.coefficients] == list(FEATURES)
    assert stats.speed_factor == pytest.approx(1.0, rel=1e-4) and stats.recent_error < 1e-4
    assert "tokens=0.0034" in stats.describe() and "speed x1.00 of the seed, 1 ticks" in stats.describe()


@pytest.mark.parametrize("bad", [dict(tokens=-1), dict(context=1.5), dict(rows=True)])
def test_shape_rejects_bad_counts(bad):
    with pytest.raises(ValueError):
        TickShape(**bad)


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_sample_rejects_bad_times(seconds):
    with pytest.raises(ValueError, match="seconds must be a positive finite number"):
        TickSample(TickShape(1), seconds)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=3, max_size=3), st.lists(st.floats(0, 2), min_size=3, max_size=3))
def test_solve_nonnegative_is_feasible_and_kkt_optimal(target, prior):
    # A diagonal problem has a closed form: each coefficient is max(0, its unconstrained optimum).
    gram = np.diag([1.0, 2.0, 3.0])
    rhs = gram @ np.array(target)
    theta = solve_nonnegative(gram, rhs, np.array(prior), 0.5)
    expected = np.maximum((rhs + 0.5 * np.array(prior)) / (np.diag(gram) + 0.5), 0.0)
    assert theta == pytest.approx(expected, abs=1e-9)
