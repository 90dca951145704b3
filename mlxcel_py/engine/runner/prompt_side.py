"""The prompt side of the ModelRunner: prefill pieces into a sequence's own KV, embedding
sequences' pooling, prompt logprobs, and joining the decode batch after the terminal piece.

A mixin of engine/runner/model_runner.py's ModelRunner (it uses the runner's model, KV layout,
kernels, sequences, snapshots and batch); kept apart so each file reads as one side of a step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Optional

import mlx.core as mx
import numpy as np

from ..core.events import TokenLogprobs
from ..core.step import PrefillPiece
from .kv import adopt, arrays, make_cache, snapshot
from .kv_rows import FIRST_CAPACITY, FIRST_SLOTS, PinnedPrefix, RowKV, windows_of
from .logits import sequence_logprobs
from .pooling import Pooler, hidden_fn
from .sampling import SampledToken, SequenceSampler
from ...models.cpu.blas import numpy_blas_threads

# A piece this short runs its numpy attention on one BLAS thread: a second one woken per small
# product cost up to 60x the CPU time under load (docs/CONTINUOUS_BATCHING.md).
SMALL_PIECE = 128


def _copy_kv(cache: list, length: int) -> list:
    """Independent per-layer copies of the first `length` positions."""
    out = [snapshot(layer, length) for layer in cache]
    mx.eval([arrays(c) for c in out])
    return out


@dataclass(slots=True)
class SequenceState:
    """What the runner holds for one sequence id, from its first piece to its retirement."""

    sampler: SequenceSampler
    prefill_cache: Optional[list] = None  # its own KV while prefilling; None once in the decode batch
    last_token: Optional[int] = None  # the latest sampled token (the next decode step's input)
    prompt_row: Optional[mx.array] = None  # echo: the last prompt position's raw logits, between pieces
    pooler: Optional[Pooler] = None  # an embedding sequence: its pool across pieces (it never decodes)
    prefix: Optional[PinnedPrefix] = None  # a pinned snapshot it adopted or took: its row will share it
    staged: Optional[int] = None  # its future slot in the rows, which its fused ticks write (RowKV.stage)
    embeds: Optional[mx.array] = None  # a prompt with images: its input embeddings (1, prompt, hidden)
    both_ways: tuple[tuple[int, int], ...] = ()  # its image runs whose positions attend each other (PromptImages)
    lora: Optional[tuple[float, ...]] = None  # its LoRA scales (None: the loaded ones)


class PromptSide:
    """Prefill pieces and their sequences (the ModelRunner's prompt side)."""

    rows_hint = (FIRST_SLOTS, FIRST_CAPACITY)  # the owned rows' first (slots, positions)

    def _run_piece(self, piece: PrefillPiece) -> tuple[Optional[SampledToken], tuple]:
        if piece.begin is not None:
            self._begin(piece)
        state = self._seqs[piece.seq_id]
        cache = state.prefill_cache
        state.sampler.extend_prompt(piece.tokens)
        prompt: tuple = ()
        embeds = None if state.embeds is None else state.embeds[:, piece.start:piece.start + len(piece.tokens)]
        spans = _within(state.both_ways, piece.start, piece.start + len(piece.tokens)) if embeds is not None else ()
        if embeds is None and self._by_rows(piece):  # the decode step's rows: one kernel family (row_prefill.py)
            with self._lora_for((piece.seq_id,)):
                if state.sampler.params.prompt_logprobs:
                    logits, prompt = self._score_piece(piece, state, self._prefill_rows(
                        piece, state, np.arange(len(piece.tokens), dtype=np.int64)))
                else:
                    wanted = np.array([len(piece.tokens) - 1], np.int64) if piece.terminal else None
                    logits = self._prefill_rows(piece, state, wanted)
        else:
            with self._kernels, numpy_blas_threads(1 if len(piece.tokens) <= SMALL_PIECE else None), \
                    self._lora_for((piece.seq_id,)):
                if state.sampler.params.prompt_logprobs:
                    logits, prompt = self._score_piece(piece, state, embeds=embeds, spans=spans)
                else:
                    logits = self._forward_prefill(mx.array(piece.tokens)[None], cache, piece.terminal, embeds, spans)
        if self.draft is not None:
            self.draft.prefill(piece.seq_id, piece.tokens, piece.terminal)
        if piece.snapshot_id is not None:
            self._keep_snapshot(piece.snapshot_id, state, cache, piece.end)
        if not piece.terminal:
            return None, prompt
        sampled = self._sample(logits, [piece.seq_id])[0]
        self._join(piece.seq_id, state, sampled.token_id)
        return sampled, prompt

    def _pools(self, piece: PrefillPiece) -> bool:
        if piece.begin is not None:
            return piece.begin.pooling is not None
        state = self._seqs.get(piece.seq_id)
        return state is not None and state.pooler is not None

    def _embed_piece(self, piece: PrefillPiece):
        """Forward an embedding sequence's piece into its KV and pool its hidden states; after the
        terminal piece, its vector (numpy), and the sequence's KV is freed at once (no decode)."""
        if piece.begin is not None:
            self._begin(piece)
            first = self.rank_head is not None and self.rank_head.first_token
            self._seqs[piece.seq_id].pooler = Pooler(piece.begin.pooling, first)
        state = self._seqs[piece.seq_id]
        inner = hidden_fn(self.model)
        if inner is None:
            raise RuntimeError("this model exposes no hidden states (no inner `model` module) to embed")
        with self._kernels, self._lora_for((piece.seq_id,)):
            hidden = inner(mx.array(piece.tokens)[None], cache=state.prefill_cache)
        state.pooler.add(hidden[0])
        mx.eval([c.state for c in state.prefill_cache] + state.pooler.arrays())
        if not piece.terminal:
            return None
        self._release_prefix(self._seqs.pop(piece.seq_id))
        if not state.pooler.ranks:
            return state.pooler.result()
        if self.rank_head is None:
            raise RuntimeError("a rank request reached a runner whose model has no classifier head")
        return self.rank_head.scores(state.pooler.result())  # the head's outputs (llama.cpp's rank pooling)

    def _score_piece(self, piece: PrefillPiece, state: SequenceState, logits: Optional[mx.array] = None,
                     embeds: Optional[mx.array] = None, spans: tuple = ()
                     ) -> tuple[mx.array, tuple[Optional[TokenLogprobs], ...]]:
        """Forward a piece with logits at every position (or take them, computed as rows): each prompt
        token's logprob given the tokens before it (the first token of the prompt has none). Returns
        the last row too."""
        if logits is None and spans:
            hidden = self.vision.forward(self.model, embeds, state.prefill_cache, spans)
            logits = self.vision.logits(self.model, hidden)[0]
        elif logits is None:
            extra = {} if embeds is None else {"input_embeddings": embeds}
            logits = self.model(mx.array(piece.tokens)[None], cache=state.prefill_cache, **extra)[0]
        previous, state.prompt_row = state.prompt_row, None
        rows = logits[:-1] if previous is None else mx.concatenate([previous, logits[:-1]], axis=0)
        scored = piece.tokens[1:] if previous is None else piece.tokens
        top = state.sampler.params.top_logprobs
        out = tuple(sequence_logprobs(rows, list(scored), top)) if scored else ()
        if previous is None:
            out = (None,) + out
        if not piece.terminal:
            state.prompt_row = logits[-1:]
        return logits[-1:], out

    def _begin(self, piece: PrefillPiece) -> None:
        begin = piece.begin
        cache, held = make_cache(self.model, self.kv), None
        if begin.adopt_id is not None:  # start from the snapshot's first `start` positions
            snap = self._snapshots[begin.adopt_id]
            if isinstance(snap, PinnedPrefix):  # the prefill reads a copy; the row will share the slot
                held = self._batch.ref(PinnedPrefix(snap.slot, piece.start))
                snap = self._batch.prefix_caches(snap, piece.start)
            for layer, snap_layer in zip(cache, snap):
                adopt(layer, snap_layer, piece.start)
        constraint = begin.sampling.constraint
        matcher = None
        if constraint is not None:
            if self.compiler is None:
                raise RuntimeError("a constrained sequence reached a runner without a grammar compiler")
            matcher = self.compiler.matcher(constraint)  # compiled (and cached) when the request was checked
        sampler = SequenceSampler(begin.sampling, prompt_ids=begin.history, matcher=matcher)
        embeds = None
        # The vision tower once, for the whole prompt (pieces take slices), unless every image is in the
        # adopted prefix (a next turn over the same images: their KV is already there).
        if begin.images is not None and begin.images.last_image_token >= piece.start:
            if self.vision is None:
                raise RuntimeError("a prompt with images reached a runner whose model has no vision side")
            embeds = self.vision.embed(begin.images)
            mx.eval(embeds)
        self._seqs[piece.seq_id] = SequenceState(sampler, prefill_cache=cache, prefix=held, embeds=embeds,
                                                 both_ways=begin.images.both_ways if embeds is not None else (),
                                                 lora=begin.lora)
        if self.draft is not None and begin.pooling is None:
            self.draft.begin(piece.seq_id, begin.history)

    def _lora_for(self, seq_ids: tuple[int, ...]) -> ContextManager[Any]:
        """The scope of a forward over `seq_ids`' rows: each row's LoRA scales (models/lora.LoraState)."""
        if self.lora is None:
            return contextlib.nullcontext()
        return self.lora.using([self._seqs[s].lora or self.lora.scales for s in seq_ids])

    def _forward_prefill(self, tokens: mx.array, cache: list, terminal: bool, embeds: Optional[mx.array] = None,
                         spans: tuple = ()) -> Optional[mx.array]:
        """Run one piece (`embeds`: its input embeddings, a prompt with images, whose `spans` attend each
        other both ways); the (1, V) logits of its last position when terminal, else only the KV."""
        if spans:
            hidden = self.vision.forward(self.model, embeds, cache, spans)
            if not terminal:
                mx.eval([c.state for c in cache])
                return None
            return self.vision.logits(self.model, hidden[:, -1, :])
        extra = {} if embeds is None else {"input_embeddings": embeds}
        if self._project is None:
            out = self.model(tokens, cache=cache, **extra)
            if not terminal:
                mx.eval([c.state for c in cache])
                return None
            return out[:, -1, :]
        hidden = self.model.model(tokens, cache=cache, **extra)
        if not terminal:
            mx.eval([c.state for c in cache])  # the LM head is never computed for inner pieces
            return None
        return self._project(hidden[:, -1, :])

    def _join(self, seq_id: int, state: SequenceState, token: int) -> None:
        """Merge a finished prefill's KV into the decode batch (into a slot of the owned rows: a
        copy of its own tokens only; into mlx-lm's BatchKVCache: every row re-padded)."""
        cache, state.prefill_cache, state.last_token = state.prefill_cache, None, token
        state.embeds = None  # a prompt with images: it is all in the KV now
        self._rows.append(seq_id)
        if self._owned:
            # the row takes over the prefix's reference, and its staged slot
            self._rows_kv(cache).add(cache, state.prefix, state.staged)
            state.prefix = state.staged = None
            return
        rows = [layer.merge([layer]) for layer in cache]
        if self._batch is None:
            self._batch = rows
        else:
            for batch_layer, row in zip(self._batch, rows):
                batch_layer.extend(row)

    # -- shared prefixes (kv_rows.RowKV's pinned slots) -------------------------------------------
    @property
    def _shares(self) -> bool:
        return self._owned and self.share_prefixes

    def _rows_kv(self, caches: list) -> RowKV:
        if self._batch is None:
            self._batch = RowKV.like(caches, *self.rows_hint, windows=windows_of(self._fast_decode))
        return self._batch

    def _keep_snapshot(self, snapshot_id: int, state: SequenceState, cache: list, length: int) -> None:
        """Store a prefill's snapshot: pinned in the rows by reference (the sequence's row will share
        it), else an mlx-lm copy."""
        if not self._shares:
            self._snapshots[snapshot_id] = _copy_kv(cache, length)
            return
        kv = self._rows_kv(cache)
        pinned = kv.pin(cache, length)
        self._snapshots[snapshot_id] = pinned
        self._release_prefix(state, left=False)
        state.prefix = kv.ref(pinned)

    def _release_prefix(self, state: SequenceState, left: bool = True) -> None:
        """Drop a sequence's reference to a pinned prefix: it left before joining (its staged slot is
        freed too), or it took a longer one (`left=False`)."""
        if left and state.staged is not None:
            self._batch.unstage(state.staged)
            state.staged = None
        if state.prefix is not None:
            self._batch.unref(state.prefix)
            state.prefix = None

    def _drop_snapshot(self, snapshot_id: int) -> None:
        snap = self._snapshots.pop(snapshot_id, None)
        if isinstance(snap, PinnedPrefix):
            self._batch.unref(snap)

    def _snapshot_layers(self, snapshot_id: int) -> list:
        """A snapshot as mlx-lm row caches (a pinned one copied out)."""
        snap = self._snapshots[snapshot_id]
        return self._batch.prefix_caches(snap) if isinstance(snap, PinnedPrefix) else snap


def _within(runs: tuple[tuple[int, int], ...], start: int, end: int) -> tuple[tuple[int, int], ...]:
    """The runs' parts in the piece [start, end), relative to it; a part of one position attends only itself."""
    parts = ((max(lo, start) - start, min(hi, end) - start) for lo, hi in runs)
    return tuple((lo, hi) for lo, hi in parts if hi - lo > 1)
