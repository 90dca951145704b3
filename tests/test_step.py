"""The step contract: records are plain data, the runner follows them, snapshots follow the index."""

import pickle
import random

from mlxcel_py.config import resolve
from mlxcel_py.engine import SamplingParams, build_engine
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step, StepOutput

from config_helpers import flags_for
from fakes import make_engine, request
from tiny import tiny_model


def _prompt(n, seed):
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def test_records_are_plain_data_that_survive_a_process_boundary():
    begin = BeginSequence(SamplingParams(temperature=0.7, seed=3, stop=("x",)), (1, 2), adopt_id=4)
    step = Step((Retire(1, 9, 12), Retire(2)), (3, 5), PrefillPiece(6, 2, (7, 8, 9), 512, True, None, begin), (4,))
    again = pickle.loads(pickle.dumps(step))
    assert again == step and hash(again) == hash(step)
    assert pickle.loads(pickle.dumps(StepOutput((1, 2), 3))) == StepOutput((1, 2), 3)


def test_the_runner_decodes_rows_in_the_records_order():
    lm = tiny_model()
    engine_cfg = resolve("serve", flags_for("serve", parallel=2, prompt_cache=False), env={}).engine
    greedy = SamplingParams(max_tokens=100, ignore_eos=True)

    def joined_runner():
        runner = build_engine(engine_cfg, lm).runner
        for seq_id, seed in ((1, 1), (2, 2)):
            tokens = _prompt(20 + seed, seed)
            runner.execute(Step(prefill=PrefillPiece(seq_id, 0, tokens, 0, True, None, BeginSequence(greedy, ()))))
        return runner

    a, b = joined_runner(), joined_runner()  # both batches hold rows (1, 2)
    for _ in range(3):
        forward = a.execute(Step(decode=(1, 2))).decoded
        backward = b.execute(Step(decode=(2, 1))).decoded
        assert forward == backward[::-1]


def test_the_runners_snapshots_are_exactly_the_prompt_cache_index():
    engine, runner = make_engine(num_slots=2, cache=True)
    cache = engine.scheduler.prompt_cache
    cache.max_entries = 2
    for i in range(6):  # each finish snapshots; the third evicts the first
        engine.add_request(request(f"r{i}", 10 + i, max_tokens=2, start=100 * i + 1))
        while engine.has_work():
            engine.step()
        assert set(runner.snapshots) == {e.snapshot_id for e in cache._entries.values()}
    dropped = [sid for s in runner.steps for sid in s.drop_snapshots]
    assert len(dropped) == 4 and len(set(dropped)) == 4
