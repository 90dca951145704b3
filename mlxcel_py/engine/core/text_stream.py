"""Incremental detokenization with stop strings held back until they can no longer match."""

from __future__ import annotations

from typing import Callable, Optional, Protocol


class Detokenizer(Protocol):
    """mlx-lm's streaming detokenizer interface."""

    def add_token(self, token: int) -> None: ...
    def finalize(self) -> None: ...

    @property
    def last_segment(self) -> str: ...


class TextStream:
    """Turns token ids into released text; reports when a stop string completes.

    Text that could be the start of a stop string is held back, so a client never
    sees part of a stop string that later matches.
    """

    def __init__(self, detokenizer: Detokenizer, stop: tuple[str, ...] = ()):
        self._detok = detokenizer
        self._stop = stop
        self._held = ""  # decoded but not yet released
        self.stopped = False
        self.matched: Optional[str] = None  # the stop string that ended the text, once one has

    def push(self, token: int) -> str:
        """Add one generated token; returns the text it releases ("" while held back)."""
        if self.stopped:
            return ""
        self._detok.add_token(token)
        return self._release(self._detok.last_segment)

    def finish(self) -> str:
        """Flush the detokenizer at the end; returns the remaining text."""
        if self.stopped:
            return ""
        self._detok.finalize()
        tail = self._release(self._detok.last_segment)
        if self.stopped:
            return tail
        tail, self._held = tail + self._held, ""
        return tail

    def _release(self, segment: str) -> str:
        self._held += segment
        if not self._stop:
            out, self._held = self._held, ""
            return out
        hit = _first_stop(self._held, self._stop)
        if hit is not None:
            cut, self.matched = hit
            self.stopped = True
            out, self._held = self._held[:cut], ""
            return out
        keep = _partial_stop_len(self._held, self._stop)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out


def _first_stop(text: str, stops: tuple[str, ...]) -> Optional[tuple[int, str]]:
    """Where the earliest stop string starts in `text`, and which one it is."""
    hits = [(i, s) for i, s in ((text.find(s), s) for s in stops) if i >= 0]
    return min(hits, key=lambda hit: hit[0]) if hits else None


def _partial_stop_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def stream_factory(tokenizer) -> Callable[[tuple[str, ...]], TextStream]:
    """A factory of per-request streams over an mlx-lm TokenizerWrapper."""

    def make(stop: tuple[str, ...]) -> TextStream:
        return TextStream(tokenizer.detokenizer, stop)

    return make
