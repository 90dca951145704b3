"""The distributed pieces in one process: config, shard choice, watchdog, runners over a fake link,
the worker's idle hook and lost-engine path, /health after a failure."""

from __future__ import annotations

import re
import threading
import time

import mlx.core as mx
import pytest
from typer.testing import CliRunner

from mlxcel_py.cli.app import app
from mlxcel_py.config import DistributedConfig, resolve, startup_summary
from mlxcel_py.engine import Finished, SamplingParams
from mlxcel_py.engine.distributed.link import Watchdog
from mlxcel_py.engine.distributed.runners import LeaderRunner, RankLostError, ShardRunner
from mlxcel_py.engine.runner.model_runner import ModelRunner
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step
from mlxcel_py.engine.core.worker import EngineWorker
from mlxcel_py.errors import ConfigError, ModelLoadError
from mlxcel_py.models.shard import choose_mode
from mlxcel_py.server.http.cluster import _check_ranks

from cluster_helpers import tiny_qwen2
from config_helpers import flags_for
from fakes import make_engine, request
from server_helpers import start_server, stop_server
from tiny import tiny_model

TIMEOUT = 10
GREEDY = SamplingParams(temperature=0.0)


# -- config ------------------------------------------------------------------------------------
def test_one_process_never_touches_distributed():
    assert resolve("serve", env={}).distributed is None
    assert resolve("generate", env={"MLX_RANK": "0"}).distributed is None  # each rank runs alone


def test_a_launcher_turns_it_on_and_names_the_backend():
    cfg = resolve("serve", env={"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/h.json"})
    assert cfg.distributed == DistributedConfig("auto", "ring", 60.0)
    assert "distributed auto backend=ring timeout=60s" in startup_summary(cfg)
    mpi = resolve("serve", flags_for("serve", distributed="Tensor", distributed_timeout=5),
                  env={"OMPI_COMM_WORLD_SIZE": "2"})
    assert mpi.distributed == DistributedConfig("tensor", "mpi", 5.0)


