"""Percentiles and inter-token latency windows on synthetic arrival timestamps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcel_py.loadtest.admit import summarize_round
from mlxcel_py.loadtest.stats import (
    itls_overlapping, itls_within, min_med_max, percentile, summarize, tokens_within,
)


def test_percentile_matches_numpy_linear():
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0
    assert percentile(values, 95) == pytest.approx(38.5)
    assert percentile([7.0], 95) == 7.0 and percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_within_range_and_monotone(values, q):
    p = percentile(values, q)
    assert min(values) <= p <= max(values)
    assert percentile(values, min(100.0, q + 1)) >= p - 1e-9


def test_summarize_reports_ms():
    s = summarize([0.010, 0.020, 0.030, 0.040, 0.100])
    assert s.num_intervals == 5 and s.p50_ms == pytest.approx(30.0) and s.max_ms == pytest.approx(100.0)
    assert s.mean_ms == pytest.approx(40.0) and s.p95_ms == pytest.approx(88.0)
    assert summarize([]).to_json() == {"num_intervals": 0, "p50_ms": None, "p95_ms": None,
                                       "mean_ms": None, "max_ms": None}


# A stream decoding every 50 ms, stalled by a prefill from t=1.0 to t=2.0 (admission sent at
# 1.0, admitted first token at 2.0): its tokens arrive at 0.9, 0.95, 1.0 ... then 2.05 after the gap.
TIMES = [0.8, 0.85, 0.9, 0.95, 1.02, 2.05, 2.1, 2.15]


def test_quiet_window_keeps_only_intervals_inside():
    assert itls_within(TIMES, 0.8, 1.0) == pytest.approx([0.05, 0.05, 0.05])


def test_admission_window_counts_the_stall_that_spans_it():
    # 0.95->1.02 starts before the window; 1.02->2.05 covers its end: both overlap it.
    assert itls_overlapping(TIMES, 1.0, 2.0) == pytest.approx([0.07, 1.03])
    assert tokens_within(TIMES, 1.0, 2.0) == 1


def test_a_stream_with_no_token_in_the_window_reports_the_whole_gap():
    times = [0.9, 0.95, 2.3, 2.35]
    assert itls_overlapping(times, 1.0, 2.0) == pytest.approx([1.35])
    assert tokens_within(times, 1.0, 2.0) == 0


def test_summarize_round_per_stream():
    stats = summarize_round([TIMES, [0.9, 0.95, 2.3, 2.35]], quiet=(0.8, 1.0), admit=(1.0, 2.0))
    assert stats[0]["quiet"]["num_intervals"] == 3 and stats[0]["tokens_during"] == 1
    assert stats[0]["during"]["max_ms"] == pytest.approx(1030.0)
    assert stats[1]["quiet"]["num_intervals"] == 1 and stats[1]["during"]["p95_ms"] == pytest.approx(1350.0)


def test_min_med_max():
    assert min_med_max([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    assert min_med_max([]) == (None, None, None)
