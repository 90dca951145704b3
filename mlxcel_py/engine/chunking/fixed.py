"""The fixed prefill chunk: one size while nothing else decodes, another next to decoding sequences.

The default policy (`--prefill-chunk-size` pins both sizes); it implements `ChunkPolicy`
(chunking/policy.py) and learns nothing from measured ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .policy import TickState, check_count

if TYPE_CHECKING:
    from .budget import BudgetStats
    from .cost_model import TickSample

# Alone: best single-stream TTFT. Contended: keeps live decode streams' ITL p95 low
# while a long prompt is admitted (measured: 128 ms at 2048 vs 56 ms at 512).
DEFAULT_PREFILL_CHUNK = 2048
CONTENDED_PREFILL_CHUNK = 512


@dataclass(frozen=True, slots=True)
class PrefillChunkPolicy:
    """The prefill chunk as a function of scheduler state: alone vs. next to decoding sequences."""

    alone: int
    contended: int

    def __post_init__(self) -> None:
        check_count("alone", self.alone)
        check_count("contended", self.contended)

    @classmethod
    def resolve(cls, explicit: Optional[int]) -> PrefillChunkPolicy:
        """None gives {2048, 512}; an explicit n (0 included: no chunking) pins both states."""
        if explicit is None:
            return cls(DEFAULT_PREFILL_CHUNK, CONTENDED_PREFILL_CHUNK)
        return cls(explicit, explicit)

    def chunk(self, others_decoding: bool) -> int:
        """The chunk for the next piece; read every tick, since the state changes mid-prompt."""
        return self.contended if others_decoding else self.alone

    def chunk_for(self, state: TickState) -> int:
        return self.chunk(state.num_decoding > 0)

    def observe(self, sample: "TickSample") -> None:
        """A fixed policy learns nothing from measured ticks."""

    def fuses(self, runner_limit: int) -> bool:
        """A fixed contended chunk fuses when the runner's forward holds it."""
        return 0 < self.contended <= runner_limit

    def describe(self) -> str:
        """`alone=2048 contended=512`, or `explicit=N (alone and contended)` when pinned."""
        if self.alone == self.contended:
            return f"explicit={self.alone} (alone and contended)"
        return f"alone={self.alone} contended={self.contended}"

    def stats(self) -> Optional["BudgetStats"]:
        """Nothing to report: the chunks are the configured ones."""
        return None
