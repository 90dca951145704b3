"""Sampling helpers only the tests use (the engine samples through `sample_step`)."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from mlxcel_py.engine.core.events import TokenLogprobs
from mlxcel_py.engine.runner.constraints import ConstraintCompiler
from mlxcel_py.engine.runner.logits import token_logprobs, top_alternatives
from mlxcel_py.engine.runner.sampling import SequenceSampler, mask_constrained


def sample_rows(logits: mx.array, samplers: list[SequenceSampler],
                compiler: Optional[ConstraintCompiler] = None) -> mx.array:
    """Sample a (B, V) batch, one sampler per row, without advancing the samplers; one argmax when all are greedy."""
    if all(s.greedy and not s.needs_processing for s in samplers):
        return mx.argmax(logits, axis=-1)
    logits = mask_constrained(logits, samplers, compiler)
    tokens = []
    for i, sampler in enumerate(samplers):
        row = sampler.process(logits[i : i + 1])
        if not sampler.greedy or sampler.params.logprobs:
            row = row - mx.logsumexp(row, axis=-1, keepdims=True)
        tokens.append(sampler.sample(row))
    return mx.concatenate(tokens, axis=0)


def logprobs_of(logits: mx.array, token: int, num: int) -> TokenLogprobs:
    """Logprob of `token` and the top `num` (0-20) alternatives, from a processed (1, V) logits row."""
    row = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if num == 0:
        return token_logprobs(token, row[0, token].item(), None, None)
    ids, values = top_alternatives(row, num)
    chosen = row[0, token]
    mx.eval(ids, values, chosen)
    return token_logprobs(token, chosen.item(), ids[0].tolist(), values[0].tolist())
