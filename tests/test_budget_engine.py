"""The ITL budget wired through the real engine: calibration on the engine thread's runner,
the chunk chosen per tick by the scheduler, every tick observed. A fake runner advances a
fake clock by a known cost law, so tick times are exact."""

from __future__ import annotations

from mlxcel_py.engine import Engine, PromptProgress
from mlxcel_py.engine.chunking.budget import BudgetChunkPolicy, ladder
from mlxcel_py.engine.chunking.cost_model import TickShape
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy
from mlxcel_py.engine.core.scheduler import Scheduler

from budget_sim import CPU, Law
from fakes import EOS, FakeRunner, make_stream, request

BUDGET_MS = 300


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedRunner(FakeRunner):
    """A FakeRunner whose every step costs law(shape) seconds of the fake clock."""

    def __init__(self, clock: Clock, law: Law):
        super().__init__()
        self.clock, self.law = clock, law
        self.context: dict[int, int] = {}  # KV positions per sequence
        self._decoded = False  # the previous record was this tick's decode step

    def execute(self, step):
        # A tick's decode step and its piece are two records: the law's per-tick constant is
        # charged with the decode step, so a contended tick costs exactly law(tick shape).
        piece = step.prefill
        if step.decode:
            rows_shape = TickShape(rows=len(step.decode), row_context=sum(self.context.get(s, 0) for s in step.decode))
            self.clock.now += self.law.seconds(rows_shape)
        if piece is not None:
            piece_shape = TickShape(len(piece.tokens), piece.start)
            self.clock.now += self.law.seconds(piece_shape) - (self.law.tick if step.decode or self._decoded else 0)
        self._decoded = bool(step.decode)
        for s in step.decode:
            self.context[s] = self.context.get(s, 0) + 1
        if piece is not None:
            self.context[piece.seq_id] = piece.end
        for r in step.retire:
            self.context.pop(r.seq_id, None)
        return super().execute(step)


def make(law: Law = CPU, budget_ms=BUDGET_MS, num_slots=5):
    clock = Clock()
    runner = TimedRunner(clock, law)
    scheduler = Scheduler(policy=PrefillChunkPolicy.resolve(None), num_slots=num_slots, slot_context=16384,
                          max_queue=8, make_stream=make_stream, eos_token_ids=frozenset({EOS}), clock=clock)
    return Engine(scheduler, runner, itl_budget_ms=budget_ms, vocab_size=400), runner, clock


def admit_next_to_streams(engine, clock, prompt_tokens: int, streams: int = 4):
    """Streams decode; then one long prompt is admitted. Returns (tick seconds, prompt pieces) of the admission."""
    for i in range(streams):
        engine.add_request(request(f"s{i}", 32, max_tokens=100_000, start=1000 * i + 1))
    while len(engine.scheduler.running) < streams:
        engine.step()
    engine.add_request(request("long", prompt_tokens, max_tokens=2, start=50_000))
    ticks, pieces = [], []
    while not any(e for e in pieces if e.processed == prompt_tokens):
        before = clock.now
        events = engine.step()
        ticks.append(clock.now - before)
        pieces += [e for e in events if isinstance(e, PromptProgress) and e.request_id == "long"]
    return ticks, pieces


def test_prepare_calibrates_on_the_runner_and_installs_the_budget_policy():
    engine, runner, _ = make()
    engine.prepare()
    policy = engine.scheduler.policy
    assert isinstance(policy, BudgetChunkPolicy) and policy.budget_ms == BUDGET_MS and policy.model.ready
    assert not runner.rows and not runner.context  # every scratch sequence is retired
    assert engine.stats().budget is not None and engine.stats().budget.budget_ms == BUDGET_MS


def test_every_contended_tick_fits_the_budget_and_the_chunks_are_ladder_sizes():
    engine, runner, clock = make()
    engine.prepare()
    ticks, pieces = admit_next_to_streams(engine, clock, 6144)
    chunks = [e.chunk for e in pieces]
    assert set(chunks) <= set(ladder())
    assert max(ticks) <= BUDGET_MS / 1000.0  # the law is the one calibrated on: no surprises
    # Once the fit has seen a few ticks, each piece is the largest size that fits: one ladder
    # step up would have broken the budget (less the small margin the fit's error leaves).
    sizes, budget_s = ladder(), BUDGET_MS / 1000.0
    for event in pieces[5:-1]:
        bigger = sizes[sizes.index(event.chunk) + 1]
        start = event.processed - event.chunk
        rows_context = 4 * 33 + 4 * pieces.index(event)  # 4 streams, one token per tick each
        assert CPU.seconds(TickShape(bigger, start, 4, rows_context)) > budget_s / 1.05, event
    assert engine.stats().budget.num_contended_ticks >= len(pieces) - 1


def test_the_policy_adapts_when_the_device_slows_down():
    engine, _, clock = make()
    engine.prepare()
    _, steady = admit_next_to_streams(engine, clock, 2048)
    engine, runner, clock = make()
    engine.prepare()
    runner.law = CPU.scaled(1.3)  # after calibration: e.g. another process takes part of a core
    ticks, slowed = admit_next_to_streams(engine, clock, 2048)
    assert max(ticks[len(ticks) // 3:]) <= BUDGET_MS / 1000.0 * 1.05  # settled within a few ticks
    assert sum(e.chunk for e in slowed) / len(slowed) < sum(e.chunk for e in steady) / len(steady)
    assert engine.stats().budget.model.speed_factor > 1.15


def test_without_a_budget_the_engine_keeps_2048_and_512():
    engine, _, clock = make(budget_ms=None)
    engine.prepare()
    assert engine.scheduler.policy == PrefillChunkPolicy(2048, 512)
    _, pieces = admit_next_to_streams(engine, clock, 3000)
    assert [e.chunk for e in pieces] == [512] * 6 and engine.stats().budget is None


def test_the_budget_and_its_fit_are_in_the_metrics():
    from prometheus_client.parser import text_string_to_metric_families

    from mlxcel_py.server.http.metrics import ServerMetrics

    engine, _, clock = make()
    engine.prepare()
    admit_next_to_streams(engine, clock, 512)
    metrics = ServerMetrics(engine.stats, lambda: "tiny")
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["mlxcel_itl_budget_seconds"].samples[0].value == 0.3
    features = {s.labels["feature"] for s in families["mlxcel_cost_model_coefficient"].samples}
    assert features == {"tick", "piece", "tokens", "tokens_x_context", "tokens_sq", "rows", "row_context",
                        "fused_piece", "fused_tokens"}
    assert families["mlxcel_itl_budget_contended_ticks"].samples[0].value >= 1
    assert 0 <= families["mlxcel_cost_model_recent_error"].samples[0].value < 0.05
    assert {s.labels["state"] for s in families["mlxcel_itl_budget_chunk_tokens"].samples} == {"alone", "contended"}
