"""How a prompt is cut into prefill forwards.

Pure arithmetic, no MLX. `next_piece` is a function of (prompt_len, adopted, boundary,
cursor, chunk): the scheduler asks it for one piece per tick with the chunk in force
*now*, so a prefill resumes at any cursor and a chunk change re-cuts from the cursor.
Iterating it at a fixed chunk gives the whole plan, which is how the tests compare a
resumed plan, a cache hit and a cold miss as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .policy import check_count


@dataclass(frozen=True, slots=True)
class Piece:
    """One prefill forward over prompt positions [start, end)."""

    start: int
    end: int
    ends_at_boundary: bool  # the history-boundary segment: one unchunked forward, snapshotted
    terminal: bool  # the prompt's last piece: the first token is sampled after it

    @property
    def length(self) -> int:
        return self.end - self.start


def _split(prompt_len: int, adopted: int, boundary: Optional[int]) -> tuple[int, Optional[int]]:
    """The clamped adopted offset, and the boundary when it lies strictly inside (adopted, prompt_len)."""
    check_count("prompt_len", prompt_len)
    adopted = min(check_count("adopted", adopted), prompt_len)
    if boundary is None or not adopted < check_count("boundary", boundary) < prompt_len:
        return adopted, None
    return adopted, boundary


def next_piece(prompt_len: int, adopted: int, boundary: Optional[int], cursor: int, chunk: int,
               unsplit: tuple[tuple[int, int], ...] = ()) -> Optional[Piece]:
    """The piece a prefill runs next from `cursor`; None once the prompt is in the KV.

    From the adopted prefix, the history-boundary segment (when it lies inside the rest)
    is one piece, so it can be snapshotted; every other piece is at most `chunk` tokens
    (0: the whole rest). A cursor below the adopted prefix starts at it. No piece ends inside a
    range of `unsplit` (an image whose positions attend each other): the piece stops before it,
    or, when it starts at or in the range, runs to its end whatever the chunk.
    """
    check_count("chunk", chunk)
    adopted, split = _split(prompt_len, adopted, boundary)
    start = max(check_count("cursor", cursor), adopted)
    if start > prompt_len:
        raise ValueError(f"cursor {cursor} is past the end of the {prompt_len}-token prompt")
    if split is not None and start < split:
        if start > adopted:
            raise ValueError(
                f"cursor {cursor} is inside the history-boundary segment [{adopted}, {split}), which runs as one piece"
            )
        return Piece(start, split, True, False)
    if start == prompt_len:
        return None
    end = prompt_len if chunk == 0 else min(start + chunk, prompt_len)
    for lo, hi in unsplit:
        if lo < end < hi:
            end = lo if lo > start else min(hi, prompt_len)
    return Piece(start, end, False, end == prompt_len)
