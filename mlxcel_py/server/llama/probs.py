"""llama-server's `completion_probabilities` (n_probs on /completion): per generated token
{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}, or with
`post_sampling_probs` {..., prob, top_probs: [{..., prob}]} (llama.cpp server-task.cpp,
completion_token_output::probs_vector_to_json).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from ...engine import TokenLogprobs
from ..generation.logprobs import TokenPieces

LOWEST = -3.4028234663852886e38  # float's lowest: llama-server's logprob of a probability 0


def utf8_text(raw: bytes) -> str:
    """A token's text as llama-server writes it: a multi-byte character cut off at the end is
    dropped (its validate_utf8), other invalid bytes replaced."""
    for i in range(1, min(4, len(raw)) + 1):  # as validate_utf8: the last 4 bytes, nearest first
        lead = raw[-i]
        width = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else 4 if lead & 0xF8 == 0xF0 else 0
        if i < width:
            return raw[:-i].decode("utf-8", errors="replace")
    return raw.decode("utf-8", errors="replace")


class ProbsMaker:
    """Entries of `completion_probabilities` from the engine's TokenLogprobs records."""

    def __init__(self, pieces: TokenPieces, post_sampling: bool):
        self._pieces = pieces
        self._post = post_sampling
        self._key = "prob" if post_sampling else "logprob"

    def _value(self, logprob: float) -> float:
        if self._post:
            return math.exp(logprob)
        return logprob if math.isfinite(logprob) else LOWEST

    def _piece(self, token: int, value: float) -> dict:
        raw = self._pieces.bytes_of(token)
        return {"id": token, "token": utf8_text(raw), "bytes": list(raw), self._key: self._value(value)}

    def entry(self, lp: TokenLogprobs) -> dict:
        top = [self._piece(t, v) for t, v in lp.top]
        return {**self._piece(lp.token_id, lp.logprob), "top_probs" if self._post else "top_logprobs": top}

    def entries(self, records: Iterable[Optional[TokenLogprobs]]) -> list[dict]:
        return [self.entry(lp) for lp in records if lp is not None]
