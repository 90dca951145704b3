"""The fused native decode step (models/cpu/fused_step.py, quant/step.py) against NativeDecoder's
per-product step, and its atomic counters."""

from pathlib import Path

import numpy as np
import pytest
from numba import njit, prange

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu.native import NativeDecoder, blocks_of, native_decoder_for
from mlxcel_py.models.cpu.fused_step import FusedDecoder, decoder_for
from mlxcel_py.models.cpu.quant import int8_ir, products, kquant_r8, step
from mlxcel_py.models.cpu.quant.atomics import FUTEX, count_done, fetch_add, load_acquire, wait_at_least

from test_cpu_decode import make_batch, prompt
from test_cpu_decode_native import INT8, _greedy
from tiny import write_tiny_gguf

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
avx2 = pytest.mark.skipif(not int8_ir.HAS_AVX2, reason="the fused step runs the AVX2 int8 kernel")


def _run(decoder, lm, prompts, steps, tokens=None):
    """Logits of `steps` greedy steps from the prompts' caches (or of the given token rows), and the caches."""
    caches, out = make_batch(lm.model, prompts), []
    rows = [p[-1] for p in prompts]
    for s in range(steps):
        logits = np.array(decoder(rows, caches))
        out.append(logits)
        rows = tokens[s] if tokens else logits.argmax(-1).tolist()
    return out, caches


def _native_pair(name, threads=1, monkeypatch=None):
    """(the default load, its path, the per-product step over the file's blocks); with `monkeypatch` llama's
    q/k stay the loader's copies in the file's layout (not repacked: int8 activations whatever the test forces)."""
    if monkeypatch is not None:
        from mlxcel_py.models import gguf

        monkeypatch.setattr(gguf, "repack_block_layers", lambda model, copies=False: 0)
    path = FIXTURES / f"{name}.gguf"
    lm = load_model(str(path), threads=threads)
    return lm, path, NativeDecoder(lm.model, blocks_of(lm.model, path), threads)


@pytest.mark.skipif(not kquant_r8.AVAILABLE, reason="the repacked Q4_K product is AVX2 and FMA code")
def test_the_step_reads_every_k_quant_matrix_repacked_and_the_q_k_copies_are_dropped():
    """gate, up and o (Q4_K), v and down (Q6_K) are views of the mapped file: repacked eight rows at a
    time by the step's plan (their pages dropped); llama's q and k are copies (the file's row order
    undone), repacked at load into their layers' r8 and the copies dropped; a prompt's last position
    reads the LM head in the file's layout: kblock's product reads it as it is."""
    lm, _, native = _native_pair("llamaq-q4_k_m")
    types = lm.cpu_decode._weights[1][:, 0].tolist()
    layers = len(native._layers)
    assert types.count(kquant_r8.QTYPE) == 5 * layers and types.count(kquant_r8.Q4_K) == 0
    assert types.count(kquant_r8.Q6_K_QTYPE) == 2 * layers and types[-1] == kquant_r8.Q6_K  # the head last
    tasks = lm.cpu_decode._weights[0]
    repacked = np.isin(tasks[:, 0], np.flatnonzero(np.isin(types, list(kquant_r8.REPACKED.values()))))
    assert repacked.any() and not (tasks[repacked, 1:] % kquant_r8.ROWS).any()  # whole groups a task
    for layer in lm.model.model.layers:
        attn = layer.self_attn
        assert all(m.r8 is not None and m.blocks is None for m in (attn.q_proj, attn.k_proj))
        assert all(m.r8 is None and m.blocks is not None for m in (attn.v_proj, attn.o_proj))


@avx2
@pytest.mark.parametrize("name", ["llama-q8_0", "llamaq-q4_k_m", "llamaq-q6_k", "qwen2-q8_0"])
def test_fused_step_equals_native_per_product_step_within_int8_rounding(name):
    """NativeDecoder's per-product step is the reference; qwen2's adds its q/k/v bias there through
    arch_kernels.attention_part, the fused step in its RoPE phase."""
    lm, _, native = _native_pair(name)
    assert type(lm.cpu_decode) is FusedDecoder and lm.cpu_decode.fused
    biases = lm.cpu_decode._weights[-1]
    assert biases.shape == ((2, 128) if name.startswith("qwen2") else (len(native._layers), 0))
    assert not name.startswith("qwen2") or np.abs(biases).max() > 0.15
    prompts = [prompt(9, 0), prompt(20, 1), prompt(3, 2)]
    want, theirs = _run(native, lm, prompts, 5)
    got, ours = _run(lm.cpu_decode, lm, prompts, 5, [w.argmax(-1).tolist() for w in want])
    # the same kernels, but numba's cached and fresh builds round a few products 1 ulp apart
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, want)) < INT8
    for a, b in zip(ours, theirs):  # KV written in place where NativeDecoder writes it, offsets advanced alike
        np.testing.assert_allclose(np.array(a.keys), np.array(b.keys), atol=INT8)
        assert a.offset.tolist() == b.offset.tolist() and a._idx == b._idx


