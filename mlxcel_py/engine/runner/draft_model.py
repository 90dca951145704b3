"""The draft model of speculative decoding (`--draft-model`): a second, smaller model with the
target's vocabulary whose greedy continuation the target verifies (docs/SPECULATIVE.md).

It mirrors the target's decode batch row for row (join, reorder, retire) in its own
BatchKVCache. Its KV lags the target's by each row's `pending` tokens: those the target took
in (decoded or accepted) that the draft has not seen yet. A step that drafts feeds every row
its pending tokens and last token in one padded forward, then greedy single-token steps, and
trims its own proposals back off, so the draft's KV only ever holds tokens the target kept.
A prompt-cache hit gives the draft nothing: it prefills the adopted prefix with the first piece;
a context shift of a row rebuilds the draft's row from the kept tokens.
On the CPU the steps go through the draft's own numba decode step (models/cpu/decoder.py), as the
target's do: mlx-lm's one-token forward costs several times more there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..core.step import Shift
from .shift import set_row
from .verify import roll_back

CATCH_UP = 32  # a row lagging this many tokens is fed in a step that does not draft


@dataclass(slots=True)
class _Prefill:
    cache: list
    pending: list[int] = field(default_factory=list)


class DraftModel:
    """Proposes greedy drafts for decode rows; every method runs on the engine thread."""

    def __init__(self, model, kernels: Optional[ContextManager[Any]] = None,
                 decode: Optional[Callable[[list[int], list], mx.array]] = None,
                 verify: Optional[Callable[[list[list[int]], list], mx.array]] = None):
        self.model = model
        self._kernels = kernels if kernels is not None else contextlib.nullcontext()
        self._decode_fn, self._verify_fn = decode, verify  # the draft's CPU decode step; None: mlx-lm
        self._prefills: dict[int, _Prefill] = {}
        self._rows: list[int] = []
        self._pending: dict[int, list[int]] = {}
        self._batch: Optional[list] = None

    # -- prefill ----------------------------------------------------------------------------
    def begin(self, seq_id: int, history: Sequence[int]) -> None:
        """A new sequence; `history`: the prompt prefix the target adopted from its prompt cache."""
        self._prefills[seq_id] = _Prefill(make_prompt_cache(self.model), list(history))

    def prefill(self, seq_id: int, tokens: Sequence[int], terminal: bool) -> None:
        """Feed one piece of the prompt; after the terminal piece the row joins the draft batch."""
        state = self._prefills[seq_id]
        feed = state.pending + list(tokens)
        with self._kernels:
            self._inner(mx.array(feed)[None], state.cache)
        mx.eval([c.state for c in state.cache])
        state.pending = []
        if terminal:
            rows = [layer.merge([layer]) for layer in state.cache]
            del self._prefills[seq_id]
            if self._batch is None:
                self._batch = rows
            else:
                for batch_layer, row in zip(self._batch, rows):
                    batch_layer.extend(row)
            self._rows.append(seq_id)
            self._pending[seq_id] = []

    def _forward_rows(self, rows: list[list[int]]) -> mx.array:
        """(B, W, V) logits of equal-width rows over the draft batch, through the fast path when there is one."""
        if self._verify_fn is not None:
            return self._verify_fn(rows, self._batch)
        return self.model(mx.array(rows), cache=self._batch)

    def _step(self, tokens: list[int]) -> mx.array:
        """(B, V) logits of one token per row."""
        if self._decode_fn is not None:
            return self._decode_fn(tokens, self._batch)
        return self.model(mx.array(tokens)[:, None], cache=self._batch)[:, -1, :]

    def _inner(self, tokens: mx.array, cache: list) -> mx.array:
        inner = getattr(self.model, "model", None)
        return inner(tokens, cache=cache) if inner is not None else self.model(tokens, cache=cache)

    # -- decode -----------------------------------------------------------------------------
    def propose(self, seq_ids: Sequence[int], last: Sequence[int], lengths: Sequence[int]) -> list[tuple[int, ...]]:
        """Each row's greedy draft of `lengths[i]` tokens after its `last` token (rows of 0 get ())."""
        self._align(seq_ids)
        feeds = [self._pending[s] + [t] for s, t in zip(seq_ids, last)]
        steps = max(lengths)
        width = max(len(f) for f in feeds)
        rows = [f + [f[-1]] * (width - len(f)) for f in feeds]
        with self._kernels:
            logits = self._forward_rows(rows)
            ends = mx.array([len(f) - 1 for f in feeds])
            token = mx.argmax(logits[mx.arange(len(feeds)), ends], axis=-1)
            mx.eval(token)
            roll_back(self._batch, width, [len(f) for f in feeds])
            proposed = [token.tolist()]
            for _ in range(steps - 1):
                proposed.append(mx.argmax(self._step(proposed[-1]), axis=-1).tolist())
        columns = [list(row) for row in zip(*proposed)]
        if steps > 1:  # the proposals fed back in are not tokens the target kept
            for layer in self._batch:
                layer.trim(steps - 1)
        for s in seq_ids:
            self._pending[s] = []
        return [tuple(row[:n]) for row, n in zip(columns, lengths)]

    def decoded(self, seq_ids: Sequence[int], taken: Sequence[Sequence[int]], fed: bool) -> None:
        """After the target's step: `taken[i]`, the tokens row i put into the target's KV this step
        (its last token, unless `fed` says the draft already saw it, then the accepted drafts)."""
        self._align(seq_ids)
        for s, tokens in zip(seq_ids, taken):
            self._pending[s].extend(tokens)
        if not fed and max(len(self._pending[s]) for s in seq_ids) >= CATCH_UP:
            self._catch_up(seq_ids)

    def _catch_up(self, seq_ids: Sequence[int]) -> None:
        feeds = [self._pending[s] for s in seq_ids]
        width = max(len(f) for f in feeds)
        if min(len(f) for f in feeds) == 0:  # a row with nothing to feed gets its own last token back later
            return
        with self._kernels:
            mx.eval(self._forward_rows([f + [f[-1]] * (width - len(f)) for f in feeds]))
        roll_back(self._batch, width, [len(f) for f in feeds])
        mx.eval([c.state for c in self._batch])
        for s in seq_ids:
            self._pending[s] = []

    def _align(self, seq_ids: Sequence[int]) -> None:
        if list(seq_ids) != self._rows:
            order = [self._rows.index(s) for s in seq_ids]
            for layer in self._batch:
                layer.filter(order)
            self._rows = list(seq_ids)

    def shift(self, shift: Shift) -> None:
        """The target's row was shifted (--context-shift): rebuild the draft's row from the kept
        tokens, as much as fits its buffer now, the rest left pending."""
        self._align(self._rows)
        row = self._rows.index(shift.seq_id)
        fit = min(len(shift.tokens), self._batch[0]._idx)
        cache = make_prompt_cache(self.model)
        with self._kernels:
            self._inner(mx.array(shift.tokens[:fit])[None], cache)
        for layer, kv in zip(self._batch, cache):
            set_row(layer, row, kv.keys[..., :fit, :], kv.values[..., :fit, :])
        mx.eval([(c.keys, c.values, c.offset, c.left_padding) for c in self._batch])
        self._pending[shift.seq_id] = list(shift.tokens[fit:])

    # -- retire -----------------------------------------------------------------------------
    def retire(self, seq_ids: Sequence[int]) -> None:
        """Forget sequences that finished or were aborted, mid-prefill or decoding."""
        gone = set(seq_ids)
        for s in gone:
            self._prefills.pop(s, None)
            self._pending.pop(s, None)
        keep = [i for i, s in enumerate(self._rows) if s not in gone]
        if len(keep) == len(self._rows):
            return
        self._rows = [self._rows[i] for i in keep]
        if keep:
            for layer in self._batch:
                layer.filter(keep)
        else:
            self._batch = None

    def close(self) -> None:
        self._prefills.clear()
        self._pending.clear()
        self._batch, self._rows = None, []
