"""mlx-lm model directories: loaded through mlx_lm, made dense float32 on the CPU path."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import save_model

from mlxcel_py.models import encode_chat, load_model
from mlxcel_py.errors import ModelLoadError
from tiny import CONTEXT, FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, reference_model, tiny_model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def write_mlx_dir(folder, *, quantized: bool, dtype=mx.float32):
    """The tiny model as an mlx-lm directory: config.json, safetensors, tokenizer files."""
    vocab = len(tiny_model().tokenizer)
    model = reference_model(vocab)
    model.set_dtype(dtype)
    config = {
        "model_type": "llama", "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "intermediate_size": FFN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
        "vocab_size": vocab, "rope_theta": 10000.0, "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": True,
    }
    if quantized:
        nn.quantize(model, group_size=32, bits=8)
        config["quantization"] = {"group_size": 32, "bits": 8}
    folder.mkdir()
    save_model(folder, model)
    (folder / "config.json").write_text(json.dumps(config))
    tiny_model().tokenizer._tokenizer.save_pretrained(str(folder))
    return folder


def dtypes(model):
    return {v.dtype for _, v in tree_flatten(model.parameters())}


@pytest.fixture(scope="module")
def quant_dir(tmp_path_factory):
    return write_mlx_dir(tmp_path_factory.mktemp("mlx") / "tiny-q8", quantized=True)


def test_quantized_dir_dense_matches_quantized(quant_dir):
    dense, kept = load_model(str(quant_dir), dense=True), load_model(str(quant_dir), dense=False)
    assert (dense.source, dense.name, dense.weights) == ("mlx", "tiny-q8", "dense-float32")
    assert kept.weights == "quantized"
    assert dtypes(dense.model) == {mx.float32}
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in dense.model.named_modules())
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in kept.model.named_modules())
    ids = mx.array([list(encode_chat(dense.tokenizer, QUESTION).ids)])
    kept_logits = kept.model(ids).astype(mx.float32)
    np.testing.assert_allclose(np.array(dense.model(ids)), np.array(kept_logits), atol=1e-3)
    assert dense.context_length == CONTEXT and dense.eos_token_ids == frozenset({2})
    assert f"-> dense float32, BLAS {dense.blas}" in dense.description


def test_float16_dir_is_cast_to_float32(tmp_path):
    folder = write_mlx_dir(tmp_path / "tiny-f16", quantized=False, dtype=mx.float16)
    assert dtypes(load_model(str(folder), dense=True).model) == {mx.float32}
    assert mx.float16 in dtypes(load_model(str(folder), dense=False).model)


def test_dir_without_weights_fails_clearly(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match=r"cannot load mlx-lm model .*: No safetensors found"):
        load_model(str(tmp_path))
