"""How a prompt is cut into prefill forwards, and which chunk the scheduler uses.

Pure arithmetic, no MLX: `PrefillPlan` is a function of (prompt_len, adopted, boundary,
chunk, caps), so a resumed plan, a cache hit and a cold miss can be compared as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .budget import TickState
    from .cost_model import TickSample

# Alone: best single-stream TTFT. Contended: keeps live decode streams' ITL p95 low
# while a long prompt is admitted (measured: 128 ms at 2048 vs 56 ms at 512).
DEFAULT_PREFILL_CHUNK = 2048
CONTENDED_PREFILL_CHUNK = 512


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer (got {value!r})")
    return value


@dataclass(frozen=True, slots=True)
class PrefillChunkPolicy:
    """The prefill chunk as a function of scheduler state: alone vs. next to decoding sequences."""

    alone: int
    contended: int

    def __post_init__(self) -> None:
        _check_count("alone", self.alone)
        _check_count("contended", self.contended)

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
        """The chunk-policy interface the budget policy shares (engine/budget.py)."""
        return self.chunk(state.num_decoding > 0)

    def observe(self, sample: TickSample) -> None:
        """A fixed policy learns nothing from measured ticks."""

    def describe(self) -> str:
        """`alone=2048 contended=512`, or `explicit=N (alone and contended)` when pinned."""
        if self.alone == self.contended:
            return f"explicit={self.alone} (alone and contended)"
        return f"alone={self.alone} contended={self.contended}"


@dataclass(frozen=True, slots=True)
class PlanCaps:
    """What the model supports: multi-call prefill, padded prefill, token vs. embedding input."""

    chunked: bool = True
    padded: bool = False
    align: bool = False
    tile: int = 64
    token_input: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.tile, int) or isinstance(self.tile, bool) or self.tile < 1:
            raise ValueError(f"tile must be a positive integer (got {self.tile!r})")

    def chunking(self, chunk: int) -> bool:
        # Embedding inputs (precomputed, e.g. VLM) are never split.
        return chunk > 0 and self.chunked and self.token_input


@dataclass(frozen=True, slots=True)
class Piece:
    """One prefill forward over prompt positions [start, end); `num_pad` KV positions are trimmed after."""

    start: int
    end: int
    padded_len: int
    num_pad: int
    ends_at_boundary: bool
    terminal: bool

    @property
    def length(self) -> int:
        return self.end - self.start


def _piece(start: int, end: int, prompt_len: int, caps: PlanCaps, at_boundary: bool) -> Piece:
    length = end - start
    padded_len = length
    # The boundary segment is snapshotted by the prompt cache, so it must hold no pad.
    if caps.align and caps.padded and not at_boundary:
        padded_len = -(-length // caps.tile) * caps.tile
    return Piece(start, end, padded_len, padded_len - length, at_boundary, end == prompt_len)


def _cut(start: int, prompt_len: int, step: Optional[int], caps: PlanCaps) -> list[Piece]:
    """[start, prompt_len) in pieces of at most `step` from `start` (one piece when step is None)."""
    size = step if step else max(prompt_len - start, 1)
    return [_piece(s, min(s + size, prompt_len), prompt_len, caps, False) for s in range(start, prompt_len, size)]


def _prefix(prompt_len: int, adopted: int, boundary: Optional[int]) -> tuple[int, Optional[int]]:
    """The clamped adopted offset, and the boundary when it lies strictly inside (adopted, prompt_len)."""
    _check_count("prompt_len", prompt_len)
    adopted = min(_check_count("adopted", adopted), prompt_len)
    if boundary is None or not adopted < _check_count("boundary", boundary) < prompt_len:
        return adopted, None
    return adopted, boundary


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """The pieces one prefill forwards, from a cold start, a cache hit or a resumed cursor."""

    prompt_len: int
    _adopted: int
    _boundary: Optional[int]
    _chunk: Optional[int]
    _pieces: tuple[Piece, ...]

    @classmethod
    def with_prefix(
        cls, prompt_len: int, adopted: int, boundary: Optional[int], chunk: int, caps: PlanCaps
    ) -> PrefillPlan:
        """Plan [adopted, prompt_len): the boundary segment whole, then chunks of `chunk`.

        `adopted` (a prompt-cache hit) is clamped to prompt_len. A full hit leaves zero
        pieces; the engine adopts prompt_len - 1 instead so there is a token to sample from.
        """
        _check_count("chunk", chunk)
        adopted, split = _prefix(prompt_len, adopted, boundary)
        pieces = [] if split is None else [_piece(adopted, split, prompt_len, caps, True)]
        start = adopted if split is None else split
        step = chunk if caps.chunking(chunk) and prompt_len - start > chunk else None
        pieces += _cut(start, prompt_len, step, caps)
        return cls(prompt_len, adopted, split, step, tuple(pieces))

    @classmethod
    def resume_at(
        cls, prompt_len: int, adopted: int, boundary: Optional[int], cursor: int, chunk: int, caps: PlanCaps
    ) -> PrefillPlan:
        """Plan the rest of a prefill whose cursor may sit past the adopted prefix.

        With the chunk unchanged, the pieces equal with_prefix's from the cursor on; a
        changed chunk re-cuts from the cursor, so a policy switch never strands a prefill.
        cursor == prompt_len gives zero pieces. A continuation reports chunk() whenever
        chunking is possible, so its last piece still counts as a chunk for progress.
        """
        _check_count("chunk", chunk)
        adopted, split = _prefix(prompt_len, adopted, boundary)
        if _check_count("cursor", cursor) <= adopted:
            return cls.with_prefix(prompt_len, adopted, boundary, chunk, caps)
        if cursor > prompt_len:
            raise ValueError(f"cursor {cursor} is past the end of the {prompt_len}-token prompt")
        if split is not None and cursor < split:
            raise ValueError(
                f"cursor {cursor} is inside the history-boundary segment [{adopted}, {split}), "
                "which runs as one piece"
            )
        step = chunk if caps.chunking(chunk) else None
        return cls(prompt_len, adopted, split, step, tuple(_cut(cursor, prompt_len, step, caps)))

    def pieces(self) -> tuple[Piece, ...]:
        return self._pieces

    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.start, p.end) for p in self._pieces)

    def split_points(self) -> tuple[int, ...]:
        """Positions where this prefill can stop and resume: the starts of every piece after the first."""
        return tuple(p.start for p in self._pieces[1:])

    def piece_starting_at(self, cursor: int) -> Optional[Piece]:
        return next((p for p in self._pieces if p.start == cursor), None)

    def is_terminal(self, piece: Piece) -> bool:
        return piece.end == self.prompt_len

    def ends_at_boundary(self, piece: Piece) -> bool:
        return piece.ends_at_boundary

    def chunk(self) -> Optional[int]:
        """The chunk when this prefill is chunked (and so reports progress per piece), else None."""
        return self._chunk

    def adopted(self) -> int:
        return self._adopted

    def boundary(self) -> Optional[int]:
        """The history boundary when it splits the forwarded range, else None."""
        return self._boundary

    def forwarded_len(self) -> int:
        """Real prompt tokens the whole prefill forwards (pads excluded)."""
        return self.prompt_len - self._adopted

    def reproduces(self, cold: PrefillPlan) -> bool:
        """Whether this plan (a cache hit) forwards exactly the cold plan's pieces after its prefix.

        When true, the hit's KV and logits are bit-identical to the miss's.
        """
        if self.prompt_len != cold.prompt_len:
            return False
        if self._adopted != 0 and cold.piece_starting_at(self._adopted) is None:
            return False
        return self._pieces == tuple(p for p in cold._pieces if p.start >= self._adopted)