@avx2
def test_the_qwen2_bias_moves_the_logits_past_the_int8_tolerance():
    """The comparison above can see a lost bias: without it the fused step is INT8 away from NativeDecoder."""
    lm, path, native = _native_pair("qwen2-q8_0")
    fused = FusedDecoder(lm.model, blocks_of(lm.model, path), 1)
    fused._weights = (*fused._weights[:-1], np.zeros_like(fused._weights[-1]))
    prompts = [prompt(9, 0), prompt(20, 1)]
    want, _ = _run(native, lm, prompts, 3)
    got, _ = _run(fused, lm, prompts, 3, [w.argmax(-1).tolist() for w in want])
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, want)) > 3 * INT8


@avx2
def test_fused_step_gives_the_same_bits_on_one_and_two_threads():
    lm, path, _ = _native_pair("llamaq-q4_k_m")
    one, two = (FusedDecoder(lm.model, blocks_of(lm.model, path), t) for t in (1, 2))
    for n in (5, 13):  # 5 rows: product tasks of 4 + 1 rows; 13: row-wise phases in 3 tasks (step.row_tasks)
        prompts = [prompt(3 + (7 * i) % 19, i) for i in range(n)]
        got, _ = _run(two, lm, prompts, 4)
        want, _ = _run(one, lm, prompts, 4, [g.argmax(-1).tolist() for g in got])
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert step.row_tasks(5) == 1 and step.row_tasks(13) == 3


@avx2
def test_fused_step_over_contexts_crossing_attention_chunks_equals_native_on_one_and_two_threads():
    """One row at 600 positions is three 256-position attention items per KV head: the fused step's
    merge gives NativeDecoder's per-product attention, and the same bits on one and two threads."""
    lm, path, native = _native_pair("llamaq-q4_k_m")
    one, two = (FusedDecoder(lm.model, blocks_of(lm.model, path), t) for t in (1, 2))
    for prompts in ([prompt(600, 0)], [prompt(254, 1), prompt(520, 2)]):
        want, _ = _run(native, lm, prompts, 3)
        tokens = [w.argmax(-1).tolist() for w in want]
        got1, _ = _run(one, lm, prompts, 3, tokens)
        got2, _ = _run(two, lm, prompts, 3, tokens)
        assert all(np.array_equal(a, b) for a, b in zip(got1, got2))
        assert max(float(np.abs(g - w).max()) for g, w in zip(got1, want)) < INT8


