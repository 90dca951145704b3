"""The engine's two seams as Protocols: fakes satisfy them, and the engine drives them (exact traces)."""

from __future__ import annotations

from mlxcel_py.engine import Engine, Finished
from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy
from mlxcel_py.engine.chunking.cost_model import FEATURES, CostModel, TickShape
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy
from mlxcel_py.engine.chunking.policy import ChunkPolicy, TickState
from mlxcel_py.engine.core.scheduler import Scheduler
from mlxcel_py.engine.core.step import Runner

from fakes import EOS, FakeRunner, make_stream, request


class RecordingPolicy:
    """A chunk policy that records what the engine tells it: 4 tokens alone, 2 next to decoding."""

    alone, contended = 4, 2

    def __init__(self):
        self.trace: list[tuple] = []

    def chunk_for(self, state: TickState) -> int:
        self.trace.append(("chunk_for", state))
        return self.contended if state.num_decoding else self.alone

    def observe(self, sample) -> None:
        self.trace.append(("observe", sample.shape, sample.seconds))

    def fuses(self, runner_limit: int) -> bool:
        self.trace.append(("fuses", runner_limit))
        return False

    def describe(self) -> str:
        return "recording"

    def stats(self):
        return None


class SecondPerStep(FakeRunner):
    """Every record takes one second of the engine's clock; idle, close and memory are recorded."""

    def __init__(self):
        super().__init__()
        self.now, self.events = 0.0, []

    def execute(self, step):
        self.now += 1.0
        return super().execute(step)

    def idle(self) -> None:
        self.events.append("idle")

    def peak_memory_bytes(self) -> int:
        return 1234

    def close(self) -> None:
        self.events.append("close")


def engine_with(policy, runner) -> Engine:
    scheduler = Scheduler(policy=policy, num_slots=2, slot_context=64, max_queue=4, make_stream=make_stream,
                          eos_token_ids=frozenset({EOS}), clock=lambda: runner.now)
    return Engine(scheduler, runner)


def test_the_policies_and_the_fake_satisfy_chunk_policy():
    budget = BudgetChunkPolicy(300.0, CostModel([0.0] * len(FEATURES)))
    for policy in (PrefillChunkPolicy.resolve(None), budget, RecordingPolicy()):
        assert isinstance(policy, ChunkPolicy)
    assert PrefillChunkPolicy.resolve(None).stats() is None and budget.stats().budget_ms == 300.0
    assert not isinstance(object(), ChunkPolicy)


def test_a_runner_that_only_executes_keeps_the_protocols_defaults():
    runner = FakeRunner()
    assert Runner in type(runner).__mro__  # implementations subclass the Protocol for its defaults
    assert runner.compiler is None and runner.peak_memory_bytes() == 0
    assert runner.idle() is None and runner.close() is None
    engine = engine_with(RecordingPolicy(), SecondPerStep())
    engine.idle()
    engine.close()
    assert engine.runner.events == ["idle", "close"] and engine.compiler is None


def test_the_engine_tells_the_policy_each_ticks_state_and_the_shape_of_the_steps_it_issued():
    policy, runner = RecordingPolicy(), SecondPerStep()
    engine = engine_with(policy, runner)
    engine.add_request(request("a", 6, max_tokens=3))
    engine.step()  # a's first piece, alone
    engine.step()  # a's last piece: its first token
    engine.add_request(request("b", 5, max_tokens=1))
    events = engine.step()  # a decodes; b's first piece rides along at the contended chunk
    while engine.has_work():
        events += engine.step()
    assert policy.trace == [
        ("chunk_for", TickState(num_decoding=0, decode_context=0, prefill_context=0, remaining=6)),
        ("observe", TickShape(tokens=4, context=0, rows=0, row_context=0), 1.0),
        ("chunk_for", TickState(num_decoding=0, decode_context=0, prefill_context=4, remaining=2)),
        ("observe", TickShape(tokens=2, context=4, rows=0, row_context=0), 1.0),
        # a's decode row attends over 6 + 1 positions; after it, a holds 8 when b's piece is planned
        ("chunk_for", TickState(num_decoding=1, decode_context=8, prefill_context=0, remaining=5)),
        ("observe", TickShape(tokens=2, context=0, rows=1, row_context=7), 2.0),
        # a ends at its third token in the decode step, so b's next piece is planned alone
        ("chunk_for", TickState(num_decoding=0, decode_context=0, prefill_context=2, remaining=3)),
        ("observe", TickShape(tokens=3, context=2, rows=1, row_context=8), 3.0),
    ]
    assert runner.calls == [("prefill", 1, 0, 4), ("prefill", 1, 4, 6), ("decode", (1,)), ("prefill", 2, 0, 2),
                            ("decode", (1,)), ("retire", (1,)), ("prefill", 2, 2, 5), ("retire", (2,))]
    assert sorted(e.request_id for e in events if isinstance(e, Finished)) == ["a", "b"]
    assert engine.stats().peak_memory_bytes == 1234
