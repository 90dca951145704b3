"""A fake runner and helpers for testing the scheduler and engine without a model."""

from __future__ import annotations

from mlxcel_py.engine import Engine
from mlxcel_py.engine.kv import PromptCache
from mlxcel_py.engine.plan import PlanCaps, PrefillChunkPolicy
from mlxcel_py.engine.scheduler import Scheduler
from mlxcel_py.engine.sequence import PrefillOutput, Snapshot
from mlxcel_py.engine.text import TextStream
from mlxcel_py.engine import Request, SamplingParams

EOS = 0


class CharDetokenizer:
    """Token t decodes to chr(ord('a') + t % 26)."""

    def __init__(self):
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self.last_segment = chr(ord("a") + token % 26)

    def finalize(self) -> None:
        self.last_segment = ""


def make_stream(stop: tuple[str, ...]) -> TextStream:
    return TextStream(CharDetokenizer(), stop)


class FakeRunner:
    """Records every model call; decode emits token 1 for every row unless scripted."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.rows: list[int] = []
        self.script: dict[int, list[int]] = {}

    def prefill_lengths(self, seq_id: int) -> list[int]:
        return [c[3] - c[2] for c in self.calls if c[0] == "prefill" and c[1] == seq_id]

    def prefill(self, work) -> PrefillOutput:
        piece = work.piece
        self.calls.append(("prefill", work.seq_id, piece.start, piece.end))
        snap = Snapshot(work.prompt_ids[: piece.end], f"kv{work.seq_id}", piece.end) if work.snapshot else None
        if not piece.terminal:
            return PrefillOutput(None, snap)
        self.rows.append(work.seq_id)
        return PrefillOutput(self._next(work.seq_id), snap)

    def decode(self, work) -> tuple[int, ...]:
        assert tuple(self.rows) == work.seq_ids, (self.rows, work.seq_ids)
        self.calls.append(("decode", work.seq_ids))
        return tuple(self._next(s) for s in work.seq_ids)

    def retire(self, works) -> list[Snapshot]:
        self.calls.append(("retire", tuple(w.seq_id for w in works)))
        gone = {w.seq_id for w in works}
        self.rows = [r for r in self.rows if r not in gone]
        return [Snapshot(w.snapshot_tokens, f"kv{w.seq_id}", len(w.snapshot_tokens)) for w in works if w.snapshot_tokens]

    def _next(self, seq_id: int) -> int:
        script = self.script.get(seq_id)
        return script.pop(0) if script else 1


def make_engine(
    *, chunk=None, num_slots=4, slot_context=16384, max_queue=8, cache=False
) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner()
    scheduler = Scheduler(
        policy=PrefillChunkPolicy.resolve(chunk),
        num_slots=num_slots,
        slot_context=slot_context,
        max_queue=max_queue,
        make_stream=make_stream,
        eos_token_ids=frozenset({EOS}),
        caps=PlanCaps(),
        prompt_cache=PromptCache(1 << 30, 8, 4) if cache else None,
    )
    return Engine(scheduler, runner), runner


def request(rid: str, n: int, max_tokens: int = 1000, start: int = 1, **kw) -> Request:
    """A prompt of n distinct-ish tokens (never EOS)."""
    ids = tuple(start + (i % 50000) for i in range(n))
    return Request(rid, ids, SamplingParams(max_tokens=max_tokens, **kw))
