"""One forward per tick (engine/runner/tick.py, models/cpu/tick.py): the decode rows and a prefill
piece in one batch give the tokens of today's separate forwards (a decode step, then the piece)."""

import numpy as np
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step
from mlxcel_py.engine.runner.model_runner import ModelRunner

from config_helpers import flags_for
from kv_models import prompt, run_engine
from tiny import tiny_model


@pytest.fixture(scope="module", params=["tiny", "qwen2-f16"])
def lm(request):
    """The tiny float32 llama, and a qwen2 GGUF (a q/k/v bias; float16 blocks, the per-product step)."""
    if request.param == "tiny":
        return tiny_model()
    from pathlib import Path

    from mlxcel_py.models import load_model

    return load_model(str(Path(__file__).parent / "fixtures" / "gguf" / f"{request.param}.gguf"), threads=1)


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, **kw)


def runner_for(lm, fuse):
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, verify=lm.cpu_decode.verify)
    runner.fuse_max_tokens = fuse
    return runner


def ticks(runner, chunk):
    """Two rows decode while a 90-token prompt prefills in `chunk`-token pieces, a snapshot taken
    mid-way, then all three decode; each tick's tokens and logprobs."""
    trace = []
    for sid, n in ((1, 30), (2, 11)):
        out = runner.execute(Step(prefill=PrefillPiece(sid, 0, prompt(n, sid), n, True, None,
                                                       BeginSequence(greedy(40, logprobs=True), ()))))
        trace.append(out.first_token)
    ids = prompt(90, 3)
    for start in range(0, len(ids), chunk):
        end = min(len(ids), start + chunk)
        begin = BeginSequence(greedy(40), ()) if start == 0 else None
        snap = 7 if start == chunk else None
        out = runner.execute(Step(decode=(2, 1), prefill=PrefillPiece(3, start, ids[start:end], end, end == len(ids),
                                                                      snap, begin)))
        trace.append((out.decoded, out.first_token, [round(lp.logprob, 3) for lp in out.decoded_logprobs]))
    for _ in range(4):
        trace.append(runner.execute(Step(decode=(1, 2, 3))).decoded)
    trace.append(runner._snapshot_layers(7)[0].offset)
    return trace


