"""Timing real ticks on the runner, for the ITL-budget calibration (engine/chunking/calibration.py).

`TickProbe.measure(tokens, context, rows)` times one tick of the asked shape end to end: a
decode step over `rows` scratch sequences, then a `tokens`-token piece of a scratch prompt
whose KV already holds `context` tokens (built untimed). It speaks only `Step` records, so
it runs on any runner, and it leaves nothing behind (`close`). Plain Python: no MLX.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Optional

from ..core.request import SamplingParams
from ..core.step import BeginSequence, PrefillPiece, Retire, Step

ROW_PROMPT = 32  # tokens each scratch decode row starts with
BUILD_PIECE = 512  # untimed pieces that build a scratch context
FIRST_ID = 1 << 40  # scratch sequence ids, far above the scheduler's


class TickProbe:
    """Scratch sequences on a runner that no request uses yet (run it before the engine serves)."""

    def __init__(self, runner, max_context: int, vocab: int, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.runner, self.rng, self.vocab, self.clock = runner, random.Random(seed), vocab, clock
        self.prompt = self._tokens(max_context + 1)
        self.rows: list[int] = []
        self.scratch: Optional[int] = None
        self.scratch_len = 0
        self._next_id = FIRST_ID

    def measure(self, tokens: int, context: int, rows: int) -> float:
        """Seconds for one tick of the shape; the runner's steps end in a sync (sampled ids, evaluated KV)."""
        self._set_rows(rows)
        if tokens:
            self._set_context(context)
        start = self.clock()
        fused = bool(rows and tokens and getattr(self.runner, "one_forward", False))
        if fused:  # one record, as the engine issues it
            self.runner.execute(Step(decode=tuple(self.rows), prefill=self._piece_of(self.scratch, context,
                                                                                    context + tokens, self.prompt)))
        elif rows:
            self.runner.execute(Step(decode=tuple(self.rows)))
        if tokens and not fused:
            self._piece(self.scratch, context, context + tokens, self.prompt, terminal=False)
        if tokens:
            self.scratch_len = context + tokens
        return self.clock() - start

    def close(self) -> None:
        """Retire every scratch sequence."""
        ids = self.rows + ([self.scratch] if self.scratch is not None else [])
        if ids:
            self.runner.execute(Step(retire=tuple(Retire(s) for s in ids)))
        self.rows, self.scratch, self.scratch_len = [], None, 0

    def _tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.vocab // 4, self.vocab) for _ in range(n))

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _piece(self, seq_id: int, start: int, end: int, prompt: tuple[int, ...], terminal: bool) -> None:
        self.runner.execute(Step(prefill=self._piece_of(seq_id, start, end, prompt, terminal)))

    @staticmethod
    def _piece_of(seq_id: int, start: int, end: int, prompt: tuple[int, ...], terminal: bool = False) -> PrefillPiece:
        begin = BeginSequence(SamplingParams(), ()) if start == 0 else None
        return PrefillPiece(seq_id, start, prompt[start:end], end - start, terminal, None, begin)

    def _set_rows(self, rows: int) -> None:
        while len(self.rows) < rows:  # a short prompt prefilled to its end joins the decode batch
            seq_id = self._new_id()
            self._piece(seq_id, 0, ROW_PROMPT, self._tokens(ROW_PROMPT), terminal=True)
            self.rows.append(seq_id)
        if len(self.rows) > rows:
            self.runner.execute(Step(retire=tuple(Retire(s) for s in self.rows[rows:])))
            del self.rows[rows:]

    def _set_context(self, context: int) -> None:
        if self.scratch is None or self.scratch_len > context:
            if self.scratch is not None:
                self.runner.execute(Step(retire=(Retire(self.scratch),)))
            self.scratch, self.scratch_len = self._new_id(), 0
        while self.scratch_len < context:
            end = min(context, self.scratch_len + BUILD_PIECE)
            self._piece(self.scratch, self.scratch_len, end, self.prompt, terminal=False)
            self.scratch_len = end
