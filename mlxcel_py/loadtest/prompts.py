"""Prompts of an exact token length, made of unique random words so no prompt cache can hit.

The count is the tokenizer's `encode(text)` with its default special tokens, which is what a
server tokenizing a `/v1/completions` string prefills."""

from __future__ import annotations

import random
import string
import zlib
from typing import Callable, Optional, Sequence

from ..errors import ConfigError

Encode = Callable[[str], Sequence[int]]
# Short pieces that are one token in most BPE vocabularies; the first that adds exactly one
# token is appended, so the prompt can reach any count.
FILLERS = (" a", " the", ".", ",", " 1", "1", " x", "\n", " ")


def random_words(rng: random.Random, num_words: int) -> list[str]:
    """Lowercase nonsense words of 3..9 letters."""
    letters = string.ascii_lowercase
    return ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(num_words)]


def build_prompt(encode: Encode, num_tokens: int, seed: int) -> str:
    """Text whose `encode` is exactly `num_tokens` long; a different seed gives different words.

    Raises ConfigError when no filler can reach the count (a vocabulary without them)."""
    if num_tokens < 1:
        raise ConfigError(f"prompt length must be at least 1 token (got {num_tokens})", flag="--prompt-tokens")
    rng = random.Random(seed)
    text = _bulk(encode, num_tokens, rng)
    count = len(encode(text))
    while count < num_tokens:
        step = _one_more(encode, text, count)
        if step is None:
            raise ConfigError(f"cannot extend the prompt from {count} to {num_tokens} tokens one at a time",
                              flag="--prompt-tokens")
        text += step
        count += 1
    if count != num_tokens:
        raise ConfigError(f"a {num_tokens}-token prompt is too short for this tokenizer's special tokens",
                          flag="--prompt-tokens")
    return text


def _bulk(encode: Encode, num_tokens: int, rng: random.Random) -> str:
    """Whole random words, added in shrinking batches, while the count stays within target."""
    words: list[str] = []
    count = len(encode(""))
    batch, misses = max(1, (num_tokens - count) // 4), 0
    while count < num_tokens and misses < 8:  # a few single-word tries: a shorter word may fit
        trial = words + random_words(rng, batch)
        trial_count = len(encode(" ".join(trial)))
        if trial_count <= num_tokens:
            words, count = trial, trial_count
            batch = max(1, (num_tokens - count) // 4)
        elif batch > 1:
            batch //= 2
        else:
            misses += 1
    return " ".join(words)


def _one_more(encode: Encode, text: str, count: int) -> Optional[str]:
    for filler in FILLERS:
        if text == "" and filler.isspace():
            continue
        if len(encode(text + filler)) == count + 1:
            return filler
    return None


def round_seed(base: int, round_index: int, role: str, index: int = 0) -> int:
    """A seed that differs per round, role ("stream", "admit", "warmup", ...) and index."""
    # Not hash(): str hashes are salted per process, and every arm must get the same prompts.
    return zlib.crc32(repr((base, round_index, role, index)).encode())


def load_encoder(model: Optional[str]) -> tuple[Encode, frozenset[int]]:
    """(encode, EOS ids) of a model's tokenizer without loading its weights.

    `model` is a GGUF file, an mlx-lm directory or a Hugging Face id; None is the bundled default model."""
    from ..models import load_tokenizer

    tokenizer, eos = load_tokenizer(model)
    return tokenizer.encode, eos
