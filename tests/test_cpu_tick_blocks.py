"""One forward per tick over GGUF blocks where the decoder has no fused step (models/cpu/tick.py: a
plain llama whose products go one by one, e.g. F16 matrices; here the fused step is turned off by
forcing a product candidate): the piece's attention runs on one numpy BLAS thread, with the tokens
numpy's own thread count gives. With the fused step (the default model's path) the pieces are rows of
the step itself (engine/runner/row_prefill.py; tests/test_exact_routes.py).

(On this path a fused piece's tokens may differ from the separate forward's: the piece goes through
the decode kernels' int8 activations, the separate piece through float tiles; on this fixture the
64-token piece's first token does: within the quantized path's tolerance, not bit for bit.)"""

from pathlib import Path

import pytest

from mlxcel_py.engine.runner.model_runner import ModelRunner
from mlxcel_py.models import load_model
from mlxcel_py.models.cpu import tick as cpu_tick

from test_cpu_tick import ticks


@pytest.fixture(scope="module")
def blocks():
    from mlxcel_py.models.cpu.quant import int8_ir

    if not int8_ir.HAS_AVX2:
        pytest.skip("the fused step runs the AVX2 int8 kernel")
    return load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "llama-q8_0.gguf"), threads=1)


@pytest.fixture(autouse=True)
def per_product(monkeypatch):
    """No fused step (FusedDecoder.runs_rows is false with another product candidate forced)."""
    from mlxcel_py.models.cpu.quant import products

    monkeypatch.setattr(products, "linear", products.linear_int8_vector)


def runner_for(lm, fuse):
    assert not lm.cpu_decode.runs_rows()
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kernels=lm.cpu_kernels, verify=lm.cpu_decode.verify)
    runner.fuse_max_tokens = fuse
    return runner


def test_the_piece_attention_runs_on_one_numpy_blas_thread(blocks, monkeypatch):
    from mlxcel_py.models.cpu import blas

    count = blas._numpy_set_local()
    if not count:
        pytest.skip("numpy's BLAS has no thread-local thread count")
    outside = count(1)  # numpy's own count on this thread (read by setting, then put back)
    count(outside)
    counts = []
    original = cpu_tick.causal_attention

    def spy(*a):
        counts.append(count(1))  # the count in force (set again to the same)
        return original(*a)

    monkeypatch.setattr(cpu_tick, "causal_attention", spy)
    one = ticks(runner_for(blocks, 128), 64)
    assert len(counts) == 2 * len(blocks.cpu_decode._layers) and set(counts) == {1}  # two fused pieces
    assert count(outside) == outside  # numpy's own count again after the tick
    monkeypatch.setattr(cpu_tick, "PIECE_BLAS_THREADS", None)
    assert ticks(runner_for(blocks, 128), 64) == one


def test_a_small_separate_piece_too_and_a_long_one_keeps_numpys_threads(blocks, monkeypatch):
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step
    from mlxcel_py.models.cpu import blas, prefill_kernels as cpu_kernels

    from kv_models import prompt
    from test_cpu_tick import greedy

    count = blas._numpy_set_local()
    if not count:
        pytest.skip("numpy's BLAS has no thread-local thread count")
    outside = count(1)
    count(outside)
    seen = []
    original = cpu_kernels.causal_attention

    def spy(*a):
        now = count(1)  # the count in force, put back at once
        count(now)
        seen.append((a[0].shape[1], now))
        return original(*a)

    monkeypatch.setattr(cpu_kernels, "causal_attention", spy)
    runner = runner_for(blocks, 0)
    for sid, n in ((1, 100), (2, 200)):
        runner.execute(Step(prefill=PrefillPiece(sid, 0, prompt(n, sid), n, True, None, BeginSequence(greedy(4), ()))))
    assert {q: c for q, c in seen} == {100: 1, 200: outside}
