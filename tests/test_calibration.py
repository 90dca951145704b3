"""The startup calibration: the grid, its order, the time limit, failed measurements."""

import logging

import pytest

from mlxcel_py.engine.chunking.calibration import calibrate, default_grid
from mlxcel_py.engine.chunking.cost_model import TickShape

from budget_sim import CPU


class Recorder:
    """A measure callable that logs every call and answers from the CPU-shaped law."""

    def __init__(self, fail_on=()):
        self.calls = []
        self.fail_on = set(fail_on)

    def __call__(self, tokens, context, rows):
        self.calls.append((tokens, context, rows))
        if (tokens, context, rows) in self.fail_on:
            raise RuntimeError("the scratch KV does not fit")
        return CPU.measure(tokens, context, rows)


def test_default_grid_order():
    assert [(s.tokens, s.context, s.rows) for s in default_grid(2048, 4)] == [
        (0, 0, 1), (0, 0, 4), (32, 0, 0), (128, 0, 0), (128, 0, 4),
        (512, 0, 0), (512, 512, 0), (512, 1024, 0), (2048, 0, 0)]


def test_grid_for_one_slot_and_a_small_ceiling():
    # One slot: nothing else decodes, so no decode shapes; the run uses the ceiling.
    assert [(s.tokens, s.context, s.rows) for s in default_grid(256, 0)] == [
        (32, 0, 0), (128, 0, 0), (256, 0, 0), (256, 256, 0), (256, 512, 0)]


def test_each_run_point_continues_the_previous_scratch_prompt():
    grid = default_grid(2048, 4)
    for prev, cur in zip(grid, grid[1:]):
        if cur.context:
            assert cur.context == prev.context + prev.tokens and cur.tokens == prev.tokens


def test_calibrate_measures_the_grid_after_a_discarded_warmup():
    measure, said = Recorder(), []
    cal = calibrate(measure, max_seconds=1e9, repeats=1, row_context=32, say=said.append)
    grid = default_grid()
    assert measure.calls == [(32, 0, 0)] + [(s.tokens, s.context, s.rows) for s in grid]
    assert [s.shape for s in cal.samples] == [TickShape(s.tokens, s.context, s.rows, 32 * s.rows) for s in grid]
    assert cal.seconds == pytest.approx(sum(CPU.measure(s.tokens, s.context, s.rows) for s in grid))
    assert said[0] == "calibration: piece 0 over context 0 with 1 decode rows: 45.0 ms"
    assert said[-1] == "calibration: piece 2048 over context 0 with 0 decode rows: 8427.3 ms"
    assert not cal.skipped and cal.model().ready


def test_the_time_limit_skips_the_most_expensive_shapes():
    said = []
    cal = calibrate(Recorder(), max_seconds=5.0, repeats=1, say=said.append)
    # 0.045 + 0.09 + 0.189 + 0.521 + 0.581 + 1.907 (512 over 0) + 2.083 (512 over 512) = 5.42 s
    # crosses 5 s: the two shapes after it are left out.
    assert [(s.tokens, s.context) for s in cal.skipped] == [(512, 1024), (2048, 0)]
    assert said[-1].startswith("calibration: skipped 2 of 9 shapes after 5.4 s")
    assert cal.model().ready


def test_each_shape_is_repeated_and_the_fastest_time_kept():
    # A busy machine only adds time: the second run of each shape is 30 % slower here.
    measure = Recorder()

    def slowed(n, c, b):
        seconds = measure(n, c, b)
        second_of_pair = len(measure.calls) > 1 and len(measure.calls) % 2 == 1  # call 1 is the warm-up
        return seconds * (1.3 if second_of_pair else 1.0)

    cal = calibrate(slowed, max_seconds=1e9, say=lambda _m: None)
    grid = default_grid()
    assert measure.calls == [(32, 0, 0)] + [(s.tokens, s.context, s.rows) for s in grid for _ in range(2)]
    assert [s.seconds for s in cal.samples] == [CPU.measure(s.tokens, s.context, s.rows) for s in grid]
    assert cal.seconds == pytest.approx(2.3 * sum(s.seconds for s in cal.samples))


def test_a_failed_measurement_is_skipped_and_logged(caplog):
    measure = Recorder(fail_on={(2048, 0, 0)})
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.engine.chunking.calibration"):
        cal = calibrate(measure, max_seconds=1e9, say=lambda _m: None)
    assert [s.tokens for s in cal.skipped] == [2048]
    assert "the scratch KV does not fit" in caplog.text


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_nonsense_time_is_skipped(bad):
    cal = calibrate(lambda n, c, b: bad if n == 32 else CPU.measure(n, c, b), max_seconds=1e9, warmup=None,
                    say=lambda _m: None)
    assert [s.tokens for s in cal.skipped] == [32]
