"""The short startup calibration that seeds the cost model.

`calibrate(measure)` times a fixed grid of tick shapes through a callable the runner
provides, `measure(tokens, context, rows) -> seconds`: the wall time of one tick that
decodes `rows` scratch sequences and prefills a `tokens`-token piece of a scratch prompt
whose KV already holds `context` tokens (built, untimed, by the callable as needed). Plain
Python: the callable does the MLX work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from .cost_model import CostModel, TickSample, TickShape

log = logging.getLogger("mlxcel_py.engine.calibration")

Measure = Callable[[int, int, int], float]


def default_grid(max_chunk: int = 2048, rows: int = 4, fuses_up_to: int = 0) -> tuple[TickShape, ...]:
    """The shapes to time, cheapest first, so a time limit drops only the most expensive.

    Decode-only ticks separate the tick overhead from the per-row cost; pieces of 32..2048 at
    context 0 give the per-piece overhead, the per-token slope and the n^2 term; one piece
    riding with `rows` decode rows checks that the two add up; a 512-token run over a growing
    KV gives the attention slope. Points of one run follow each other (context = the previous
    point's context + tokens), so a runner that keeps one scratch prompt and extends it
    rebuilds a context (untimed) only to repeat a shape.
    `rows` = 0 (one slot: nothing else ever decodes) leaves out the decode shapes. With a runner
    that runs pieces of up to `fuses_up_to` tokens in one forward with the rows, two such pieces
    (their own fixed cost and slope) are timed too.
    """
    sizes = sorted({min(n, max_chunk) for n in (32, 128, 512, 2048) if max_chunk > 0})
    grid: list[TickShape] = []
    if rows:
        grid += [TickShape(0, 0, 1), TickShape(0, 0, rows)]
    if not sizes:
        return tuple(grid)
    run = min(512, sizes[-1])
    grid += [TickShape(n, 0, 0) for n in sizes if n < run]
    if rows:
        grid.append(TickShape(min(128, run), 0, rows, fused=min(128, run) <= fuses_up_to))
    if rows and fuses_up_to:
        grid += [TickShape(n, 0, rows, fused=True) for n in sorted({min(16, fuses_up_to), min(64, fuses_up_to)})]
    grid += [TickShape(run, k * run, 0) for k in range(3)]
    grid += [TickShape(n, 0, 0) for n in sizes if n > run]
    return tuple(grid)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the calibration measured, and what it left out for lack of time."""

    samples: tuple[TickSample, ...]
    skipped: tuple[TickShape, ...]
    seconds: float  # total measured time (untimed setup, such as building a context, excluded)

    def model(self, **kw) -> CostModel:
        return CostModel.fit(self.samples, **kw)


def calibrate(measure: Measure, grid: Optional[Sequence[TickShape]] = None, *, max_seconds: float = 20.0,
              warmup: Optional[TickShape] = TickShape(32, 0, 0), repeats: int = 2, row_context: int = 0,
              say: Callable[[str], None] = log.info) -> Calibration:
    """Time every grid shape `repeats` times in a row (after one discarded warm-up) until
    `max_seconds` of measured time is spent, and keep the fastest: load on the machine only
    adds time, so the minimum is the device's cost (the online fit then learns the speed the
    device actually runs at). A shape whose measure raises or returns a non-positive time is
    skipped. `row_context` is the KV each of the runner's scratch decode rows holds."""
    grid = default_grid() if grid is None else tuple(grid)
    if warmup is not None:
        measure(warmup.tokens, warmup.context, warmup.rows)  # first-call allocations, compiles
    samples: list[TickSample] = []
    skipped: list[TickShape] = []
    spent = 0.0
    for shape in grid:
        if spent >= max_seconds:
            skipped.append(shape)
            continue
        times = [_measure_one(measure, shape) for _ in range(max(repeats, 1))]
        if any(t is None for t in times):
            skipped.append(shape)
            continue
        spent += sum(times)  # type: ignore[arg-type]
        seconds = min(times)  # type: ignore[type-var]
        samples.append(TickSample(replace(shape, row_context=shape.rows * row_context), seconds))
        say(f"calibration: piece {shape.tokens} over context {shape.context} with {shape.rows} "
            f"decode rows: {seconds * 1000:.1f} ms")
    if skipped:
        say(f"calibration: skipped {len(skipped)} of {len(grid)} shapes after {spent:.1f} s "
            f"(limit {max_seconds:.1f} s or a failed measurement)")
    return Calibration(tuple(samples), tuple(skipped), spent)


def _measure_one(measure: Measure, shape: TickShape) -> Optional[float]:
    try:
        seconds = float(measure(shape.tokens, shape.context, shape.rows))
    except (RuntimeError, ValueError, MemoryError) as exc:  # e.g. the scratch KV does not fit
        log.warning("calibration: %s failed: %s", shape, exc)
        return None
    if not seconds > 0.0 or seconds == float("inf"):
        log.warning("calibration: %s measured %r seconds; skipped", shape, seconds)
        return None
    return seconds
