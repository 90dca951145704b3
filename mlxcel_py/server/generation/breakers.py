"""DRY's sequence breakers as tokens, as llama.cpp processes them (get_overlapping_token_sequences): for each
breaker string, every token whose text holds it is a breaker by itself, and every token whose text ends with a
prefix of it is the head of a breaker whose tail is the rest of the string, tokenized (at most 20 tokens).
Computed once per vocabulary and breaker set (a pass over every token's text)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ...models.vocab import hf_tokenizer, plain_encoder

MAX_CHARS = 40  # llama.cpp truncates a breaker to this many characters
MAX_TAIL = 20  # and its tail to this many tokens

_pieces: "weakref.WeakKeyDictionary[Any, list[str]]" = weakref.WeakKeyDictionary()
_done: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], tuple]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def dry_breakers(tokenizer: Any, breakers: tuple[str, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(head token, tail tokens) pairs for `breakers` over the tokenizer's vocabulary."""
    hf = hf_tokenizer(tokenizer)
    with _lock:
        if breakers in _done.get(hf, {}):
            return _done[hf][breakers]
        pieces = _pieces.get(hf)
        if pieces is None:
            pieces = [hf.decode([i]) for i in range(len(hf))]
            _pieces[hf] = pieces
    encode = plain_encoder(hf)
    out: list[tuple[int, tuple[int, ...]]] = []
    for text in breakers:
        if text:
            out += _overlapping(pieces, text[:MAX_CHARS], encode)
    result = tuple(dict.fromkeys(out))
    with _lock:
        _done.setdefault(hf, {})[breakers] = result
    return result


def _overlapping(pieces: list[str], text: str, encode) -> list[tuple[int, tuple[int, ...]]]:
    found: list[tuple[int, tuple[int, ...]]] = []
    for token, word in enumerate(pieces):
        if text in word:
            found.append((token, ()))
            continue
        pos = word.find(text[0])
        while pos != -1:
            i = 1
            while i < len(text) and i + pos < len(word) and word[pos + i] == text[i]:
                i += 1
            if i == len(text) or i + pos >= len(word):  # the word ends inside the breaker: the rest is the tail
                tail = (token, tuple(encode(text[i:])[:MAX_TAIL]))
                if tail not in found:
                    found.append(tail)
            pos = word.find(text[0], pos + 1)
    return found
