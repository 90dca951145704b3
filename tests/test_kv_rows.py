"""The engine's own decode KV (engine/runner/kv_rows.py) against mlx-lm's BatchKVCache layout:
the same tokens and logits, a join that copies only the new row, a leave that copies nothing."""

import numpy as np
import pytest

from mlxcel_py.engine.core.request import SamplingParams
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step
from mlxcel_py.engine.runner.kv_rows import RowKV
from mlxcel_py.engine.runner.model_runner import ModelRunner

from config_helpers import flags_for
from kv_models import prompt
from tiny import tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, **kw)


def begin(runner, sid, ids, params=None, chunk=512):
    """Prefill `ids` in `chunk`-token pieces; the first token."""
    out = None
    for start in range(0, len(ids), chunk):
        end = min(len(ids), start + chunk)
        first = BeginSequence(params or greedy(8), ()) if start == 0 else None
        out = runner.execute(Step(prefill=PrefillPiece(sid, start, ids[start:end], end - start, end == len(ids),
                                                       None, first)))
    return out.first_token


def scenario(runner, chunk=512):
    """Ragged joins and leaves, a reorder, a verified draft: every step's tokens and last logprobs
    (prompts in `chunk`-token pieces; the 300-token one in 128-token ones, or `chunk` if smaller)."""
    trace = [begin(runner, 1, prompt(40, 1), chunk=chunk), begin(runner, 2, prompt(9, 2), chunk=chunk)]
    for _ in range(3):
        trace.extend(runner.execute(Step(decode=(1, 2))).decoded)
    trace.append(begin(runner, 3, prompt(300, 3), greedy(8, logprobs=True, top_logprobs=2), chunk=min(chunk, 128)))
    for _ in range(2):
        out = runner.execute(Step(decode=(3, 1, 2)))
        trace.extend(out.decoded)
        trace.append([(lp.token_id, round(lp.logprob, 4)) for lp in out.decoded_logprobs if lp is not None])
    out = runner.execute(Step(retire=(Retire(1),), decode=(2, 3), drafts=((5, 6, 7), ())))
    trace.extend(out.decoded + tuple(out.decoded_extra))
    trace.append(begin(runner, 4, prompt(20, 4), chunk=chunk))
    for _ in range(3):
        trace.extend(runner.execute(Step(decode=(4, 3, 2))).decoded)
    return trace


def test_rows_decode_token_exact_with_the_batch_layout(lm):
    ours = ModelRunner(lm.model, decode=lm.cpu_decode, verify=lm.cpu_decode.verify, kv_rows=True)
    theirs = ModelRunner(lm.model, decode=lm.cpu_decode, verify=lm.cpu_decode.verify, kv_rows=False)
    assert scenario(ours) == scenario(theirs)
    assert isinstance(ours._batch, RowKV) and not isinstance(theirs._batch, RowKV)


def test_the_runner_picks_rows_for_the_cpu_decode_step(lm):
    assert ModelRunner(lm.model, decode=lm.cpu_decode)._owned
    assert not ModelRunner(lm.model)._owned  # mlx-lm's forward keeps its BatchKVCache


def test_a_join_copies_only_the_new_row_and_a_leave_nothing(lm):
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kv_rows=True)
    begin(runner, 1, prompt(30, 1))
    begin(runner, 2, prompt(12, 2))
    runner.execute(Step(decode=(1, 2)))
    kv = runner._batch
    buffers = kv.keys[0]
    row1 = buffers[kv.slots[0]].copy()
    begin(runner, 3, prompt(50, 3))
    assert kv.keys[0] is buffers and kv.lengths == [31, 13, 50]
    np.testing.assert_array_equal(buffers[kv.slots[0]], row1)  # untouched by the join
    runner.execute(Step(retire=(Retire(2),)))
    assert kv.keys[0] is buffers and kv.lengths == [31, 50] and kv.slots == [0, 2]
    begin(runner, 4, prompt(5, 4))
    assert kv.slots == [0, 2, 1]  # the freed slot is reused


def test_rows_grow_past_their_capacity_and_slots(lm):
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kv_rows=True)
    ref = ModelRunner(lm.model, decode=lm.cpu_decode, kv_rows=False)
    ids = {s: prompt(n, s) for s, n in ((1, 20), (2, 1030), (3, 7), (4, 9), (5, 11))}
    got = [begin(runner, s, p, chunk=256) for s, p in ids.items()]
    want = [begin(ref, s, p, chunk=256) for s, p in ids.items()]
    for _ in range(3):
        got.extend(runner.execute(Step(decode=tuple(ids))).decoded)
        want.extend(ref.execute(Step(decode=tuple(ids))).decoded)
    assert got == want
    assert runner._batch.capacity == 2048 and runner._batch.keys[0].shape[0] == 8


def test_a_snapshot_of_a_row_is_a_private_copy(lm):
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kv_rows=True)
    begin(runner, 1, prompt(16, 1))
    runner.execute(Step(decode=(1,)))
    snap = runner._extract(0, 10)
    before = np.array(snap[0].keys)
    assert snap[0].offset == 10 and before.shape[2] == 10
    for _ in range(3):
        runner.execute(Step(decode=(1,)))
    np.testing.assert_array_equal(np.array(snap[0].keys), before)
    with pytest.raises(RuntimeError, match="snapshot of 99 tokens asked, but the row holds 20"):
        runner._extract(0, 99)


