"""DRY ("don't repeat yourself"), llama.cpp's repetition sampler (src/llama-sampler.cpp, after koboldcpp's): a
token that would extend a sequence already seen in the last N tokens, beyond the allowed length, has its logit
lowered by multiplier * base^(length - allowed); sequence breakers (processed once per vocabulary: breakers.py
in the server) cut how far back a repeat may reach. The history is the prompt and then every token chosen, as
llama-server's sampler is fed; the penalties go onto the logits before the rest of the chain."""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

FLOAT_MAX_LOG = 88.7228391  # llama.cpp's bound on base^exponent


class Dry:
    """One sequence's DRY state: its last `penalty_last_n` tokens and its breakers (head token -> tails)."""

    def __init__(self, multiplier: float, base: float, allowed: int, last_n: int,
                 breakers: Sequence[tuple[int, tuple[int, ...]]], history: Sequence[int] = ()):
        self.multiplier, self.base, self.allowed = multiplier, base, allowed
        self.last: deque[int] = deque(history[-last_n:] if last_n else (), maxlen=last_n)
        self.breakers: dict[int, list[tuple[int, ...]]] = {}
        for head, tail in breakers:
            self.breakers.setdefault(head, []).append(tuple(tail))
        self.max_exponent = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0

    def accept(self, token: int) -> None:
        self.last.append(token)

    def extend(self, tokens: Sequence[int]) -> None:
        self.last.extend(tokens)

    def penalties(self) -> dict[int, float]:
        """token -> the amount its logit goes down now (llama_sampler_dry_apply's steps 1-4)."""
        tokens = list(self.last)
        n = len(tokens)
        if n <= self.allowed:
            return {}
        rat = lambda i: tokens[n - 1 - i]  # noqa: E731 - llama.cpp's ring_buffer::rat: i-th from the end
        rep_limit = self._rep_limit(rat, n)
        if rep_limit < self.allowed:
            return {}
        counts = _repeat_counts(rat, n, rep_limit)
        longest: dict[int, int] = {}
        for i in range(n - 1):
            if counts[i] >= self.allowed:
                token = rat(n - 2 - i)
                if longest.get(token, -1) < counts[i]:
                    longest[token] = counts[i]
        out = {}
        for token, length in longest.items():
            if () in self.breakers.get(token, ()):  # a single-token breaker is never penalized
                continue
            exponent = length - self.allowed
            if self.max_exponent > 0 and exponent > self.max_exponent:
                exponent = self.max_exponent
            out[token] = self.multiplier * self.base ** exponent
        return out

    def _rep_limit(self, rat, n: int) -> int:
        """Step 1: the nearest restart sequence (a breaker) bounds how long a repeat may be."""
        for i in range(n):
            tails = self.breakers.get(rat(i))
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                size = len(tail)
                if longest < size <= i and all(tail[k] == rat(i - k - 1) for k in range(size)):
                    longest = size
            if longest >= 0:
                return i - longest
        return n


def _repeat_counts(rat, n: int, rep_limit: int) -> list[int]:
    """Step 2: the reverse Z-algorithm: counts[n - 1 - k] is how far the suffix repeats ending k tokens back."""
    counts = [0] * n
    last, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            counts[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p, right = k - lt, rt - k + 1
            if counts[last - p] < right:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    return counts
