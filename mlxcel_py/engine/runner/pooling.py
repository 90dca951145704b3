"""Embedding sequences: the final normed hidden states, pooled across a prompt's prefill pieces.

The runner keeps one `Pooler` per embedding sequence; mean pooling carries the sum and the
count across pieces, so a chunked prefill pools what an unchunked one does.
"""

from __future__ import annotations

from typing import Callable, Optional

import mlx.core as mx
import numpy as np

HiddenFn = Callable[..., mx.array]  # (tokens (1, T), cache=...) -> (1, T, hidden), after the final norm


def hidden_fn(model) -> Optional[HiddenFn]:
    """The model's inner module (the decoder stack and its final norm, before the LM head); None
    when the model has none. mlx-lm's llama, qwen2, qwen3, gemma3_text and phi3 all name it `model`."""
    inner = getattr(model, "model", None)
    if inner is None and hasattr(model, "language_model"):  # multimodal wrappers
        inner = getattr(model.language_model, "model", None)
    return inner if callable(inner) else None


class Pooler:
    """The running pool of one embedding sequence; `add` one piece's hidden states (T, hidden)."""

    def __init__(self, mode: str, first: bool = False):
        self.mode = "cls" if mode == "rank" and first else mode  # rank over an encoder: its [CLS] position
        self.ranks = mode == "rank"
        self.count = 0
        self.acc: Optional[mx.array] = None  # mean: the sum; cls: the first row; last, rank: the latest row
        self.rows: list[mx.array] = []  # none: every row

    def add(self, hidden: mx.array) -> None:
        hidden = hidden.astype(mx.float32)
        if self.mode == "mean":
            total = hidden.sum(axis=0)
            self.acc = total if self.acc is None else self.acc + total
        elif self.mode == "cls":
            self.acc = hidden[0] if self.acc is None else self.acc
        elif self.mode in ("last", "rank"):  # rank: a causal reranker's head reads the last position
            self.acc = hidden[-1]
        else:
            self.rows.append(hidden)
        self.count += hidden.shape[0]

    def arrays(self) -> list[mx.array]:
        """What to evaluate with a piece's KV, so no piece's graph outlives it."""
        return self.rows[-1:] if self.mode == "none" else ([self.acc] if self.acc is not None else [])

    def result(self) -> np.ndarray:
        """The pooled vector (hidden,), or (tokens, hidden) for "none"; float32, not normalised."""
        if self.mode == "none":
            out = mx.concatenate(self.rows, axis=0)
        elif self.mode == "mean":
            out = self.acc / self.count
        else:
            out = self.acc
        return np.array(out, dtype=np.float32)
