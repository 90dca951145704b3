"""Verifying prompt-lookup drafts inside the decode step (docs/SPECULATIVE.md).

Each row forwards [last token, its draft, padding up to the widest draft] in one batched
forward over the decode batch's BatchKVCache; a row keeps the longest prefix of its draft
that the target itself would have produced, plus the target's token after it. The KV of
the rejected (and padded) positions is rolled back: the whole batch is trimmed by the
smallest excess, and rows with more are shifted right into their left padding (mlx-lm's
own `finalize` of right padding), so every row stays one contiguous run ending at `_idx`.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from .sampling import SequenceSampler


def verify_inputs(last: Sequence[int], drafts: Sequence[tuple[int, ...]]) -> mx.array:
    """The (B, W) verify input: each row's last token and draft, right-padded with its last token."""
    width = 1 + max(len(d) for d in drafts)
    rows = [[t, *d] + [t] * (width - 1 - len(d)) for t, d in zip(last, drafts)]
    return mx.array(rows)


def verify_row(logits: mx.array, draft: tuple[int, ...], sampler: SequenceSampler) -> list[int]:
    """The tokens one row emits from its (W, V) verify logits: accepted draft tokens, then the target's."""
    if sampler.greedy and not sampler.needs_processing:
        ids = mx.argmax(logits[: len(draft) + 1], axis=-1).tolist()
        run = [ids[0]]
        for position, token in enumerate(draft):
            if run[-1] != token:
                break
            run.append(ids[position + 1])
        return run
    run: list[int] = []
    for position in range(len(draft) + 1):  # processors read the tokens accepted before each position
        proposed = draft[position] if position < len(draft) else None
        token, accepted = sampler.choose(sampler.process(logits[position : position + 1]), proposed)
        sampler.accept(token)
        run.append(token)
        if not accepted:
            break
    return run


def roll_back(batch: list, width: int, kept: Sequence[int]) -> None:
    """Drop each row's last `width - kept[i]` KV positions (the rejected and padded ones)."""
    excess = [width - k for k in kept]
    low = min(excess)
    shift = [e - low for e in excess]
    for layer in batch:
        if low:
            layer.trim(low)
        if any(shift):
            layer.prepare(right_padding=shift)
            layer.finalize()
