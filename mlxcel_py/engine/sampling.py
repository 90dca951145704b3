"""Per-sequence samplers and logits processors, built on mlx-lm's sampling functions."""

from __future__ import annotations

from typing import Callable, Optional

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_repetition_penalty

from .request import SamplingParams

Sampler = Callable[[mx.array], mx.array]


class SequenceSampler:
    """Samples one row of log-probabilities; seeded requests own their RNG key."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.greedy = params.greedy
        self._key: Optional[mx.array] = mx.random.key(params.seed) if params.seed is not None else None
        self._penalty = (
            make_repetition_penalty(params.repetition_penalty, params.repetition_context)
            if params.repetition_penalty != 1.0
            else None
        )
        self.history: list[int] = []  # tokens the repetition penalty looks back over

    @property
    def needs_processing(self) -> bool:
        return self._penalty is not None

    def process(self, logits: mx.array) -> mx.array:
        """Apply logits processors to a (1, V) row."""
        if self._penalty is None or not self.history:
            return logits
        context = mx.array(self.history[-self.params.repetition_context :])
        return self._penalty(context, logits)

    def sample(self, logprobs: mx.array) -> mx.array:
        """Sample a (1, V) row of log-probabilities; returns a (1,) token array."""
        p = self.params
        if self.greedy:
            return mx.argmax(logprobs, axis=-1)
        if 0.0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        if 0 < p.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, p.top_k)
        scaled = logprobs * (1.0 / p.temperature)
        if self._key is None:
            return mx.random.categorical(scaled)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(scaled, key=sub)


def sample_rows(logits: mx.array, samplers: list[SequenceSampler]) -> mx.array:
    """Sample a (B, V) batch of logits, one sampler per row; one argmax when all are greedy."""
    if all(s.greedy and not s.needs_processing for s in samplers):
        return mx.argmax(logits, axis=-1)
    rows = []
    for i, sampler in enumerate(samplers):
        row = sampler.process(logits[i : i + 1])
        row = row - mx.logsumexp(row, axis=-1, keepdims=True)
        rows.append(sampler.sample(row))
    return mx.concatenate(rows, axis=0)