def test_the_fused_native_step_runs_over_the_rows_and_its_prompts_too(monkeypatch):
    """The default CPU path (a llama GGUF's blocks, cpu_step_native.FusedDecoder): the rows' decode
    steps and verifies go through its one-call step, and so do the prompts' pieces (a row per
    position: engine/runner/row_prefill.py), so the tokens do not depend on how a prompt is cut."""
    from pathlib import Path

    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.fused_step import FusedDecoder
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    fixture = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llama-q8_0.gguf"), threads=1)
    decoder = fixture.cpu_decode
    assert type(decoder) is FusedDecoder and decoder.fused
    calls, prompts = [], []
    step_rows, run_rows = decoder.step_rows, decoder.run_rows
    monkeypatch.setattr(decoder, "step_rows", lambda *a: calls.append((len(a[0]), a[6])) or step_rows(*a))
    # a prompt piece names the rows whose logits it wants (a[6:]); step_rows (decode, verify) wants every row's
    monkeypatch.setattr(decoder, "run_rows", lambda *a: (len(a) > 6 and prompts.append(len(a[0]))) or run_rows(*a))
    ours = ModelRunner(fixture.model, decode=decoder, verify=decoder.verify, kv_rows=None)
    trace = scenario(ours)
    assert isinstance(ours._batch, RowKV)  # chosen by default for a plain llama step
    # every decode step went through the fused call: the width-1 steps of 2 and 3 rows, and the verify
    # of 2 rows x (1 + 3 drafted) positions; every prompt piece as rows (scenario's 128-token pieces)
    assert set(calls) == {(2, 1), (3, 1), (8, 4)}
    assert sorted(set(prompts)) == [9, 20, 40, 44, 128]
    cut = ModelRunner(fixture.model, decode=decoder, verify=decoder.verify, kv_rows=None)
    assert scenario(cut, chunk=7) == trace  # pieces of 7 tokens: the same rows, the same tokens


@pytest.mark.parametrize("fixture", ["qwen3-q8_0.gguf", "phi3-f16.gguf", "gemma3-f16.gguf"])
def test_every_architecture_runs_over_the_rows_token_exact_with_the_batch_layout(fixture):
    """q/k norms (qwen3), LongRoPE-free phi3, gemma3's sandwich norms, GELU, per-layer ropes and
    8-position windows: the rows (rows.attention_rows) give the batch layout's tokens."""
    from pathlib import Path

    from mlxcel_py.engine.runner.model_runner import _owns_rows
    from mlxcel_py.models import load_model

    lm = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / fixture), threads=1)
    decoder = lm.cpu_decode
    assert not decoder.spec.llama_layer and _owns_rows(decoder, None)
    ours = ModelRunner(lm.model, decode=decoder, verify=decoder.verify)
    theirs = ModelRunner(lm.model, decode=decoder, verify=decoder.verify, kv_rows=False)
    assert scenario(ours) == scenario(theirs)
    assert isinstance(ours._batch, RowKV) and not ours.one_forward  # models/cpu/tick.py runs llama's layer


def test_qwen2_runs_over_the_rows_with_its_bias_token_exact_with_the_batch_layout():
    """qwen2's layer is llama's plus a q/k/v bias (ArchSpec.llama_layer): the engine's rows run it
    (rows.qkv_rows adds the bias), with the tokens of the batch layout, whose per-product step
    adds it in arch_kernels.attention_part. Float16 blocks: the per-product NativeDecoder."""
    from pathlib import Path

    from mlxcel_py.engine.runner.model_runner import _owns_rows
    from mlxcel_py.models import load_model

    qwen2 = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "qwen2-f16.gguf"), threads=1)
    decoder = qwen2.cpu_decode
    assert decoder.spec.arch == "qwen2" and not getattr(decoder, "fused", False) and _owns_rows(decoder, None)
    ours = ModelRunner(qwen2.model, decode=decoder, verify=decoder.verify, kv_rows=True)
    theirs = ModelRunner(qwen2.model, decode=decoder, verify=decoder.verify, kv_rows=False)
    assert scenario(ours) == scenario(theirs)
    assert isinstance(ours._batch, RowKV) and not isinstance(theirs._batch, RowKV)


def test_the_fused_qwen2_step_runs_over_the_rows_and_a_prompt_cut_gives_its_tokens(monkeypatch):
    """A qwen2 Q8_0 file gets the fused step (its bias added in the RoPE phase): decode, verify and
    prompt pieces all go through it, and a prompt cut into 7-token pieces gives the same tokens."""
    from pathlib import Path

    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    qwen2 = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "qwen2-q8_0.gguf"), threads=1)
    decoder = qwen2.cpu_decode
    assert decoder.fused and decoder.runs_rows()
    widths = []
    step_rows = decoder.step_rows
    monkeypatch.setattr(decoder, "step_rows", lambda *a: widths.append(a[6]) or step_rows(*a))
    trace = scenario(ModelRunner(qwen2.model, decode=decoder, verify=decoder.verify, kv_rows=None))
    assert set(widths) == {1, 4}
    assert scenario(ModelRunner(qwen2.model, decode=decoder, verify=decoder.verify, kv_rows=None), chunk=7) == trace