@avx2
def test_loader_selects_the_fused_step_for_llama_and_a_forced_candidate_goes_per_product(monkeypatch):
    lm, path, native = _native_pair("llama-q8_0", monkeypatch=monkeypatch)
    assert type(decoder_for(lm.model, path, 1)) is FusedDecoder
    assert type(native_decoder_for(lm.model, path, 1)) is NativeDecoder  # the per-product step, asked for
    monkeypatch.setattr(products, "linear", products.linear_vector)  # float activations: NativeDecoder's path
    got, _ = _run(lm.cpu_decode, lm, [prompt(9, 0)], 2)
    want, _ = _run(native, lm, [prompt(9, 0)], 2)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_float32_parts_keep_the_per_product_step(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    lm = load_model(str(path), threads=1, cpu_weights="f32")
    fused, native = FusedDecoder(lm.model, blocks_of(lm.model, path), 1), NativeDecoder(lm.model, blocks_of(lm.model, path), 1)
    assert not fused.fused
    got, _ = _run(fused, lm, [prompt(9, 0), prompt(4, 1)], 2)
    want, _ = _run(native, lm, [prompt(9, 0), prompt(4, 1)], 2)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@njit(parallel=True, cache=False)
def _chain(n, threads, busy):  # pragma: no cover - jitted
    """Task i waits for task i - 1 to finish: every claimed task runs once, in order. Each task first
    spins `busy` iterations, so that with a large `busy` the waiter outlasts its spins and sleeps."""
    counters, order, work = np.zeros(32, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    for _ in prange(threads):
        while True:
            i = fetch_add(counters, 0, 1)
            if i >= n:
                break
            wait_at_least(counters, 16, i, 8)
            for k in range(busy):
                work[i] = (work[i] * 31 + k) % 1000003
            order[i] = fetch_add(counters, 24, 1)
            count_done(counters, 16, 8)
    return order, load_acquire(counters, 16), load_acquire(counters, 9), load_acquire(counters, 8)


@pytest.mark.parametrize("threads", [1, 2])
def test_atomic_counters_claim_each_task_once_and_wait_in_order(threads):
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    order, done, _, asleep = _chain(2000, threads, 0)
    assert done == 2000 and order.tolist() == list(range(2000)) and asleep == 0


@pytest.mark.skipif(not FUTEX, reason="waiters sleep on a futex on Linux only")
def test_a_long_wait_sleeps_on_the_counter_and_is_woken_in_order():
    """Tasks of ~2 ms: the other thread's wait outlasts its spins, so it sleeps (futex) and the
    count_done of the task it waits on wakes it; each task still runs once, in order."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads")
    numba.set_num_threads(2)  # an earlier test's one-thread decoder may have set one
    order, done, sleeps, asleep = _chain(40, 2, 2_000_000)
    assert done == 40 and order.tolist() == list(range(40))
    assert sleeps > 0 and asleep == 0


@pytest.mark.slow
@avx2
def test_default_model_fused_greedy_tokens_equal_native_and_float32():
    from mlxcel_py.models import default_model_path

    lm = load_model(None, threads=2)
    assert type(lm.cpu_decode) is FusedDecoder and lm.cpu_decode.fused
    ids = lm.tokenizer.encode("The capital of France is Paris. The capital of Germany is")
    native = NativeDecoder(lm.model, blocks_of(lm.model, Path(default_model_path())), 2)
    f32 = load_model(None, threads=1, cpu_weights="f32")
    assert _greedy(lm, lm.cpu_decode, ids, 16) == _greedy(lm, native, ids, 16) == _greedy(f32, f32.cpu_decode, ids, 16)


_NAN_STEP = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from mlxcel_py.models import load_model
from mlxcel_py.models.cpu.native import blocks_of
from mlxcel_py.models.cpu.fused_step import FusedDecoder
from test_cpu_decode import make_batch, prompt
from pathlib import Path
import mlx.core as mx
lm = load_model(sys.argv[1], threads=2)
decoder = FusedDecoder(lm.model, blocks_of(lm.model, Path(sys.argv[1])), 2)
caches = make_batch(lm.model, [prompt(9, 0), prompt(20, 1), prompt(3, 2)])
for c in caches:  # an overflowed prompt: every score NaN, so every chunk's softmax sums to nothing
    c.keys = mx.full(c.keys.shape, float("nan"))
logits = np.array(decoder([1, 2, 3], caches))
print("returned", logits.shape)
"""


@avx2
def test_a_step_over_nan_keys_returns_instead_of_hanging_its_threads(tmp_path):
    """NaN keys (a prompt whose activations overflowed) leave every softmax empty, a 0/0 in the
    partials' merge: with Python's error model the raising thread never counted its task done and the
    other waited forever. The step returns on two threads; a child process runs it, so
    that a regression fails instead of hanging the suite."""
    import subprocess
    import sys

    script = tmp_path / "nan_step.py"
    script.write_text(_NAN_STEP)
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, str(script), str(FIXTURES / "llama-q8_0.gguf"), tests],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "returned (3, 400)"  # three rows of the fixture vocabulary's logits


def test_product_tasks_are_about_task_bytes_and_at_least_min_tasks_a_product():
    from mlxcel_py.models.cpu import fused_step as F

    assert F.task_rows(16384, 1152) == F.TASK_BYTES // 1152  # the 1B's gate/up rows: ~512 KiB a task
    assert F.task_rows(2048, 1152) == 2048 // F.MIN_TASKS  # a small product still splits 16 ways
    assert F.task_rows(64, 360) == 16 and F.task_rows(10, 10**7) == 16  # never under 16 rows
    assert F.task_rows(49152, 1680) == F.TASK_BYTES // 1680


@avx2
def test_only_the_inputs_a_k_quant_product_reads_are_quantized_per_256():
    from mlxcel_py.models.cpu.quant.kblock import KBLOCK_TYPES

    from mlxcel_py.models.loader import default_model_path

    # the default model is Q4_1: its FFN input (1,536 wide) is a multiple of 256 that no K-quant product reads
    for path, read in ((default_model_path(), (False, False, False)), (FIXTURES / "llamaq-q4_k_m.gguf", (True, True, True))):
        lm = load_model(str(path))
        decoder = lm.cpu_decode
        expected = tuple(r and bool(KBLOCK_TYPES) for r in read)
        assert decoder._kblock_inputs == expected
        _, sets = decoder._new_acts(2, head=True)
        assert [s[4].shape[1] > 0 for s in sets] == [e and s[0].shape[1] % 256 == 0 for e, s in zip(expected, sets)]
