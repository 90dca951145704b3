"""Shared prefixes over the engine's own rows (engine/runner/kv_rows.py): eight sequences with one
system prompt store its KV once, and each gives exactly the tokens and logits it gives over a
private copy, batched and alone, on the tiny model and on the fused GGUF step."""

from pathlib import Path

import numpy as np
import pytest

from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Shift, Step
from mlxcel_py.engine.runner.kv_rows import PinnedPrefix
from mlxcel_py.engine.runner.model_runner import ModelRunner
from mlxcel_py.models.footprint import mapped_resident_bytes

from config_helpers import flags_for
from kv_models import prompt
from tiny import tiny_model

SYSTEM = prompt(150, 99)
USERS = {sid: prompt(5 + 3 * sid, sid) for sid in range(1, 9)}


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


@pytest.fixture(scope="module")
def gguf():
    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    fixture = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llama-q8_0.gguf"), threads=1)
    assert fixture.cpu_decode.fused
    return fixture


def greedy(n):
    from mlxcel_py.engine.core.request import SamplingParams

    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)


def make_runner(fixture, share=True):
    runner = ModelRunner(fixture.model, decode=fixture.cpu_decode, verify=fixture.cpu_decode.verify, kv_rows=True)
    runner.share_prefixes = share
    runner.shift_mode = "rotate"
    logits = []
    sample = runner._sample
    runner._sample = lambda rows, ids: logits.append(np.array(rows)) or sample(rows, ids)
    return runner, logits


def piece(sid, start, tokens, terminal, snap=None, adopt=None):
    begin = BeginSequence(greedy(64), (), adopt) if start == 0 or adopt is not None else None
    return PrefillPiece(sid, start, tokens, len(tokens), terminal, snap, begin)


def join_all(runner, sids=tuple(USERS)):
    """Sequence 1 prefills the system prompt (a boundary snapshot, id 1) then its own part; the
    others adopt the snapshot and prefill only theirs. Their first tokens."""
    first = sids[0]
    runner.execute(Step(prefill=piece(first, 0, SYSTEM, False, snap=1)))
    out = [runner.execute(Step(prefill=piece(first, len(SYSTEM), USERS[first], True))).first_token]
    for sid in sids[1:]:
        step = Step(prefill=piece(sid, len(SYSTEM), USERS[sid], True, adopt=1))
        out.append(runner.execute(step).first_token)
    return out


def scenario(runner):
    """Joins, decode steps, a verify, a leave with a snapshot, an adoption of it, a context shift."""
    trace = join_all(runner)
    rows = tuple(USERS)
    for _ in range(3):
        trace.append(runner.execute(Step(decode=rows)).decoded)
    out = runner.execute(Step(decode=rows, drafts=((5, 6, 7),) + ((),) * 7))
    trace.append((out.decoded, out.decoded_extra))
    kept = runner._batch.lengths[rows.index(3)]
    runner.execute(Step(retire=(Retire(3, 2, kept),), decode=rows[:2] + rows[3:]))
    rows = rows[:2] + rows[3:]
    out = runner.execute(Step(prefill=piece(9, kept, USERS[1], True, adopt=2)))
    trace.append(out.first_token)
    rows = rows + (9,)
    trace.append(runner.execute(Step(shift=(Shift(2, 4, 40),), decode=rows)).decoded)
    for _ in range(2):
        trace.append(runner.execute(Step(decode=rows)).decoded)
    return trace


@pytest.mark.parametrize("which", ["tiny", "gguf"])
def test_a_shared_prefix_gives_the_tokens_and_logits_of_a_private_copy(request, which):
    fixture = request.getfixturevalue("lm" if which == "tiny" else which)
    shared, shared_logits = make_runner(fixture, share=True)
    private, private_logits = make_runner(fixture, share=False)
    assert scenario(shared) == scenario(private)
    assert len(shared_logits) == len(private_logits) > 10
    for a, b in zip(shared_logits, private_logits):
        np.testing.assert_array_equal(a, b)  # bit for bit
    assert any(p for _, p in shared._batch.prefixes)  # rows still shared at the end
    assert not any(p for _, p in private._batch.prefixes) and not private._batch.pinned


@pytest.mark.parametrize("which", ["tiny", "gguf"])
def test_a_shared_row_batched_gives_what_the_sequence_gives_alone(request, which):
    fixture = request.getfixturevalue("lm" if which == "tiny" else which)
    batched, logits = make_runner(fixture)
    trace = [join_all(batched)] + [batched.execute(Step(decode=tuple(USERS))).decoded for _ in range(3)]
    for i, sid in enumerate(USERS):
        alone, alone_logits = make_runner(fixture, share=False)  # the whole prompt, no adoption
        alone.execute(Step(prefill=piece(sid, 0, SYSTEM, False)))
        first = alone.execute(Step(prefill=piece(sid, len(SYSTEM), USERS[sid], True))).first_token
        decoded = [alone.execute(Step(decode=(sid,))).decoded[0] for _ in range(3)]
        assert [first] + decoded == [trace[0][i]] + [t[i] for t in trace[1:]]
        np.testing.assert_array_equal(alone_logits[0][0], logits[i][0])  # the first token's logits
        for step in range(3):  # the decode rows: the tiny model's float products round by batch size
            got, want = logits[8 + step][i], alone_logits[1 + step][0]  # (main's rows do the same)
            np.testing.assert_allclose(got, want, rtol=0, atol=0 if which == "gguf" else 1e-5)


