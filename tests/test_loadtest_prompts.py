"""Prompts of exact token length: a whitespace tokenizer, a character tokenizer with a BOS,
and the tiny GGUF's byte-level BPE."""

from __future__ import annotations

import pytest

from mlxcel_py.loadtest.prompts import build_prompt, random_words, round_seed
from mlxcel_py.errors import ConfigError


def words(text: str) -> list[str]:
    return text.split()


def chars_with_bos(text: str) -> list[int]:
    return [1] + [ord(c) for c in text]


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_exact_count_whitespace(n):
    assert len(words(build_prompt(words, n, seed=n))) == n


@pytest.mark.parametrize("n", [2, 3, 50, 777])
def test_exact_count_with_bos(n):
    assert len(chars_with_bos(build_prompt(chars_with_bos, n, seed=3))) == n


def test_bos_only_is_too_short():
    with pytest.raises(ConfigError, match="too short"):
        build_prompt(lambda t: [1, 1] + list(t), 1, seed=0)
    with pytest.raises(ConfigError, match="at least 1"):
        build_prompt(words, 0, seed=0)


def test_seeds_give_different_prompts_and_the_same_seed_the_same():
    a, b = build_prompt(words, 200, seed=1), build_prompt(words, 200, seed=2)
    assert a != b and a.split()[:5] != b.split()[:5]
    assert build_prompt(words, 200, seed=1) == a


def test_round_seed_is_stable_and_distinct():
    seeds = {round_seed(0, r, role, i) for r in range(3) for role in ("stream", "admit") for i in range(4)}
    assert len(seeds) == 24 and round_seed(0, 1, "admit") == round_seed(0, 1, "admit")


def test_random_words_are_lowercase_letters():
    import random

    ws = random_words(random.Random(0), 100)
    assert all(w.isalpha() and w.islower() and 3 <= len(w) <= 9 for w in ws)


@pytest.mark.parametrize("n", [1, 33, 512, 2048])
def test_exact_count_tiny_gguf_tokenizer(n):
    from tiny import tiny_model

    tok = tiny_model().tokenizer
    assert len(tok.encode(build_prompt(tok.encode, n, seed=n))) == n