def test_a_verify_span_runs_through_the_fused_step_token_identical_to_plain_decoding(monkeypatch):
    """A drafting engine on the fused GGUF step verifies its spans through the same one-call step (each
    span row its own position in its sequence's KV row), so its greedy output equals plain decoding's."""
    from pathlib import Path

    from mlxcel_py.config import resolve
    from mlxcel_py.engine import build_engine
    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.quant import int8_ir

    from test_speculative import greedy as greedy_request, run

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    fixture = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llama-q8_0.gguf"), threads=1)
    decoder = fixture.cpu_decode
    assert decoder.fused
    widths = []
    step_rows = decoder.step_rows
    monkeypatch.setattr(decoder, "step_rows", lambda *a: widths.append(a[6]) or step_rows(*a))
    ids = tuple(fixture.tokenizer.encode("one two three four five six seven eight nine ten")) * 3
    requests = [greedy_request("copy", ids, 48), greedy_request("b", prompt(9, 2), 16)]
    cfg = lambda ngram: resolve("serve", flags_for("serve", parallel=2, lookup_ngram=ngram),
                                env={}).engine  # noqa: E731
    spec = run(build_engine(cfg(3), fixture), requests)
    assert max(widths) > 1  # spans went through the fused step
    plain = run(build_engine(cfg(None), fixture), requests)
    assert {r: t for r, (t, _) in spec.items()} == {r: t for r, (t, _) in plain.items()}
    assert sum(f.timings.draft_n_accepted for _, f in spec.values()) > 0


def test_a_prompt_cut_into_row_spans_gives_the_bits_of_one_span(monkeypatch):
    """A long piece runs as several spans of rows (cpu_step_rows.WIDE_ROWS / WIDE_BYTES): the
    first token and the K/V written are those of the piece run as one span."""
    from pathlib import Path

    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu import prompt_rows as cpu_step_rows
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    fixture = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llama-q8_0.gguf"), threads=1)
    ids = prompt(300, 7)

    def first_token_and_kv(wide_rows):
        monkeypatch.setattr(cpu_step_rows, "WIDE_ROWS", wide_rows)
        runner = ModelRunner(fixture.model, decode=fixture.cpu_decode, verify=fixture.cpu_decode.verify)
        token = begin(runner, 1, ids, greedy(4, logprobs=True), chunk=300)
        return token, [np.array(k[0, :, :300]) for k in runner._batch.keys]

    whole, cut = first_token_and_kv(2048), first_token_and_kv(16)  # one span; 19 spans of 16 rows
    assert whole[0] == cut[0]
    assert all(np.array_equal(a, b) for a, b in zip(whole[1], cut[1]))


def test_the_repacked_k_quant_step_gives_the_same_tokens_cut_batched_or_alone():
    """The Q4_K_M fixture's step reads its Q4_K and Q6_K matrices repacked eight rows at a time
    (quant/kquant_r8.py): a prompt cut into 7-token pieces gives the whole prompt's trace, and two
    sequences decoded side by side the tokens each gives alone."""
    from pathlib import Path

    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.quant import kquant_r8

    if not kquant_r8.AVAILABLE:
        pytest.skip("the repacked products are AVX2 and FMA code")
    lm = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llamaq-q4_k_m.gguf"), threads=2)
    decoder = lm.cpu_decode
    assert decoder.fused and kquant_r8.QTYPE in decoder._weights[1][:, 0]

    def runner():
        return ModelRunner(lm.model, decode=decoder, verify=decoder.verify, kv_rows=None)

    trace = scenario(runner())
    assert scenario(runner(), chunk=7) == trace

    def decode(sids, steps=6):
        r = runner()
        tokens = {sid: [begin(r, sid, prompt(9 + 30 * sid, sid))] for sid in sids}
        for _ in range(steps):
            for sid, token in zip(sids, r.execute(Step(decode=tuple(sids))).decoded):
                tokens[sid].append(token)
        return tokens

    both = decode((1, 2))
    assert both[1] == decode((1,))[1] and both[2] == decode((2,))[2]


def test_the_first_idle_call_after_work_trims_the_c_heap_once(lm, monkeypatch):
    from mlxcel_py.models import footprint

    calls = []
    monkeypatch.setattr(footprint, "malloc_trim", lambda: calls.append(1))
    runner = ModelRunner(lm.model, decode=lm.cpu_decode)
    runner.idle()
    runner.idle()
    assert calls == [1]  # the load's temporaries, once
    calls.clear()
    begin(runner, 1, prompt(20, 1))
    runner.idle()
    runner.idle()
    assert calls == [1]
    runner.execute(Step(decode=(1,)))
    runner.idle()
    assert calls == [1, 1]