def _resident(kv) -> int:
    """Resident bytes of the rows' buffers."""
    return mapped_resident_bytes({b.ctypes.data for b in kv.keys + kv.values})


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
def test_eight_sequences_with_one_system_prompt_store_it_once(lm):
    shared, _ = make_runner(lm, share=True)
    private, _ = make_runner(lm, share=False)
    join_all(shared)
    join_all(private)
    own = sum(len(u) for u in USERS.values())
    assert shared._batch.positions_stored() == len(SYSTEM) + own
    assert private._batch.positions_stored() == 8 * len(SYSTEM) + own
    per_position = sum(b[0, :, 0].nbytes for b in shared._batch.keys + shared._batch.values)
    # resident: pages of 4 KiB, each slot's positions rounded up to whole pages per (layer, kv head)
    assert _resident(shared._batch) < 2 * len(SYSTEM) * per_position + 8 * 2 * 4096 * 2 * len(lm.model.layers)
    assert _resident(private._batch) > 8 * len(SYSTEM) * per_position
    assert 2 * _resident(shared._batch) < _resident(private._batch)


def test_references_drop_and_the_slots_are_freed(lm):
    runner, _ = make_runner(lm)
    join_all(runner, (1, 2, 3))
    kv = runner._batch
    pinned = runner._snapshots[1]
    assert isinstance(pinned, PinnedPrefix) and kv.pinned[pinned.slot] == [len(SYSTEM), 4]  # the index + 3 rows
    assert kv.prefixes == [(pinned.slot, len(SYSTEM))] * 3  # the row that took the snapshot shares it too
    runner.execute(Step(retire=(Retire(2),)))
    assert kv.pinned[pinned.slot][1] == 3
    runner.execute(Step(drop_snapshots=(1,)))
    assert kv.pinned[pinned.slot][1] == 2 and 1 not in runner._snapshots  # rows 1 and 3 still read it
    runner.execute(Step(retire=(Retire(1), Retire(3))))
    assert kv.pinned == {} and kv.slots == [] and kv.positions_stored() == 0
    assert _resident(kv) == 0  # every page given back


def test_an_aborted_prefill_drops_its_reference(lm):
    runner, _ = make_runner(lm)
    join_all(runner, (1,))
    runner.execute(Step(prefill=PrefillPiece(2, len(SYSTEM), USERS[2][:3], 3, False, None,
                                             BeginSequence(greedy(8), (), 1))))
    pinned = runner._snapshots[1]
    assert runner._batch.pinned[pinned.slot][1] == 3
    runner.execute(Step(retire=(Retire(2),), drop_snapshots=(1,)))
    assert runner._batch.pinned[pinned.slot][1] == 1  # only sequence 1's row


def test_a_retired_rows_snapshot_is_its_slot_pinned_in_place(lm):
    runner, _ = make_runner(lm)
    join_all(runner, (1, 2))
    runner.execute(Step(decode=(1, 2)))
    kv = runner._batch
    slot, n = kv.slots[1], kv.lengths[1]
    want = runner._extract(1, n)
    runner.execute(Step(retire=(Retire(2, 5, n),)))
    snap = runner._snapshots[5]
    assert snap == PinnedPrefix(slot, n) and kv.pinned[slot] == [n, 1]
    got = runner._snapshot_layers(5)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.array(a.keys), np.array(b.keys))
        np.testing.assert_array_equal(np.array(a.values), np.array(b.values))


def test_eight_concurrent_requests_share_the_system_prompt_and_match_a_miss(lm):
    """Through the engine: eight requests with one system prompt (its history boundary) adopt the
    first one's boundary snapshot; their rows share it, and every reply equals the prompt cache
    off (a miss) and the private copies (main's rows)."""
    from mlxcel_py.config import resolve
    from mlxcel_py.engine import Request, build_engine

    from kv_models import run_engine

    def run(prompt_cache=True, share=True):
        engine = build_engine(resolve("serve", flags_for("serve", parallel=8, prompt_cache=prompt_cache),
                                      env={}).engine, lm)
        engine.runner.share_prefixes = share
        shared = []
        execute = engine.runner.execute
        engine.runner.execute = lambda step: (execute(step), shared.append(_sharing(engine.runner._batch)))[0]
        requests = [Request(f"r{sid}", SYSTEM + user, greedy(12), len(SYSTEM)) for sid, user in USERS.items()]
        return run_engine(engine, requests), max(shared)

    hit, sharing = run()
    assert sharing == 8  # at some tick all eight rows read one pinned slot
    miss, none = run(prompt_cache=False)
    private, copies = run(share=False)
    assert hit == miss == private and none == copies == 0


def _sharing(kv) -> int:
    """The most decode rows reading one pinned slot."""
    if kv is None or not getattr(kv, "prefixes", None):
        return 0
    counts = [sum(1 for s, n in kv.prefixes if n and s == slot) for slot in kv.pinned]
    return max(counts, default=0)


def test_a_fused_tick_adopting_a_pinned_prefix_matches_the_private_copy(lm):
    """A piece that adopts a pinned snapshot and rides with the decode rows (tick.FusedTick)."""
    traces = []
    for share in (True, False):
        runner, logits = make_runner(lm, share=share)
        join_all(runner, (1, 2))
        fused = []
        tick = runner._fused_tick
        runner._fused_tick = lambda step: fused.append(1) or tick(step)
        out = runner.execute(Step(decode=(1, 2), prefill=piece(3, len(SYSTEM), USERS[3], True, adopt=1)))
        steps = [runner.execute(Step(decode=(1, 2, 3))).decoded for _ in range(2)]
        assert fused == [1]
        traces.append(([out.decoded, out.first_token, *steps], logits))
        if share:
            assert runner._batch.prefixes[2] == (runner._snapshots[1].slot, len(SYSTEM))
    (shared, a), (private, b) = traces
    assert shared == private
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
