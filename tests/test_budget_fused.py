"""The cost model's fused-tick terms (one forward for the decode rows and a piece) and
the budget's honest floor (said once in the log, counted in /metrics)."""

import logging

import numpy as np
import pytest

from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy
from mlxcel_py.engine.chunking.calibration import default_grid
from mlxcel_py.engine.chunking.cost_model import FEATURES, CostModel, TickSample, TickShape
from mlxcel_py.engine.chunking.policy import TickState


def law(shape: TickShape) -> float:
    """A fake CPU: a separate piece costs 150 ms + 1 ms a token; fused, 10 ms + 0.4 ms a token."""
    t = 0.05 + 0.002 * shape.rows + 2e-8 * shape.tokens * shape.context
    if shape.tokens and shape.fused:
        return t + 0.010 + 0.0004 * shape.tokens
    return t + (0.150 + 0.001 * shape.tokens if shape.tokens else 0.0)


def test_the_grid_times_fused_pieces_when_the_runner_fuses():
    plain, fused = default_grid(2048, 4), default_grid(2048, 4, fuses_up_to=128)
    assert not any(s.fused for s in plain)
    assert sorted((s.tokens, s.rows) for s in fused if s.fused) == [(16, 4), (64, 4), (128, 4)]


def test_the_fit_tells_fused_from_separate_pieces():
    model = CostModel.fit([TickSample(s, law(s)) for s in default_grid(2048, 4, fuses_up_to=128)],
                          fuses_up_to=128)
    sizes = np.array([16, 64, 128, 256])
    want = [law(TickShape(int(n), 2048, 4, 4 * 300, fused=n <= 128)) for n in sizes]
    assert model.predict_many(sizes, 2048, 4, 4 * 300) == pytest.approx(want, rel=1e-3)
    assert dict(model.coefficients())["fused_piece"] == pytest.approx(0.010, rel=1e-3)


def test_without_fused_samples_the_model_predicts_separate_ticks():
    model = CostModel.fit([TickSample(s, law(s)) for s in default_grid(2048, 4)], fuses_up_to=128)
    assert model.fuses_up_to == 0
    assert model.predict_many(np.array([16]), 0, 4, 0)[0] == pytest.approx(law(TickShape(16, 0, 4)), rel=1e-3)


def test_the_honest_floor_is_said_once_and_counted(caplog):
    seed = np.zeros(len(FEATURES))
    seed[FEATURES.index("tick")] = 0.5  # every tick 500 ms: no piece fits a 300 ms budget
    seed[FEATURES.index("piece")] = 0.1
    policy = BudgetChunkPolicy(300.0, CostModel(seed))
    state = TickState(num_decoding=4, decode_context=1200, prefill_context=6000, remaining=144)
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.engine.budget"):
        assert [policy.chunk_for(state) for _ in range(3)] == [16, 16, 16]
    said = [r.getMessage() for r in caplog.records]
    assert said == ["--itl-budget-ms 300 cannot be held here: the smallest piece (16 tokens) at context 6000 with "
                    "4 rows decoding is predicted at 600 ms a tick; pieces stay at 16 tokens"]
    stats = policy.stats()
    assert (stats.num_floor_ticks, stats.floor_ms) == (3, pytest.approx(600.0))
    from mlxcel_py.server.http.metrics import _budget_metrics

    families = {f.name: f for f in _budget_metrics(stats)}
    assert families["mlxcel_itl_budget_floor_ticks"].samples[0].value == 3
    assert families["mlxcel_itl_budget_floor_seconds"].samples[0].value == pytest.approx(0.6)
