"""Prompt pieces as rows of the CPU decode step (models/cpu/fused_step.FusedDecoder.run_rows), over
the engine's own KV rows (kv_rows.RowKV).

Where the decoder computes every row whole with one compiled step, a prompt's positions go through
it too: a row per position, written into the slot the sequence will decode in (RowKV.stage), the LM
head only where logits are wanted. So every position's K/V and logits come from one kernel family
whatever its route: a cold prefill, the rest of a prompt after a cached prefix, a piece beside
decoding rows (a fused tick), a decode step or a verify give the same bits (docs/CPU_FAST_PATH.md,
"One kernel family"). The piece's K/V is mirrored into its mlx-lm row cache, which snapshots and
the join read as for any piece.

A mixin of engine/runner/model_runner.py's ModelRunner (its decoder, rows and sequences).
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from ..core.step import PrefillPiece
from .kv_rows import RowKV, windows_of


def runs_rows(decoder) -> bool:
    """Whether `decoder` computes prompt rows as its decode rows (FusedDecoder with its fused step)."""
    check = getattr(decoder, "runs_rows", None)
    return bool(check and check())


class RowPrefill:
    """`_prefill_rows` and `_tick_rows` (the ModelRunner's prompt rows through the decode step)."""

    def _by_rows(self, piece: PrefillPiece) -> bool:
        """Whether this piece runs as rows of the decode step (not an embedding sequence's)."""
        return self._owned and runs_rows(self._fast_decode) and not self._pools(piece)

    def _prefill_rows(self, piece: PrefillPiece, state, logits_rows: Optional[np.ndarray]) -> Optional[mx.array]:
        """Run a piece's positions as rows: their K/V into the sequence's staged slot (and its row
        cache); the logits of `logits_rows` (indices into the piece), or None for none."""
        kv = self._stage_piece(piece, state)
        at, kv_row, desc = self._piece_rows(piece, state)
        logits = self._fast_decode.run_rows(piece.tokens, kv.keys, kv.values, kv_row, desc, at,
                                            np.zeros(0, np.int64), () if logits_rows is None else logits_rows)
        self._piece_written(piece, state, kv)
        return None if logits_rows is None else mx.array(logits)

    def _tick_rows(self, last: list, piece: PrefillPiece, state) -> np.ndarray:
        """A fused tick as one set of rows: the decode rows' logits, then the piece's last position's
        when it is terminal. The caller advances the decode rows."""
        kv = self._stage_piece(piece, state)
        slots, starts, positions, prefix = kv.step_arrays(1)
        at, piece_rows, piece_desc = self._piece_rows(piece, state)
        desc = np.concatenate([np.column_stack([prefix[:, 0], slots, prefix[:, 1], starts, positions + 1]), piece_desc])
        b = len(last)
        logits = self._fast_decode.run_rows([*last, *piece.tokens], kv.keys, kv.values,
                                            np.concatenate([slots, piece_rows]), desc,
                                            np.concatenate([positions, at]), np.arange(b, dtype=np.int64),
                                            [b + len(at) - 1] if piece.terminal else ())
        self._piece_written(piece, state, kv)
        return logits

    def _stage_piece(self, piece: PrefillPiece, state):
        """The rows, with the sequence's staged slot holding every position below the piece (its
        adopted prefix copied in once, unless a pinned prefix is read in place) and room for it."""
        cache = state.prefill_cache
        if cache[0].offset != piece.start:  # the scheduler's cursor and the KV disagree: a bug
            raise RuntimeError(f"piece of seq {piece.seq_id} starts at {piece.start}, its KV holds {cache[0].offset}")
        if self._batch is None:  # the first sequence: rows shaped by the decoder (its cache may be empty)
            d = self._fast_decode
            self._batch = RowKV(len(cache), d.kv_heads, d.head_dim, *self.rows_hint, windows=windows_of(d))
        kv = self._batch
        if state.staged is None:
            state.staged = kv.stage(piece.end)
            cut = state.prefix.length if state.prefix is not None else 0
            if piece.start > cut:  # an adopted private copy: its positions into the slot
                for layer, c in enumerate(cache):
                    kv.keys[layer][state.staged, :, cut:piece.start] = np.asarray(c.keys)[0, :, cut:piece.start]
                    kv.values[layer][state.staged, :, cut:piece.start] = np.asarray(c.values)[0, :, cut:piece.start]
                kv.staged_written(state.staged, cut, piece.start)
        kv.reserve(piece.end)
        return kv

    @staticmethod
    def _piece_rows(piece: PrefillPiece, state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, KV row, attention descriptor) of a piece's rows: its staged slot, positions below
        its pinned prefix's length read from the prefix's slot (cpu_decode_attention's descriptor)."""
        n = len(piece.tokens)
        at = piece.start + np.arange(n, dtype=np.int64)
        shared, cut = (state.prefix.slot, state.prefix.length) if state.prefix is not None else (0, 0)
        kv_row = np.full(n, state.staged, np.int64)
        desc = np.column_stack([np.full(n, shared), kv_row, np.full(n, cut), np.zeros(n, np.int64), at + 1])
        return at, kv_row, desc.astype(np.int64)

    @staticmethod
    def _piece_written(piece: PrefillPiece, state, kv) -> None:
        """Record the piece's positions in the staged slot and mirror them into its row cache."""
        kv.staged_written(state.staged, piece.start, piece.end)
        cache = state.prefill_cache
        for layer, c in enumerate(cache):  # contiguous first: mlx converts a strided view of the slot
            # buffer 50-400x slower (2.3 ms a layer at 6,000 positions: 140 ms a tick of a 135M model)
            k = np.ascontiguousarray(kv.keys[layer][state.staged, :, piece.start:piece.end])
            v = np.ascontiguousarray(kv.values[layer][state.staged, :, piece.start:piece.end])
            c.update_and_fetch(mx.array(k)[None], mx.array(v)[None])
        mx.eval([c.state for c in cache])

    def _rebuild_row(self, row: int, shift) -> bool:
        """A context shift's "prefill" over the rows: the kept tokens rerun as rows into the row's own
        slot, so its K/V are a fresh prefill's by the same kernels. False where this does not apply
        (the shifter's own way then: "rotate", or mlx-lm's forward for another decoder)."""
        if not (self._owned and runs_rows(self._fast_decode)) or self._shifter.mode != "prefill":
            return False
        kv, n = self._batch, len(shift.tokens)
        if n != kv.lengths[row] - shift.n_discard:
            raise RuntimeError(f"shift of seq {shift.seq_id}: {n} tokens for {kv.lengths[row] - shift.n_discard} positions")
        kv.unshare(row)  # its own slot from position 0 (the rows below are rewritten next)
        slot, at = kv.slots[row], np.arange(n, dtype=np.int64)
        zero = np.zeros(n, np.int64)
        desc = np.column_stack([zero, np.full(n, slot, np.int64), zero, zero, at + 1])
        self._fast_decode.run_rows(shift.tokens, kv.keys, kv.values, np.full(n, slot, np.int64), desc, at,
                                   np.zeros(0, np.int64))
        kv.lengths[row] = n
        return True
