"""The chunk-policy interface: what the scheduler asks every tick, and what every policy reads.

A policy answers `chunk_for(TickState)` each time a prefill piece is planned and hears
`observe(TickSample)` after each tick. Two implement it: `fixed.PrefillChunkPolicy`
(alone/contended, learns nothing) and `budget.BudgetChunkPolicy` (`--itl-budget-ms`).
A new policy is one class with these members; `budget_policy` (chunking/__init__.py) builds the
budget one from a calibration, so the engine names no concrete policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .budget import BudgetStats
    from .cost_model import TickSample


def check_count(name: str, value: object) -> int:
    """`value` when it is a non-negative int (not a bool); else ValueError naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer (got {value!r})")
    return value


@dataclass(frozen=True, slots=True)
class TickState:
    """What the scheduler knows when it plans the prefill piece of this tick."""

    num_decoding: int = 0  # rows of this tick's decode step (each verified draft token one more)
    decode_context: int = 0  # KV positions over those sequences
    prefill_context: int = 0  # the prefilling prompt's cursor: tokens already in its KV
    remaining: Optional[int] = None  # prompt tokens left to prefill (None: unknown)


@runtime_checkable  # the policies implement it structurally; the tests check they do
class ChunkPolicy(Protocol):
    """The prefill chunk as a function of the tick's state.

    `observe` is a member of every policy, not an optional one: the engine calls it after
    every tick without asking what kind of policy it holds, and a fixed policy ignores it."""

    @property
    def alone(self) -> int:
        """The largest chunk the policy may pick (the boundary-segment bound and calibration grid)."""
        ...

    @property
    def contended(self) -> int:
        """The chunk next to decoding sequences (the last one chosen, for a learning policy)."""
        ...

    def chunk_for(self, state: TickState) -> int:
        """The chunk for this tick's piece (0: the whole rest); read every time a piece is planned."""
        ...

    def observe(self, sample: "TickSample") -> None:
        """One measured tick (its shape and wall time), after it ran."""
        ...

    def fuses(self, runner_limit: int) -> bool:
        """Whether its contended pieces may go out with the decode step as one record, to a runner
        that runs a piece of up to `runner_limit` tokens in the same forward (engine/runner/tick.py)."""
        ...

    def describe(self) -> str:
        """One line for the startup log."""
        ...

    def stats(self) -> Optional["BudgetStats"]:
        """What /metrics reports about the policy; None when it has nothing to report."""
        ...
