"""Engine logprobs -> OpenAI's two shapes: chat's `logprobs.content` entries and the legacy
completions arrays (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

A token's text is its exact bytes (the `bytes` field) decoded as UTF-8; a token that is not
valid UTF-8 alone (a character split over tokens) is written as OpenAI does, `bytes:\\xe2\\x80`.
`text_offset` counts characters of the returned text, a token inside a character pointing
at that character.
"""

from __future__ import annotations

import codecs
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...engine import TokenLogprobs

# What OpenAI reports for a token it deems impossible; JSON has no -Infinity.
FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


class TokenPieces:
    """A token id's exact bytes: llguidance's tables when built (the grammar compiler's), else
    the tokenizer's decode of the lone token."""

    def __init__(self, tokenizer: Any, compiler: Any = None):
        self._decode_bytes: Optional[Callable[[list[int]], bytes]] = None
        if compiler is not None:
            try:
                self._decode_bytes = compiler.ll_tokenizer.decode_bytes  # built once per model (~0.5 s)
            except Exception:  # noqa: BLE001 - e.g. not a `tokenizers` tokenizer: decode instead
                self._decode_bytes = None
        self._tokenizer = tokenizer

    def bytes_of(self, token: int) -> bytes:
        if self._decode_bytes is not None:
            return self._decode_bytes([token])
        return self._tokenizer.decode([token]).encode("utf-8")


def token_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@dataclass(frozen=True, slots=True)
class Alternative:
    token: str
    bytes: list[int]
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenRow:
    """One token's entry; `logprob` and `top` are None for the prompt's first token (echo)."""

    token: str
    bytes: list[int]
    logprob: Optional[float]
    top: Optional[list[Alternative]]
    offset: int


class RowMaker:
    """Builds rows for consecutive tokens of one text, counting characters from `start`."""

    def __init__(self, pieces: TokenPieces, start: int = 0):
        self._pieces = pieces
        self._chars = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _alternative(self, token: int, logprob: float) -> Alternative:
        raw = self._pieces.bytes_of(token)
        return Alternative(token_text(raw), list(raw), _finite(logprob))

    def row(self, lp: Optional[TokenLogprobs], token_id: Optional[int] = None) -> TokenRow:
        token = lp.token_id if lp is not None else token_id
        raw = self._pieces.bytes_of(token)
        offset = self._chars
        self._chars += len(self._decoder.decode(raw))
        if lp is None:
            return TokenRow(token_text(raw), list(raw), None, None, offset)
        top = [self._alternative(t, v) for t, v in lp.top]
        return TokenRow(token_text(raw), list(raw), _finite(lp.logprob), top, offset)


def chat_logprobs(rows: list[TokenRow]) -> dict:
    """`choices[].logprobs` of a chat response or chunk."""
    content = [{
        "token": r.token, "logprob": r.logprob, "bytes": r.bytes,
        "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": a.bytes} for a in r.top or ()],
    } for r in rows]
    return {"content": content, "refusal": None}


def _legacy_top(row: TokenRow) -> Optional[dict[str, float]]:
    # The legacy API always includes the sampled token, so a position has up to N + 1 entries.
    if row.top is None:
        return None
    top = {a.token: a.logprob for a in row.top}
    top.setdefault(row.token, row.logprob)
    return top


def legacy_logprobs(rows: list[TokenRow]) -> dict:
    """`choices[].logprobs` of a completions response or chunk."""
    return {
        "tokens": [r.token for r in rows],
        "token_logprobs": [r.logprob for r in rows],
        "top_logprobs": [_legacy_top(r) for r in rows],
        "text_offset": [r.offset for r in rows],
    }
