"""One forward per tick on the CPU decode path: a tick's decode rows and its prefill
piece run as one batch through the weights (models/cpu/tick.py), instead of a decode step and
then the piece's own mlx-lm forward.

A mixin of engine/runner/model_runner.py's ModelRunner, used when the decode batch is the
engine's own rows (kv_rows.py). The piece's KV stays its sequence's mlx-lm row cache (so
snapshots, adoption and the join are as for any piece). Pieces that need more than the last
position's logits (prompt logprobs, embeddings), drafting ticks, and pieces longer than
`fuse_max_tokens` (where the prefill's dequantized-tile BLAS is the faster product) keep the
separate forwards.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..core.step import Step
from .sampling import SampledToken

# A fused piece's row cache grows by this many positions, each layer at its own tick (`_grow_ahead`).
GROW_STEP = 1024
FUSE_MAX_TOKENS = 128  # measured in docs/CONTINUOUS_BATCHING.md ("One forward per tick")


class FusedTick:
    """`_fuses(step)` and `_fused_tick(step)` (the ModelRunner's one-forward ticks)."""

    fuse_max_tokens = FUSE_MAX_TOKENS  # 0: never fuse (today's two forwards)

    @property
    def one_forward(self) -> bool:
        """Whether the engine may hand this runner a decode step and a piece in one record."""
        spec = getattr(self._fast_decode, "spec", None)  # models/cpu/tick.py runs llama's layer
        # LoRA: the rows of one tick belong to several sequences and scales; kept to separate forwards
        return self._owned and self.fuse_max_tokens > 0 and spec is not None and spec.llama_layer \
            and self.lora is None

    @property
    def fuses_up_to(self) -> int:
        return self.fuse_max_tokens if self.one_forward else 0

    def _fuses(self, step: Step) -> bool:
        piece = step.prefill
        if not (self.one_forward and step.decode and piece is not None and len(piece.tokens) <= self.fuse_max_tokens):
            return False
        if self.draft is not None or any(step.drafts) or step.draft_lengths or self._pools(piece):
            return False
        if (piece.begin.images if piece.begin is not None else self._seqs[piece.seq_id].embeds) is not None:
            return False  # a prompt with images prefills through its input embeddings
        params = piece.begin.sampling if piece.begin is not None else self._seqs[piece.seq_id].sampler.params
        return not params.prompt_logprobs

    def _fused_tick(self, step: Step) -> tuple[list[SampledToken], Optional[SampledToken]]:
        """The decode rows' tokens, and the piece's first token when it is terminal (then it joins)."""
        from ...models.cpu.tick import forward_tick

        seq_ids, piece = step.decode, step.prefill
        if tuple(self._rows) != seq_ids:
            self._reorder(seq_ids)
        if piece.begin is not None:
            self._begin(piece)
        state = self._seqs[piece.seq_id]
        cache = state.prefill_cache
        if cache[0].offset != piece.start:  # the scheduler's cursor and the KV disagree: a bug
            raise RuntimeError(f"piece of seq {piece.seq_id} starts at {piece.start}, its KV holds {cache[0].offset}")
        state.sampler.extend_prompt(piece.tokens)
        kv = self._batch
        last = [self._seqs[s].last_token for s in seq_ids]
        if self._by_rows(piece):  # the decode step's own rows: its bits (engine/runner/row_prefill.py)
            logits = self._tick_rows(last, piece, state)
        else:
            if state.staged is None:
                state.staged = kv.stage(piece.end)
            kv.reserve(piece.end)
            slots, starts, positions, prefix = kv.step_arrays(1)
            logits = forward_tick(self._fast_decode, last, kv.keys, kv.values, slots, starts, positions,
                                  piece.tokens, piece.start, _store(cache, kv, state.staged, piece.start),
                                  piece.terminal, prefix)
            kv.staged_written(state.staged, piece.start, piece.end)
        kv.advance(1)
        logits = mx.array(logits)
        decoded = self._sample(logits[: len(seq_ids)], seq_ids)
        for seq_id, s in zip(seq_ids, decoded):
            self._seqs[seq_id].last_token = s.token_id
        if piece.snapshot_id is not None:
            self._keep_snapshot(piece.snapshot_id, state, cache, piece.end)
        if not piece.terminal:
            return decoded, None
        first = self._sample(logits[len(seq_ids) :], [piece.seq_id])[0]
        self._join(piece.seq_id, state, first.token_id)
        return decoded, first


def _store(cache: list, kv=None, slot: int = 0, start: int = 0):
    """forward_tick's `store`: append a layer's new (kv_heads, P, dim) K/V to the row cache (and to
    the sequence's staged slot of `kv`, the rows it will join) and hand back numpy views of all its
    positions."""

    def store(layer: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if kv is not None:
            kv.keys[layer][slot, :, start:start + keys.shape[1]] = keys
            kv.values[layer][slot, :, start:start + keys.shape[1]] = values
        c = cache[layer]
        _grow_ahead(c, layer, len(cache), keys.shape[1])
        c.update_and_fetch(mx.array(np.ascontiguousarray(keys))[None], mx.array(np.ascontiguousarray(values))[None])
        mx.eval(c.keys, c.values)
        return np.asarray(c.keys)[0, :, : c.offset], np.asarray(c.values)[0, :, : c.offset]

    return store


def _grow_ahead(c, layer: int, layers: int, tokens: int) -> None:
    """Grow an mlx-lm KVCache by GROW_STEP positions once it is within layer / layers of a step of
    full, so each layer's O(context) regrow lands on a different tick (mlx-lm grows every layer in
    the same tick: +70-100 ms a tick at context 6,144, every 256 tokens; docs/CONTINUOUS_BATCHING.md)."""
    if type(c) is not KVCache or c.keys is None:
        return
    capacity, lead = c.keys.shape[2], layer * GROW_STEP // layers
    if c.offset + tokens + lead <= capacity:
        return
    extra = -(-(c.offset + tokens + lead - capacity) // GROW_STEP) * GROW_STEP
    shape = (*c.keys.shape[:2], extra)
    c.keys = mx.concatenate([c.keys, mx.zeros((*shape, c.keys.shape[3]), c.keys.dtype)], axis=2)
    c.values = mx.concatenate([c.values, mx.zeros((*shape, c.values.shape[3]), c.values.dtype)], axis=2)
