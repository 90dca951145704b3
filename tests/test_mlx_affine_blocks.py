"""mlx-community affine-quantized directories on the CPU (`--cpu-weights native`): the QuantizedLinear /
QuantizedEmbedding weights repacked into blocks (models/cpu/quant/affine.py, models/mlx_blocks.py), no float32
copy, logits against mlx-lm's own quantized forward (mx.quantized_matmul) and its greedy tokens."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from mlx.utils import tree_flatten
from mlx_lm.utils import save_model

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu.native import NativeDecoder
from mlxcel_py.models.gguf_blocks import BlockEmbedding, BlockLinear
from mlxcel_py.models.cpu.quant import affine, products

from test_cpu_decode import make_batch, prompt
from tiny import CONTEXT, FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, reference_model, tiny_model

SCHEMES = [(4, 32), (4, 64), (8, 32), (8, 64)]
PREFILL = 1e-4  # the same float32 weights as mx.dequantize's (checked exactly below), BLAS's order only
EXACT = 1e-4  # float activations over the same weights: summation order only
INT8 = 0.15  # the int8-activation decode kernels, as for GGUF (tests/test_gguf_blocks.py)


def write_quantized_dir(folder, bits: int, group: int, dtype=mx.bfloat16):
    """The tiny llama quantized as mlx-lm quantizes (nn.quantize) and saved with mlx-lm's save_model."""
    vocab = len(tiny_model().tokenizer)
    model = reference_model(vocab)
    model.set_dtype(dtype)
    nn.quantize(model, group_size=group, bits=bits)
    config = {"model_type": "llama", "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "intermediate_size": FFN,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
              "vocab_size": vocab, "rope_theta": 10000.0, "max_position_embeddings": CONTEXT,
              "tie_word_embeddings": True, "quantization": {"group_size": group, "bits": bits}}
    folder.mkdir()
    save_model(folder, model)
    (folder / "config.json").write_text(json.dumps(config))
    tiny_model().tokenizer._tokenizer.save_pretrained(str(folder))
    return folder


def _reference(folder):
    """mlx-lm's quantized model with its scales, biases and norms cast to float32 (exact from bfloat16)."""
    kept = load_model(str(folder), dense=False)
    assert kept.weights == "quantized"
    kept.model.set_dtype(mx.float32)
    return kept.model


@pytest.mark.parametrize("bits,group", SCHEMES, ids=lambda v: str(v))
def test_repacked_blocks_dequantize_to_mlxs_weights_exactly(bits, group):
    w = mx.random.normal((13, 512), key=mx.random.key(bits + group)).astype(mx.bfloat16) * 0.05
    q, s, b = mx.quantize(w, group_size=group, bits=bits)
    s, b = s.astype(mx.float32), b.astype(mx.float32)
    blocks = affine.to_blocks(np.array(q), np.array(s), np.array(b), bits, group)
    assert blocks.qtype == (T.Q4_1 if bits == 4 else affine.AffineType.A8)
    assert blocks.bits_per_weight == (5.0 if bits == 4 else 9.0)  # float16 d and m per 32
    ref = np.array(mx.dequantize(q, s, b, group_size=group, bits=bits))
    np.testing.assert_array_equal(products.dequantize(blocks), ref)
    x = np.random.default_rng(bits).standard_normal((3, 512)).astype(np.float32)
    want = np.array(mx.quantized_matmul(mx.array(x), q, s, b, transpose=True, group_size=group, bits=bits))
    assert np.abs(products.linear_vector(x, blocks) - want).max() < 1e-5 * np.abs(want).max()


def test_what_does_not_repack_exactly_is_refused():
    w = mx.random.normal((4, 64), key=mx.random.key(0))
    q, s, b = mx.quantize(w, group_size=32, bits=4)  # float32 scales: not float16-exact
    assert affine.to_blocks(np.array(q), np.array(s), np.array(b), 4, 32) is None
    q, s, b = mx.quantize(w.astype(mx.bfloat16), group_size=32, bits=2)
    assert affine.to_blocks(np.array(q), np.array(s.astype(mx.float32)), np.array(b.astype(mx.float32)), 2, 32) is None


@pytest.fixture(scope="module", params=SCHEMES, ids=lambda v: f"{v[0]}bit-g{v[1]}")
def scheme_dir(request, tmp_path_factory):
    bits, group = request.param
    return write_quantized_dir(tmp_path_factory.mktemp("mlxq") / f"tiny-{bits}bit-g{group}", bits, group)


def test_quantized_dir_loads_as_blocks_and_matches_mlx_lms_quantized_forward(scheme_dir):
    lm = load_model(str(scheme_dir), threads=1, cpu_weights="native")
    assert lm.weights == "mlx-blocks" and "affine blocks (no float32 copy)" in lm.description
    kinds = {type(m) for _, m in lm.model.named_modules()}
    assert BlockLinear in kinds and BlockEmbedding in kinds and nn.QuantizedLinear not in kinds
    assert not any(v.ndim == 2 for _, v in tree_flatten(lm.model.parameters()))  # norms only
    ref = _reference(scheme_dir)
    ids = prompt(24, 3)
    with lm.cpu_kernels:
        got = np.array(lm.model(mx.array([ids]), cache=lm.model.make_cache()))
    want = np.array(ref(mx.array([ids])))
    assert np.abs(got - want).max() < PREFILL
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_quantized_dir_decodes_over_the_blocks_with_mlx_lms_greedy_tokens(scheme_dir, monkeypatch):
    """The shipped int8-activation kernels within INT8 of mlx-lm's quantized logits; with float
    activations (the same blocks, candidate c) within EXACT and mlx-lm's greedy tokens, step by step."""
    lm = load_model(str(scheme_dir), threads=1, cpu_weights="native")
    assert isinstance(lm.cpu_decode, NativeDecoder) and lm.cpu_decode.counts()[1] == 0
    ref = _reference(scheme_dir)
    prompts = [prompt(9, 0), prompt(20, 1)]
    tokens = [p[-1] for p in prompts]
    ours, theirs = make_batch(lm.model, prompts), make_batch(ref, prompts)
    got = np.array(lm.cpu_decode(tokens, ours))
    assert np.abs(got - np.array(ref(mx.array(tokens)[:, None], cache=theirs)[:, -1, :])).max() < INT8
    monkeypatch.setattr(products, "linear", products.linear_vector)
    ours, theirs = make_batch(lm.model, prompts), make_batch(ref, prompts)
    for _ in range(6):
        got = np.array(lm.cpu_decode(tokens, ours))
        want = np.array(ref(mx.array(tokens)[:, None], cache=theirs)[:, -1, :])
        assert np.abs(got - want).max() < EXACT and got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()


def test_a_dir_whose_scales_do_not_repack_stays_float32(tmp_path):
    folder = write_quantized_dir(tmp_path / "tiny-f32-q4", 4, 32, dtype=mx.float32)
    lm = load_model(str(folder), threads=1, cpu_weights="native")
    assert lm.weights == "dense-float32"
    assert not any(isinstance(m, (BlockLinear, nn.QuantizedLinear)) for _, m in lm.model.named_modules())
    assert load_model(str(folder), dense=True).weights == "dense-float32"