@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_fused_ticks_equal_the_separate_forwards(lm, chunk):
    fused, separate = runner_for(lm, 128), runner_for(lm, 0)
    calls = []
    fused._fused_tick = (lambda original: lambda step: calls.append(1) or original(step))(fused._fused_tick)
    assert ticks(fused, chunk) == ticks(separate, chunk)
    assert len(calls) == -(-90 // chunk)  # every piece rode with the decode rows


def test_a_fused_decode_row_gets_the_logits_it_gets_alone(lm):
    fused, alone = runner_for(lm, 128), runner_for(lm, 0)
    for r in (fused, alone):
        for sid, n in ((1, 30), (2, 11), (3, 9), (4, 17)):
            r.execute(Step(prefill=PrefillPiece(sid, 0, prompt(n, sid), n, True, None, BeginSequence(greedy(9), ()))))
    import mlx.core as mx

    seen = {}
    for name, r in (("fused", fused), ("alone", alone)):
        original = r._sample
        r._sample = lambda logits, ids, o=original, k=name: seen.setdefault(k, []).append(np.array(logits)) or o(logits, ids)
        r.execute(Step(decode=(1, 2, 3, 4), prefill=PrefillPiece(9, 0, prompt(20, 9), 20, False, None,
                                                                  BeginSequence(greedy(9), ()))))
    np.testing.assert_array_equal(seen["fused"][0], seen["alone"][0])
    assert mx is not None


def test_the_engine_with_small_pieces_matches_each_request_alone(lm):
    # one forward per tick in the engine: each request's tokens are the ones it gets alone
    cfg = lambda **kw: resolve("serve", flags_for("serve", parallel=3, ctx_size=3 * 256, prefill_chunk_size=16, **kw),
                               env={}).engine  # noqa: E731
    requests = [Request(f"r{i}", prompt(n, i), greedy(12)) for i, n in enumerate((70, 33, 120))]
    engine = build_engine(cfg(), lm)
    calls = []
    engine.runner._fused_tick = (lambda original: lambda step: calls.append(1) or original(step))(engine.runner._fused_tick)
    together = run_engine(engine, requests)
    assert len(calls) >= 8  # the later prompts' pieces rode with the decode rows
    for r in requests:
        alone = run_engine(build_engine(cfg(), lm), [Request(r.request_id, r.prompt_ids, greedy(12))])
        assert together[r.request_id] == alone[r.request_id], r.request_id
    assert together == run_engine(build_engine(cfg(), lm), requests)


def test_the_default_policy_keeps_separate_records(lm):
    # Its contended chunk (512) never fuses, so the piece is scheduled after the decode step's
    # finishes, as before: 512 while the stream decodes, then 2048 once it is done.
    from mlxcel_py.engine import PromptProgress

    engine = build_engine(resolve("serve", flags_for("serve", parallel=2, prompt_cache=False), env={}).engine, lm)
    assert engine.runner.one_forward and not engine._one_forward()
    engine.add_request(Request("stream", prompt(10, 1), greedy(3)))
    events = engine.step()
    engine.add_request(Request("long", prompt(3000, 2), greedy(5)))
    while engine.has_work():
        events += engine.step()
    assert [e.processed for e in events if isinstance(e, PromptProgress)] == [10, 512, 2560, 3000]
    small = build_engine(resolve("serve", flags_for("serve", parallel=2, prefill_chunk_size=64), env={}).engine, lm)
    assert small._one_forward()


def _admit_fused(runner, n=60, chunk=16, alone=16):
    """Rows 1 and 2 decode while sequence 3's n-token prompt prefills: its first `alone` tokens as a
    piece of its own, the rest in fused `chunk`-token pieces."""
    for sid, m in ((1, 30), (2, 11)):
        runner.execute(Step(prefill=PrefillPiece(sid, 0, prompt(m, sid), m, True, None, BeginSequence(greedy(9), ()))))
    ids = prompt(n, 3)
    runner.execute(Step(prefill=PrefillPiece(3, 0, ids[:alone], alone, False, None, BeginSequence(greedy(9), ()))))
    for start in range(alone, n, chunk):
        end = min(n, start + chunk)
        yield runner.execute(Step(decode=(1, 2), prefill=PrefillPiece(3, start, ids[start:end], end, end == n)))


def test_fused_pieces_write_their_kv_into_the_slot_the_sequence_joins(lm):
    runner = runner_for(lm, 128)
    seen = {}
    from mlxcel_py.engine.runner.kv_rows import RowKV

    original = RowKV.add

    def add(kv, caches, prefix=None, staged=None):
        if staged is None:  # rows 1 and 2, prefilled alone
            return original(kv, caches, prefix, staged)
        seen["span"] = list(kv.staged[staged])
        seen["caches"] = [(np.array(np.asarray(c.keys)[0, :, : c.offset]), np.array(np.asarray(c.values)[0, :, : c.offset]))
                          for c in caches]
        return original(kv, caches, prefix, staged)

    RowKV.add = add
    try:
        list(_admit_fused(runner))
    finally:
        RowKV.add = original
    assert seen["span"] == [16, 60]  # the fused ticks wrote positions 16..60; the join copies 0..16 only
    kv = runner._batch
    slot = kv.slots[runner._rows.index(3)]
    for layer, (keys, values) in enumerate(seen["caches"]):
        np.testing.assert_array_equal(kv.keys[layer][slot, :, :60], keys)
        np.testing.assert_array_equal(kv.values[layer][slot, :, :60], values)
    assert kv.staged == {}


def test_a_sequence_leaving_mid_prefill_frees_its_staged_slot(lm):
    from mlxcel_py.engine.core.step import Retire

    runner = runner_for(lm, 128)
    pieces = _admit_fused(runner, n=90)
    next(pieces), next(pieces)
    kv = runner._batch
    (slot,) = kv.staged
    assert kv.staged[slot] == [16, 48]
    runner.execute(Step(retire=(Retire(3),)))
    assert kv.staged == {} and slot not in kv.slots
    assert kv.stage(8) == slot  # free again
