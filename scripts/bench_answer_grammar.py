"""What an answer-only grammar costs per thinking token: llguidance's own way (one grammar whose
thinking is `<[^END]>* <[END]>`, masked every token) against our two-phase matcher (no mask
until the end marker; engine/runner/sampling.py). Prints microseconds per token.

A byte-level BPE of VOCAB tokens is trained on the Python standard library's sources (no
download), with <think> and </think> added. Usage: python scripts/bench_answer_grammar.py [VOCAB]"""

from __future__ import annotations

import json
import sys
import sysconfig
import time
from pathlib import Path

import llguidance
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
          "required": ["city", "zip"]}
STEPS = 200


def _tokenizer(vocab: int) -> tuple[str, int, int]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    tok.train([str(f) for f in files], trainer)
    tok.add_tokens(["<think>", "</think>"])
    return tok.to_str(), tok.token_to_id("</think>"), tok.get_vocab_size()


def _per_token(matcher: llguidance.LLMatcher, words: int, tokens: list[int]) -> float:
    row = np.empty(words, dtype=np.int32)
    start = time.perf_counter()
    for token in tokens:
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if not matcher.consume_token(token):
            raise RuntimeError(matcher.get_error())
    return (time.perf_counter() - start) / len(tokens) * 1e6


def main(vocab: int = 32000) -> None:
    text, end, size = _tokenizer(vocab)
    ll = llguidance.LLTokenizer(text, n_vocab=size, eos_token=[0])
    words = (size + 31) // 32
    thinking = [int(t) for t in np.random.default_rng(0).integers(300, end - 1, STEPS)]
    body = json.dumps(SCHEMA)
    one = llguidance.LLMatcher(ll, f"start: <[^{end}]>* <[{end}]> answer\nanswer: %json {body}\n", log_level=0)
    answer = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA), log_level=0)
    if one.is_error() or answer.is_error():
        raise SystemExit(one.get_error() or answer.get_error())
    print(f"vocabulary {size} tokens, {STEPS} thinking tokens")
    print(f"llguidance one grammar (<[^END]>* <[END]> answer): {_per_token(one, words, thinking):.1f} us/token")
    print("two-phase (no mask while thinking):                  0.0 us/token")
    probe = ll.tokenize_str('{"city": "Paris", "zip": 75001}')
    print(f"answer tokens, either way: {_per_token(answer, words, probe):.1f} us/token")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
