"""Logits processors (on mlx-lm's), the grammar mask applied to logits, and logprobs.

The order, per row: repetition penalty (prompt + generated) -> logit_bias -> presence and
frequency penalties (generated only) -> grammar mask -> log-softmax. Logprobs are read there,
before temperature and top-k/top-p/min-p, so they do not depend on the sampler settings
(unless `post_sampling_probs` asks for the distribution after them: sampling.py)."""

from __future__ import annotations

from typing import Callable, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_logits_processors, make_repetition_penalty

from ..core.events import TokenLogprobs
from ..core.request import SamplingParams

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def generated_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """logit_bias, presence and frequency penalties; each is called with the generated tokens only.

    mlx-lm's penalties look back over a window; a window of max_tokens covers every generated
    token, which is OpenAI's semantics."""
    window = params.max_tokens
    return make_logits_processors(
        logit_bias=dict(params.logit_bias) or None,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=window,
    )


def repetition_processor(params: SamplingParams) -> Optional[LogitsProcessor]:
    if params.repetition_penalty == 1.0:
        return None
    return make_repetition_penalty(params.repetition_penalty, params.repetition_context)


def apply_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """-inf where a (B, words) int32 bitmask forbids a token, for (B, V) logits.

    Unpacked in numpy: measured cheaper and steadier on the CPU than the same shifts in MLX."""
    vocab = logits.shape[-1]
    bits = np.unpackbits(bitmask.view(np.uint8), axis=-1, bitorder="little")[:, :vocab]
    return mx.where(mx.array(bits.astype(np.bool_)), logits, mx.array(-mx.inf, dtype=logits.dtype))


def top_alternatives(logprobs: mx.array, num: int) -> tuple[mx.array, mx.array]:
    """Lazy (ids, values) of the `num` largest entries of a (1, V) row, in no particular order."""
    ids = mx.argpartition(-logprobs, kth=num - 1, axis=-1)[..., :num]
    return ids, mx.take_along_axis(logprobs, ids, axis=-1)


def token_logprobs(token: int, chosen: float, ids: Optional[list[int]], values: Optional[list[float]]) -> TokenLogprobs:
    """The record for one sampled token; alternatives best first (ties by token id), masked ones left out."""
    top: tuple[tuple[int, float], ...] = ()
    if ids is not None and values is not None:
        pairs = [(i, v) for i, v in zip(ids, values) if v != -np.inf]
        top = tuple(sorted(pairs, key=lambda p: (-p[1], p[0])))
    return TokenLogprobs(int(token), float(chosen), top)


def sequence_logprobs(logits: mx.array, tokens: list[int], num: int) -> list[TokenLogprobs]:
    """Each token's logprob under the (L, V) raw logits row before it, with `num` alternatives (echo)."""
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    targets = mx.array(tokens, dtype=mx.int32)[:, None]
    chosen = mx.take_along_axis(rows, targets, axis=-1)[:, 0]
    if num:
        ids, values = top_alternatives(rows, num)
        mx.eval(chosen, ids, values)
        ids_list, values_list = ids.tolist(), values.tolist()
    else:
        mx.eval(chosen)
        ids_list = values_list = [None] * len(tokens)
    return [token_logprobs(t, c, i, v) for t, c, i, v in zip(tokens, chosen.tolist(), ids_list, values_list)]
