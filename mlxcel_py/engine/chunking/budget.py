"""The prefill chunk chosen by time: the largest piece whose tick fits an ITL budget.

With `--itl-budget-ms B`, each tick the scheduler asks `chunk_for(TickState)` (the
`ChunkPolicy` Protocol, chunking/policy.py):
- others decoding: the largest ladder size whose predicted tick (the decode step it rides
  with plus the piece) fits B / (1 + margin), the margin being the recent error of the
  predictions for such ticks (a piece riding with decode rows);
  never below `floor` (prefill always progresses) nor above `ceiling` (the alone chunk);
- alone: the ladder size (or the whole remainder) with the best predicted prefill
  throughput, tokens per second, at the prompt's current context.
After each tick the engine loop calls `observe(TickSample)` with the measured tick time.
Pure Python and numpy; see docs/adr/0008-itl-budget.md.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .cost_model import CostModel, CostModelStats, TickSample
from .fixed import DEFAULT_PREFILL_CHUNK, PrefillChunkPolicy
from .policy import TickState

log = logging.getLogger("mlxcel_py.engine.budget")

DEFAULT_FLOOR = 16
GROWTH = 2  # a contended chunk is at most this times the largest piece among the recent ones
RECENT_PIECES = 16  # how many of the latest pieces (any tick that ran one) bound the growth
GRAIN = 8  # every ladder size is a multiple of this (one AVX register of float32)


def ladder(floor: int = DEFAULT_FLOOR, ceiling: int = DEFAULT_PREFILL_CHUNK) -> tuple[int, ...]:
    """The chunk sizes the policy picks from: multiples of 8 up to 128, then 8 per octave.

    Few sizes, so the runner and MLX see the same piece shapes again (buffer and kernel
    caches; a tile-aligned shape wastes no padding), the fit is trained on the shapes that
    run, and fit noise moves the chunk by whole steps, not token by token, keeping
    consecutive pieces equal (a resumed plan then matches the cold plan). At most 12.5 %
    below the exact fit above 64 tokens; finer than that where a long context makes even
    small pieces cost most of the budget (16 -> 24 -> 32 tokens, not 16 -> 32).
    """
    if not 1 <= floor <= ceiling:
        raise ValueError(f"need 1 <= floor <= ceiling (got floor={floor}, ceiling={ceiling})")
    sizes, v = {floor, ceiling}, GRAIN
    while v < ceiling:
        if v >= floor:
            sizes.add(v)
        v += max(GRAIN, 1 << (v.bit_length() - 4))
    return tuple(sorted(sizes))


@dataclass(frozen=True, slots=True)
class BudgetStats:
    """For /metrics and the startup log."""

    budget_ms: float
    margin: float  # the share of the budget held back for prediction error
    last_contended_chunk: Optional[int]
    last_alone_chunk: Optional[int]
    num_contended_ticks: int  # observed ticks with a piece and decode rows
    num_over_budget: int  # of those, how many took longer than the budget
    model: CostModelStats
    num_floor_ticks: int = 0  # contended chunks chosen when even the floor was predicted over the budget
    floor_ms: Optional[float] = None  # the floor piece's predicted tick, the last time it did not fit


class BudgetChunkPolicy:
    """The prefill chunk for an ITL budget; falls back to 2048/512 until the model is ready."""

    def __init__(self, budget_ms: float, model: CostModel, *, floor: int = DEFAULT_FLOOR,
                 ceiling: int = DEFAULT_PREFILL_CHUNK, start_margin: float = 0.1, max_margin: float = 0.3,
                 fallback: PrefillChunkPolicy = PrefillChunkPolicy.resolve(None)):
        if not budget_ms > 0:
            raise ValueError(f"budget_ms must be positive (got {budget_ms})")
        self.budget_ms, self.model, self.fallback = float(budget_ms), model, fallback
        self.floor, self.ceiling = floor, ceiling
        self.start_margin, self.max_margin = start_margin, max_margin
        self.sizes = np.array(ladder(floor, ceiling))
        self._last: dict[bool, int] = {}
        self.num_contended_ticks = self.num_over_budget = self.num_floor_ticks = 0
        self.floor_ms: Optional[float] = None
        # EWMA of |predicted - measured| / measured over contended ticks only: the ticks the
        # budget is about. Decode-only ticks are short, so a few ms of jitter (the HTTP
        # thread, GC) is a large relative error there that says nothing about a piece's tick.
        self.contended_error: Optional[float] = None
        # The fit is trusted near the pieces it has seen lately: after a long prompt's last
        # pieces (48-64 tokens at 6,000 positions) it predicted a 1,280-token piece at context
        # 0 within budget, and that tick stalled the streams for 2.2 s. So a contended chunk at
        # most doubles the largest recent piece (calibration alone: no bound).
        self._recent: deque[int] = deque(maxlen=RECENT_PIECES)

    # -- the two calls the engine makes ------------------------------------------------------
    def chunk_for(self, state: TickState) -> int:
        """The chunk for this tick's piece; read every tick, like PrefillChunkPolicy.chunk_for."""
        chunk = self._choose(state)
        self._last[state.num_decoding > 0] = chunk
        return chunk

    def observe(self, sample: TickSample) -> None:
        """Fold the measured tick (its shape and wall time) into the cost model; a tick that
        neither decoded nor prefilled says nothing about either and is ignored."""
        if not (sample.shape.tokens or sample.shape.rows):
            return
        if sample.shape.tokens:
            self._recent.append(sample.shape.tokens)
        if sample.shape.tokens and sample.shape.rows:
            rel = abs(sample.seconds - self.model.predict(sample.shape)) / sample.seconds  # before the update
            a, e = self.model.error_alpha, self.contended_error
            self.contended_error = rel if e is None else (1 - a) * e + a * rel
            self.num_contended_ticks += 1
            self.num_over_budget += sample.seconds * 1000.0 > self.budget_ms
        self.model.observe(sample)

    # -- the choices -------------------------------------------------------------------------
    def _choose(self, state: TickState) -> int:
        contended = state.num_decoding > 0
        if not self.model.ready:
            return self.fallback.chunk(contended)
        return self._fit_budget(state) if contended else self._best_throughput(state)

    def margin(self) -> float:
        error = self.contended_error
        return min(self.start_margin if error is None else error, self.max_margin)

    def target_s(self) -> float:
        return self.budget_ms / 1000.0 / (1.0 + self.margin())

    def _fit_budget(self, state: TickState) -> int:
        """The largest size whose tick fits the target; the fit is monotone in n (coefs >= 0)."""
        predicted = self.model.predict_many(self.sizes, state.prefill_context, state.num_decoding,
                                            state.decode_context)
        fits = np.flatnonzero(predicted <= self.target_s())
        if not len(fits):
            self._floor_missed(state, float(predicted[0]) * 1000.0)
        chunk = int(self.sizes[fits[-1]]) if len(fits) else self.floor
        if self._recent:
            bound = GROWTH * max(self._recent)
            chunk = min(chunk, int(self.sizes[np.searchsorted(self.sizes, bound, side="right") - 1]))
        return max(chunk, self.floor)

    def _floor_missed(self, state: TickState, floor_ms: float) -> None:
        """The honest floor: even the smallest piece does not fit; say so once, count it for /metrics."""
        if not self.num_floor_ticks:
            log.warning("--itl-budget-ms %g cannot be held here: the smallest piece (%d tokens) at context %d with "
                        "%d rows decoding is predicted at %.0f ms a tick; pieces stay at %d tokens",
                        self.budget_ms, self.floor, state.prefill_context, state.num_decoding, floor_ms, self.floor)
        self.num_floor_ticks += 1
        self.floor_ms = floor_ms

    def _best_throughput(self, state: TickState) -> int:
        """The size with the most prompt tokens per predicted second, no bigger than the rest."""
        sizes = self.sizes
        if state.remaining is not None:
            sizes = sizes[sizes < state.remaining]
            if self.floor <= state.remaining <= self.ceiling:
                sizes = np.append(sizes, state.remaining)  # the whole rest as one piece
            if not len(sizes):
                return self.floor
        seconds = self.model.predict_many(sizes, state.prefill_context, 0, 0)
        rate = sizes / np.maximum(seconds, 1e-12)
        return int(sizes[len(rate) - 1 - int(np.argmax(rate[::-1]))])  # ties: the bigger piece

    # -- what the scheduler and the startup log read -----------------------------------------
    @property
    def alone(self) -> int:
        """The largest chunk this policy may pick (the scheduler's boundary-segment bound uses min)."""
        return self.ceiling

    @property
    def contended(self) -> int:
        """The last contended chunk, else the one for a single decode row at context 0."""
        return self._last.get(True) or self._choose(TickState(num_decoding=1))

    def fuses(self, runner_limit: int) -> bool:
        """The budget's fit knows fused ticks when its cost model was calibrated with them."""
        return runner_limit > 0 and self.model.fuses_up_to > 0

    def describe(self) -> str:
        return (f"itl_budget_ms={self.budget_ms:g} (chunk per tick in {self.floor}..{self.ceiling}; "
                f"alone: best measured throughput)")

    def stats(self) -> BudgetStats:
        return BudgetStats(self.budget_ms, self.margin(), self._last.get(True), self._last.get(False),
                           self.num_contended_ticks, self.num_over_budget, self.model.stats(),
                           self.num_floor_ticks, self.floor_ms)
