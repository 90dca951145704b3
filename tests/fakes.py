"""A fake runner and helpers for testing the scheduler and engine without a model."""

from __future__ import annotations

from mlxcel_py.engine import Engine, Request, SamplingParams
from mlxcel_py.engine.core.prompt_cache import PromptCache
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy
from mlxcel_py.engine.core.scheduler import Scheduler
from mlxcel_py.engine.core.step import Runner, Step, StepOutput
from mlxcel_py.engine.core.text_stream import TextStream

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


class FakeRunner(Runner):
    """Executes step records by recording them; decode emits token 1 for every row unless scripted.

    Implements only `execute`: idle, close, peak memory and the compiler keep the Protocol's defaults."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.steps: list[Step] = []
        self.rows: set[int] = set()  # sequences in the decode batch
        self.snapshots: dict[int, tuple] = {}  # snapshot id -> (seq_id, num_tokens) it was taken from
        self.script: dict[int, list[int]] = {}
        self.verifies_drafts = True
        self.verifies = True  # False: ignore the drafts a step carries anyway, one token per row

    def prefill_lengths(self, seq_id: int) -> list[int]:
        return [c[3] - c[2] for c in self.calls if c[0] == "prefill" and c[1] == seq_id]

    def execute(self, step: Step) -> StepOutput:
        self.steps.append(step)
        if step.retire:
            self.calls.append(("retire", tuple(r.seq_id for r in step.retire)))
            for r in step.retire:
                if r.snapshot_id is not None:
                    self.snapshots[r.snapshot_id] = (r.seq_id, r.num_tokens)
                self.rows.discard(r.seq_id)
        decoded, extra = (), ()
        for shift in step.shift:  # a shifted row is one the batch holds, shifted before its decode
            assert shift.seq_id in self.rows and shift.seq_id in step.decode, (shift, self.rows)
            self.calls.append(("shift", shift.seq_id, shift.n_keep, shift.n_discard, len(shift.tokens)))
        if step.decode:
            assert set(step.decode) == self.rows, (self.rows, step.decode)
            self.calls.append(("decode", step.decode))
            drafts = step.drafts if self.verifies and step.drafts else ((),) * len(step.decode)
            runs = [self._verify(s, d) for s, d in zip(step.decode, drafts)]
            decoded = tuple(run[0] for run in runs)
            extra = tuple(tuple(run[1:]) for run in runs) if self.verifies and step.drafts else ()
        first = None
        if (piece := step.prefill) is not None:
            self.calls.append(("prefill", piece.seq_id, piece.start, piece.end))
            if piece.snapshot_id is not None:
                self.snapshots[piece.snapshot_id] = (piece.seq_id, piece.end)
            if piece.terminal:
                self.rows.add(piece.seq_id)
                first = self._next(piece.seq_id)
        for snapshot_id in step.drop_snapshots:
            self.snapshots.pop(snapshot_id, None)
        return StepOutput(decoded, first, decoded_extra=extra)

    def context_shift_support(self):
        return None

    def _verify(self, seq_id: int, draft: tuple[int, ...]) -> list[int]:
        """The target's tokens (the script) for as long as the draft agrees, plus one: real verification."""
        run = [self._next(seq_id)]
        for token in draft:
            if run[-1] != token:
                break
            run.append(self._next(seq_id))
        return run

    def _next(self, seq_id: int) -> int:
        script = self.script.get(seq_id)
        return script.pop(0) if script else 1


def make_engine(
    *, chunk=None, num_slots=4, slot_context=16384, max_queue=8, cache=False, drafting=None, clock=None,
    context_shift=False
) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner()
    scheduler = Scheduler(
        policy=PrefillChunkPolicy.resolve(chunk),
        num_slots=num_slots,
        slot_context=slot_context,
        max_queue=max_queue,
        make_stream=make_stream,
        eos_token_ids=frozenset({EOS}),
        prompt_cache=PromptCache(1 << 30, 8, 4, bytes_per_token=1) if cache else None,
        drafting=drafting,
        context_shift=context_shift,
        **({"clock": clock} if clock is not None else {}),
    )
    return Engine(scheduler, runner), runner


def request(rid: str, n: int, max_tokens: int = 1000, start: int = 1, **kw) -> Request:
    """A prompt of n distinct-ish tokens (never EOS)."""
    ids = tuple(start + (i % 50000) for i in range(n))
    return Request(rid, ids, SamplingParams(max_tokens=max_tokens, **kw))