@pytest.mark.parametrize("command, kwargs, flag, message", [
    ("serve", {"distributed": "data"}, "--distributed", "must be one of auto, tensor, pipeline (got 'data')"),
    ("serve", {"distributed_timeout": 0.5}, "--distributed-timeout", "must be at least 1.0 (got 0.5)"),
    ("generate", {"distributed": "tensor"}, "--distributed", "applies to serve, not generate"),
])
def test_bad_distributed_flags(command, kwargs, flag, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        resolve(command, flags_for(command, **kwargs), env={})
    assert info.value.flag == flag


def test_cli_reports_a_bad_mode_on_one_line():
    result = CliRunner().invoke(app, ["serve", "--distributed", "data"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --distributed must be one of auto, tensor, pipeline (got 'data')"]


# -- which split --------------------------------------------------------------------------------
def test_choose_mode_for_llama():
    model = tiny_model().model  # 4 heads, 2 kv heads, 128 MLP columns, no pipeline in mlx-lm
    assert choose_mode(model, "auto", 2) == choose_mode(model, "tensor", 2) == "tensor"
    with pytest.raises(ModelLoadError, match=r"^--distributed tensor: the model has 4 attention heads, "
                       r"2 key/value heads, 128 MLP columns, not divisible by 3 ranks$"):
        choose_mode(model, "tensor", 3)
    with pytest.raises(ModelLoadError, match="mlx-lm has no pipeline split for llama models"):
        choose_mode(model, "pipeline", 2)
    with pytest.raises(ModelLoadError, match="not divisible by 3 ranks, and mlx-lm has no pipeline split"):
        choose_mode(model, "auto", 3)


def test_choose_mode_for_qwen2_falls_back_to_pipeline():
    model = tiny_qwen2()  # 3 layers
    assert choose_mode(model, "auto", 2) == "tensor"
    assert choose_mode(model, "auto", 3) == choose_mode(model, "pipeline", 2) == "pipeline"
    with pytest.raises(ModelLoadError, match="not divisible by 3 ranks; try --distributed pipeline"):
        choose_mode(model, "tensor", 3)
    with pytest.raises(ModelLoadError, match="3 layers cannot be split over 4 ranks"):
        choose_mode(model, "pipeline", 4)


def test_rank_handshake_errors():
    ok = {"ok": True, "mode": "tensor", "holds": "", "bytes": 1, "model": [64, 2, 4, 2, 128, 400]}
    _check_ranks([ok, ok])
    with pytest.raises(ModelLoadError, match=r"^cannot serve on every rank: rank 1: model path not found: /x$"):
        _check_ranks([ok, {"ok": False, "error": "model path not found: /x"}])
    with pytest.raises(ModelLoadError, match=r"different models .* rank 1 \(64, 3, 4, 2, 128, 400\)"):
        _check_ranks([ok, {**ok, "model": [64, 3, 4, 2, 128, 400]}])


# -- watchdog -----------------------------------------------------------------------------------
def test_watchdog_reports_an_overrun_once_and_nothing_else():
    fired: list = []
    done = threading.Event()
    dog = Watchdog(lambda what, s: (fired.append((what, s)), done.set()), tick_s=0.02)
    with dog.guard("quick", 5.0):
        pass
    with dog.guard("stuck", 0.1):
        assert done.wait(TIMEOUT)
    assert len(fired) == 1 and fired[0][0] == "stuck" and fired[0][1] >= 0.1


# -- runners over a fake link -------------------------------------------------------------------
class FakeLink:
    """Rank `rank` of a group whose rank 0 samples `forced` (when given) instead of what it computed."""

    def __init__(self, rank: int = 0, forced=None, fail: bool = False):
        self.rank, self.size, self.forced, self.fail = rank, 2, forced, fail
        self.sent: list = []

    def send(self, record) -> None:
        if self.fail:
            raise RuntimeError("[ring] connection to a peer was lost")
        self.sent.append(record)

    def share_tokens(self, tokens, count):
        if self.forced is not None:
            return mx.array(self.forced.pop(0)[:count], dtype=mx.int32)
        return tokens.astype(mx.int32).reshape(count)


def steps_for(prompts: dict[int, tuple[int, ...]], decode_steps: int) -> list[Step]:
    begin = BeginSequence(GREEDY, ())
    out = [Step(prefill=PrefillPiece(s, 0, p, 512, True, None, begin)) for s, p in prompts.items()]
    out += [Step(decode=tuple(prompts))] * decode_steps
    return out + [Step(retire=tuple(Retire(s) for s in prompts))]


def outputs(runner, steps):
    return [runner.execute(s) for s in steps]


def test_shard_runner_on_rank_0_equals_the_plain_runner():
    model, steps = tiny_model().model, steps_for({1: (5, 6, 7), 2: (9, 10)}, 4)
    assert outputs(ShardRunner(model, FakeLink(0)), steps) == outputs(ModelRunner(model), steps)


def test_a_follower_feeds_back_rank_0s_tokens_not_its_own():
    model, steps = tiny_model().model, steps_for({1: (5, 6, 7)}, 3)
    forced = [[11], [12], [13], [14]]  # what "rank 0" sampled, whatever this rank's logits say
    got = outputs(ShardRunner(model, FakeLink(1, forced=list(forced))), steps)
    assert [got[0].first_token] + [o.decoded[0] for o in got[1:4]] == [11, 12, 13, 14]
    # Handed the tokens this rank would have sampled itself, it runs exactly like one process.
    plain = outputs(ModelRunner(model), steps)
    own = [[plain[0].first_token]] + [list(o.decoded) for o in plain[1:4]]
    assert outputs(ShardRunner(model, FakeLink(1, forced=own)), steps) == plain


def test_leader_broadcasts_each_record_and_pings_only_when_idle_long_enough():
    link = FakeLink(0)
    leader = LeaderRunner(tiny_model().model, link, timeout_s=30, keepalive_s=0.2)
    steps = steps_for({1: (5, 6)}, 1)
    outputs(leader, steps)
    assert [r[0] for r in link.sent] == ["step"] * 3 and [r[1] for r in link.sent] == steps
    leader.idle()
    assert len(link.sent) == 3  # just sent: no ping yet
    time.sleep(0.25)
    leader.idle()
    assert link.sent[-1] == ("ping", None)
    leader.close()
    assert link.sent[-1] == ("stop", None)


def test_a_lost_rank_is_reported_once_and_every_later_record_refused():
    link = FakeLink(0, fail=True)
    leader = LeaderRunner(tiny_model().model, link, timeout_s=30)
    lost: list[str] = []
    leader.on_lost = lost.append
    with pytest.raises(RankLostError, match="lost during a step: \\[ring\\] connection to a peer was lost"):
        leader.execute(Step(decode=()))
    link.fail = False
    with pytest.raises(RankLostError):
        leader.idle()
    assert len(lost) == 1 and link.sent == []
    leader.close()  # no stop record to a group already broken
    assert link.sent == []


def test_a_stalled_record_trips_the_watchdog():
    lost = threading.Event()
    link = FakeLink(0)
    leader = LeaderRunner(tiny_model().model, link, timeout_s=0.2)
    leader.on_lost = lambda message: lost.set() if "no answer from the other ranks" in message else None
    release = threading.Event()
    link.send = lambda record: release.wait(TIMEOUT)  # a peer that never joins the collective
    raised: list = []

    def run() -> None:
        try:
            leader.execute(Step())
        except RankLostError as exc:
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert lost.wait(TIMEOUT)
    release.set()  # the peer answers after all: the record it finished is not trusted either
    worker.join(TIMEOUT)
    assert len(raised) == 1 and "no answer from the other ranks for 0." in str(raised[0])


# -- worker, engine and server ------------------------------------------------------------------
def test_worker_pings_while_idle_and_ends_requests_when_the_engine_is_lost():
    engine, runner = make_engine(num_slots=2, slot_context=100_000)
    pinged = threading.Event()
    runner.idle = pinged.set
    engine.idle = runner.idle  # bound at construction, like a distributed runner's
    worker = EngineWorker(engine).start()
    try:
        assert pinged.wait(TIMEOUT)
        calls: list = []

        def lost(step):
            calls.append(step)
            raise RankLostError("a distributed rank was lost during a step: gone")

        runner.execute = lost
        handle = worker.submit(request("a", 5, max_tokens=10))
        events = [handle.get(timeout=TIMEOUT) for _ in range(1)]
        while not isinstance(events[-1], Finished):
            events.append(handle.get(timeout=TIMEOUT))
        assert events[-1].finish_reason == "error" and events[-1].error.endswith("during a step: gone")
        assert len(calls) == 1  # no abort pass that would touch the lost ranks again
    finally:
        worker.stop()


def test_health_and_requests_report_a_failed_engine():
    server = start_server()
    try:
        server.runtime.fail("a distributed rank was lost during a step: gone")
        with server.client() as client:
            health = client.get("/health")
            assert health.status_code == 503
            assert health.json() == {"status": "error", "error": "a distributed rank was lost during a step: gone"}
            response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert response.status_code == 503 and response.json()["error"]["code"] == "engine_error"
    finally:
        stop_server(server)
