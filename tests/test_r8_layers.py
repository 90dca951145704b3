"""Q4_K/Q6_K/Q5_0/Q8_0 block layers of the models the fused step does not run (gemma3, qwen3, phi3) read their rows
repacked eight at a time (models/cpu/quant/r8_layers.py): in the prompt's forward and in the decode step,
within int8 rounding of the file's blocks through float32 tiles, each row's bits independent of the batch
and the thread count, and the engine's rows token-exact with the batch layout over them."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import write_other  # noqa: E402
from mlxcel_py.models.cpu.quant import kquant_r8  # noqa: E402

pytestmark = pytest.mark.skipif(not kquant_r8.AVAILABLE, reason="the repacked products need AVX2 and FMA")


@pytest.fixture(scope="module", params=["gemma3", "qwen3", "phi3"])
def lm(request, tmp_path_factory):
    from mlxcel_py.models import load_model

    out = tmp_path_factory.mktemp("r8") / f"{request.param}.gguf"
    gemma = request.param == "gemma3"  # six layers: mlx-lm indexes its sixth cache (the pattern of 6)
    write_other(out, request.param, (6 if gemma else 2, 256, 512, 4, 1 if gemma else 2, 64))
    return load_model(str(out), threads=2)


def _block_layers(lm):
    from mlxcel_py.models.gguf_blocks import BlockLinear

    return [(n, m) for n, m in lm.model.named_modules() if isinstance(m, BlockLinear)]


def test_the_repackable_layers_are_repacked_and_the_others_are_not(lm):
    layers = _block_layers(lm)
    kquant = [m for _, m in layers if int(m.blocks.qtype) in kquant_r8.R8_TYPES]
    assert kquant and all(m.r8 is not None and m.fused is None and m.r8.shape == m.blocks.shape for m in kquant)
    assert all(m.r8 is None for _, m in layers if int(m.blocks.qtype) not in kquant_r8.R8_TYPES)
    products = [prod for layer in lm.cpu_decode._layers for prod in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    parts = [p for prod in [*products, lm.cpu_decode._head_product] for p in prod.parts]  # phi3's own head too
    from mlxcel_py.models.cpu.quant.r8_layers import R8Weight

    assert sum(isinstance(p, R8Weight) for p in parts) == len(kquant)  # the decode step reads the same rows


def test_a_repacked_layer_is_the_tiles_product_within_int8_rounding(lm):
    import mlx.core as mx

    from mlxcel_py.models.cpu.quant import prefill

    rng = np.random.default_rng(0)
    for name, m in _block_layers(lm):
        if m.r8 is None:
            continue
        x = rng.standard_normal((37, m.blocks.shape[1])).astype(np.float32)
        got = np.array(m(mx.array(x)))
        want = prefill.matmul_tiled(x, m.blocks)  # the file's blocks (their pages fault back in)
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), name


def test_each_rows_bits_do_not_depend_on_the_batch_or_the_threads(lm):
    from mlxcel_py.models.cpu.quant.r8_layers import linear

    m = next(m for _, m in _block_layers(lm) if m.r8 is not None)
    x = np.random.default_rng(1).standard_normal((9, m.r8.shape[1])).astype(np.float32)
    whole = linear(x, m.r8, threads=2)
    np.testing.assert_array_equal(whole, linear(x, m.r8, threads=1))
    for i in (0, 4, 8):
        np.testing.assert_array_equal(linear(x[i:i + 1], m.r8, threads=2)[0], whole[i])
    with pytest.raises(ValueError, match="does not multiply"):
        linear(x[:, :-1], m.r8)


def test_the_rows_are_token_exact_with_the_batch_layout_over_repacked_layers(lm):
    from mlxcel_py.engine.runner.model_runner import ModelRunner

    from test_kv_rows import scenario

    d = lm.cpu_decode
    ours = ModelRunner(lm.model, decode=d, verify=d.verify)
    theirs = ModelRunner(lm.model, decode=d, verify=d.verify, kv_rows=False)
    assert scenario(ours) == scenario(theirs)
