"""Predicted wall time of one engine tick, learned online from the engine's own ticks.

A tick is one decode step over `rows` sequences plus at most one prefill piece of `tokens`
prompt tokens over a KV that already holds `context` of that prompt. Its time is modelled
as linear in a few features (docs/adr/0008-itl-budget.md):

    t = a_tick + a_piece*[n>0] + a_tok*n + a_att*n*c + a_sq*n^2 + a_row*b + a_rctx*C
        + a_fpiece*[fused] + a_ftok*n*[fused]

where a fused tick (one forward for the decode rows and the piece, engine/runner/tick.py) moves
the piece's fixed cost and per-token slope to their own terms (the weights are streamed once
for both: a small piece costs little more than the rows it rides with), the attention terms
shared; `piece` and `tokens` then count the separate pieces only.

fitted by exponentially weighted least squares, regularized toward a seed fit from a short
calibration scaled by the measured speed factor (so a direction the recent ticks do not
excite keeps the seed's value, times how much slower or faster the device runs now), with
non-negative coefficients and Huber weights against outliers. Plain numpy: no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from .policy import check_count

FEATURES = ("tick", "piece", "tokens", "tokens_x_context", "tokens_sq", "rows", "row_context", "fused_piece",
            "fused_tokens")
# Natural units the coefficients are reported in (seconds per ...).
UNITS = ("tick", "piece", "token", "token*context", "token^2", "row", "row context token", "fused piece",
         "fused token")
# Features are scaled to O(1) at a typical operating point so the regularizer is isotropic.
_N0, _C0, _R0 = 512.0, 4096.0, 4.0
_F0 = 64.0  # a typical fused piece
_SCALE = np.array([1.0, 1.0, _N0, _N0 * _C0, _N0 * _N0, _R0, _R0 * _C0, 1.0, _F0])
_MIN_NONZERO_TOKENS = 2  # distinct piece lengths needed before the tokens slope is identified


@dataclass(frozen=True, slots=True)
class TickShape:
    """What a tick computes: the prefill piece (tokens over context) and the decode rows."""

    tokens: int = 0  # n: prefill piece length, 0 for a decode-only tick
    context: int = 0  # c: the prefilling prompt's tokens already in its KV (the piece's start)
    rows: int = 0  # b: sequences decoded in this tick
    row_context: int = 0  # KV positions over the decode rows (their attention cost)
    fused: bool = False  # the piece and the rows ran as one forward

    def __post_init__(self) -> None:
        for name in ("tokens", "context", "rows", "row_context"):
            check_count(name, getattr(self, name))

    def features(self) -> np.ndarray:
        fuse = self.tokens if self.fused and self.rows and self.tokens else 0
        return features(np.array([self.tokens]), self.context, self.rows, self.row_context, fuse)[0]


@dataclass(frozen=True, slots=True)
class TickSample:
    """One measured tick: its shape and its wall time in seconds."""

    shape: TickShape
    seconds: float

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and np.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds must be a positive finite number (got {self.seconds!r})")


@dataclass(frozen=True, slots=True)
class CostModelStats:
    """The fit for /metrics and the startup log: coefficients in seconds per natural unit."""

    coefficients: tuple[tuple[str, float], ...]
    recent_error: Optional[float]  # EWMA of |predicted - measured| / measured; None before any tick
    speed_factor: float  # measured / seed-predicted time over the recent ticks (1.0 before any)
    num_calibration_samples: int
    num_observed: int  # online ticks observed
    num_outliers: int  # online ticks whose Huber weight was below 1
    ready: bool

    def describe(self) -> str:
        coef = " ".join(f"{name}={value:.3g}" for name, value in self.coefficients)
        err = "-" if self.recent_error is None else f"{self.recent_error:.1%}"
        return (f"{coef} (s per unit; recent error {err}, speed x{self.speed_factor:.2f} of the seed, "
                f"{self.num_observed} ticks)")


def features(tokens: np.ndarray, context: int, rows: int, row_context: int, fuses_up_to: int = 0) -> np.ndarray:
    """Scaled feature rows, one per candidate piece length in `tokens` (same tick otherwise); a
    piece of up to `fuses_up_to` tokens next to decode rows is a fused one."""
    n = np.asarray(tokens, dtype=np.float64)
    fused = ((n > 0) & (n <= fuses_up_to) & (rows > 0)).astype(np.float64)
    separate = (n > 0).astype(np.float64) - fused
    raw = np.stack([
        np.ones_like(n), separate, n * separate, n * context, n * n,
        np.full_like(n, rows), np.full_like(n, row_context), fused, n * fused,
    ], axis=1)
    return raw / _SCALE


def solve_nonnegative(gram: np.ndarray, rhs: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """argmin (th-prior)' ridge (th-prior) + th' gram th - 2 rhs' th, with th >= 0.

    Active set: clamp the most negative coefficient to 0 and re-solve on the rest, at most
    once per coefficient (a handful of features; scipy's nnls is not worth the dependency).
    """
    free = np.ones(len(prior), dtype=bool)
    theta = np.zeros(len(prior))
    for _ in range(len(prior)):
        idx = np.flatnonzero(free)
        a = gram[np.ix_(idx, idx)] + ridge * np.eye(len(idx))
        theta = np.zeros(len(prior))
        theta[idx] = np.linalg.solve(a, rhs[idx] + ridge * prior[idx])
        if theta.min() >= 0.0:
            return theta
        free[int(np.argmin(theta))] = False
    return np.maximum(theta, 0.0)


class CostModel:
    """Tick time as a non-negative linear function of `FEATURES`, fitted online.

    The seed (a fit on calibration samples) is the prior: with few or degenerate online
    ticks the prediction is the seed's; with many, the recent ticks decide.
    """

    def __init__(self, seed: np.ndarray, *, num_calibration_samples: int = 0, ready: bool = True,
                 forgetting: float = 0.9, ridge: float = 1e-3, huber: float = 3.0,
                 error_alpha: float = 0.2, min_error: float = 0.05, fuses_up_to: int = 0):
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1] (got {forgetting})")
        self.seed = np.maximum(np.asarray(seed, dtype=np.float64), 0.0)
        self.theta = self.seed.copy()
        self.forgetting, self.ridge, self.huber = forgetting, ridge, huber
        self.error_alpha, self.min_error = error_alpha, min_error
        self.num_calibration_samples, self._ready = num_calibration_samples, ready
        self.fuses_up_to = fuses_up_to  # the runner's longest one-forward piece (predict_many's `fused`)
        # Sufficient statistics in two parts, each forgotten only by its own kind of tick:
        # [0] ticks that ran a piece, [1] decode-only ticks. Between admissions only decode
        # runs; one forgetting clock would wipe out what the last admission taught about
        # pieces within ~30 decode ticks, and the next admission would start from the seed.
        self._gram = np.zeros((2, len(FEATURES), len(FEATURES)))
        self._rhs = np.zeros((2, len(FEATURES)))
        self._sp = self._pp = 0.0  # sums for the speed factor: seed prediction x measured, squared
        self._lengths: set[int] = set()
        self.recent_error: Optional[float] = None
        self.num_observed = self.num_outliers = 0

    @classmethod
    def fit(cls, samples: Iterable[TickSample], **kw) -> CostModel:
        """The seed from calibration samples (plain non-negative least squares, ridge to 0).

        `ready` needs pieces of at least two lengths, else the tokens slope is a guess.
        """
        samples = list(samples)
        x = np.array([s.shape.features() for s in samples]).reshape(-1, len(FEATURES))
        y = np.array([s.seconds for s in samples], dtype=np.float64)
        seed = solve_nonnegative(x.T @ x, x.T @ y, np.zeros(len(FEATURES)), 1e-6)
        lengths = {s.shape.tokens for s in samples if s.shape.tokens > 0}
        if not any(s.shape.fused for s in samples):  # fused terms unseeded: predict separate (costlier) ticks
            kw["fuses_up_to"] = 0
        model = cls(seed, num_calibration_samples=len(samples), ready=len(lengths) >= _MIN_NONZERO_TOKENS, **kw)
        model._lengths = lengths
        return model

    @property
    def ready(self) -> bool:
        """Whether the predictions can be trusted to choose a chunk (else: a static fallback)."""
        return self._ready or len(self._lengths) >= _MIN_NONZERO_TOKENS

    def predict(self, shape: TickShape) -> float:
        return float(shape.features() @ self.theta)

    def predict_many(self, tokens: np.ndarray, context: int, rows: int, row_context: int) -> np.ndarray:
        """Predicted seconds for each candidate piece length, the rest of the tick fixed."""
        return features(tokens, context, rows, row_context, self.fuses_up_to) @ self.theta

    def observe(self, sample: TickSample) -> float:
        """Fold one measured tick into the fit; returns its Huber weight (1 = not an outlier)."""
        x = sample.shape.features()
        predicted, actual = float(x @ self.theta), sample.seconds
        weight = self._huber_weight(predicted, actual)
        rel = abs(actual - predicted) / actual
        a = self.error_alpha
        self.recent_error = rel if self.recent_error is None else (1 - a) * self.recent_error + a * rel
        g, kind = self.forgetting, int(sample.shape.tokens == 0)
        self._gram[kind] = g * self._gram[kind] + weight * np.outer(x, x)
        self._rhs[kind] = g * self._rhs[kind] + weight * x * actual
        if sample.shape.tokens > 0:  # the speed pieces run at (decode-only ticks fit their own terms)
            seeded = float(x @ self.seed)
            self._sp, self._pp = g * self._sp + weight * seeded * actual, g * self._pp + weight * seeded * seeded
        self.theta = solve_nonnegative(self._gram.sum(axis=0), self._rhs.sum(axis=0), self.prior(), self.ridge)
        self.num_observed += 1
        self.num_outliers += weight < 1.0
        if sample.shape.tokens > 0 and len(self._lengths) < 64:
            self._lengths.add(sample.shape.tokens)
        return weight

    def speed_factor(self) -> float:
        """Measured over seed-predicted time of the recent ticks (least squares through 0)."""
        return self._sp / self._pp if self._pp > 0 else 1.0

    def prior(self) -> np.ndarray:
        # A slower or busier device scales every cost alike, so what the recent ticks do not
        # measure follows the seed scaled by the measured speed, not the seed as calibrated.
        return self.speed_factor() * self.seed

    def _huber_weight(self, predicted: float, actual: float) -> float:
        # The residual scale follows the recent error, so a lasting change (costs double)
        # regains full weight within a few ticks while a lone spike barely moves the fit.
        scale = max(self.recent_error or 0.0, self.min_error) * max(predicted, 1e-9)
        residual = abs(actual - predicted)
        return 1.0 if residual <= self.huber * scale else self.huber * scale / residual

    def coefficients(self) -> tuple[tuple[str, float], ...]:
        """The fit in seconds per natural unit (per token, per token*context, ...)."""
        return tuple(zip(FEATURES, (self.theta / _SCALE).tolist()))

    def stats(self) -> CostModelStats:
        return CostModelStats(self.coefficients(), self.recent_error, self.speed_factor(),
                              self.num_calibration_samples, self.num_observed, self.num_outliers, self.ready)
