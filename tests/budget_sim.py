"""A fake device whose tick time follows a known law, and a tick-by-tick admission driving a
chunk policy: streams decode, prompts are prefilled one at a time (chunk -> cost -> observe)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from mlxcel_py.engine.chunking.policy import TickState
from mlxcel_py.engine.chunking.cost_model import TickSample, TickShape


@dataclass(frozen=True)
class Law:
    """t = tick + piece*[n>0] + token*n + att*n*c + sq*n^2 + row*b + row_ctx*C (seconds)."""

    tick: float = 0.03
    piece: float = 0.05
    token: float = 3.4e-3
    att: float = 6.7e-7
    sq: float = 3.3e-7
    row: float = 0.015
    row_ctx: float = 1e-6

    def seconds(self, s: TickShape) -> float:
        n = s.tokens
        return (self.tick + self.piece * (n > 0) + self.token * n + self.att * n * s.context + self.sq * n * n
                + self.row * s.rows + self.row_ctx * s.row_context)

    def measure(self, tokens: int, context: int, rows: int) -> float:
        return self.seconds(TickShape(tokens, context, rows))

    def scaled(self, k: float) -> "Law":
        return Law(*(k * v for v in (self.tick, self.piece, self.token, self.att, self.sq, self.row, self.row_ctx)))


# Shaped like this project's CPU machine (docs/adr/0008): ~90 ms for 4 decode rows, ~2.2 s
# for a contended 512-token piece at 1k context.
CPU = Law()
GPU = Law(tick=4e-3, piece=2e-3, token=2e-5, att=4e-9, sq=0.0, row=5e-4, row_ctx=1e-8)


@dataclass(frozen=True)
class Tick:
    index: int
    prompt: int  # which admitted prompt this tick's piece belongs to (-1: none)
    state: TickState
    chunk: int
    shape: TickShape
    predicted: float
    seconds: float


def admit(policy, law_at: Callable[[int], Law], prompts: Sequence[int] = (2048, 6144), streams: int = 4,
          stream_context: int = 32, noise: float = 0.0, seed: int = 0, spikes: Sequence[int] = (),
          max_ticks: int = 5000) -> list[Tick]:
    """Admit `prompts` one after another next to `streams` decoding rows; each admitted prompt
    joins the decode rows when its prefill ends. `law_at(i)` is the law of tick i; a tick in
    `spikes` takes 10x its time (an outlier); `noise` is a uniform relative jitter."""
    rng = random.Random(seed)
    rows = [stream_context] * streams
    ticks: list[Tick] = []
    queue = list(prompts)
    which, cursor = 0, 0
    for i in range(max_ticks):
        if not queue:
            return ticks
        total = queue[0]
        state = TickState(len(rows), sum(rows), cursor, total - cursor)
        chunk = policy.chunk_for(state)
        shape = TickShape(min(chunk, total - cursor), cursor, len(rows), sum(rows))
        seconds = law_at(i).seconds(shape) * (1 + noise * rng.uniform(-1, 1)) * (10 if i in spikes else 1)
        predicted = policy.model.predict(shape)
        policy.observe(TickSample(shape, seconds))
        ticks.append(Tick(i, which, state, chunk, shape, predicted, seconds))
        rows = [r + 1 for r in rows]
        cursor += shape.tokens
        if cursor == total:
            rows.append(total)
            queue.pop(0)
            which, cursor = which + 1, 0
    raise AssertionError("the admission did not finish")


def best_fit(law: Law, sizes: Sequence[int], state: TickState, target_s: float) -> Optional[int]:
    """The largest size whose tick under `law` fits `target_s` (None: none does)."""
    fits = [int(n) for n in sizes if law.seconds(TickShape(int(n), state.prefill_context, state.num_decoding,
                                                      state.decode_context)) <= target_s]
    return max(fits) if fits else None


def with_rows(shape: TickShape, rows: int) -> TickShape:
    return replace(shape, rows=rows)
