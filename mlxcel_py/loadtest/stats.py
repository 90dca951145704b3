"""Inter-token latency windows and summary statistics over token arrival timestamps.

Times are seconds (any common origin); reported latencies are milliseconds."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100 (got {q})")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class ItlStats:
    """Inter-token latencies of one stream in one window, in ms (None when num_intervals == 0)."""

    num_intervals: int
    p50_ms: Optional[float]
    p95_ms: Optional[float]
    mean_ms: Optional[float]
    max_ms: Optional[float]

    def to_json(self) -> dict:
        return asdict(self)


def summarize(intervals_s: Sequence[float]) -> ItlStats:
    """p50/p95/mean/max of intervals given in seconds, reported in ms."""
    ms = [d * 1000.0 for d in intervals_s]
    if not ms:
        return ItlStats(0, None, None, None, None)
    return ItlStats(len(ms), percentile(ms, 50), percentile(ms, 95), sum(ms) / len(ms), max(ms))


def intervals(times: Sequence[float]) -> list[tuple[float, float]]:
    """Consecutive (previous, next) arrival pairs."""
    return list(zip(times[:-1], times[1:]))


def itls_within(times: Sequence[float], start: float, end: float) -> list[float]:
    """Intervals that begin and end inside [start, end] (the quiet window)."""
    return [b - a for a, b in intervals(times) if a >= start and b <= end]


def itls_overlapping(times: Sequence[float], start: float, end: float) -> list[float]:
    """Intervals that overlap (start, end): a stall spanning the whole window still counts.

    Used for the admission window, so a stream that got no token during the prefill reports
    the one long gap that covered it (the stream must have a token after `end`)."""
    return [b - a for a, b in intervals(times) if b > start and a < end]


def tokens_within(times: Sequence[float], start: float, end: float) -> int:
    """How many arrivals fall inside (start, end]."""
    return sum(1 for t in times if start < t <= end)


def min_med_max(values: Sequence[float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(min, median, max); all None when empty."""
    if not values:
        return None, None, None
    return min(values), percentile(values, 50), max(values)
