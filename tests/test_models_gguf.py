"""GGUF loading: the tiny in-process GGUF end to end, and the real default model."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.models import encode_chat, load_model
from mlxcel_py.models.gguf import unpermute_rows
from tiny import greedy_tokens, permute_rows, reference_model, tiny_model, tiny_weights, write_tiny_gguf

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_tiny_model_record():
    m = tiny_model()
    assert (m.name, m.source, m.weights, m.context_length) == ("tiny-0", "gguf", "dense-float32", 4096)
    # eos <|im_end|> (2), and <|endoftext|> (0), which llama.cpp also ends generation on.
    assert m.eos_token_ids == frozenset({0, 2}) and m.bos_token_id == 1 and m.add_bos is False
    assert m.description.startswith("llama ") and "gguf F32 -> dense float32, BLAS" in m.description
    assert m.blas in ("openblas", "reference", "off", "system")


def test_tiny_qk_rows_are_unpermuted():
    m = tiny_model()
    want = tiny_weights(len(m.tokenizer), seed=0)
    attn = m.model.model.layers[1].self_attn
    np.testing.assert_array_equal(np.array(attn.q_proj.weight), want["model.layers.1.self_attn.q_proj.weight"])
    np.testing.assert_array_equal(np.array(attn.k_proj.weight), want["model.layers.1.self_attn.k_proj.weight"])


def test_tiny_logits_match_reference_llama():
    m = tiny_model()
    ids = mx.array([list(encode_chat(m.tokenizer, QUESTION).ids)])
    ref = reference_model(len(m.tokenizer))
    np.testing.assert_allclose(np.array(m.model(ids)), np.array(ref(ids)), atol=1e-4)


def test_tiny_generates_greedily_and_deterministically():
    m = tiny_model()
    prompt = encode_chat(m.tokenizer, QUESTION).ids
    first = greedy_tokens(m.model, prompt, 8)
    assert len(first) == 8 and all(0 <= t < len(m.tokenizer) for t in first)
    assert greedy_tokens(m.model, prompt, 8) == first


def test_untied_output_and_f16_quantized_path(tmp_path):
    path = write_tiny_gguf(tmp_path / "untied.gguf", seed=3, quant="f16", tied=False)
    kept = load_model(str(path), dense=False)
    dense = load_model(str(path), dense=True)
    assert (kept.weights, dense.weights) == ("float16", "dense-float32")
    assert kept.model.lm_head.weight.dtype == mx.float16
    assert dense.model.lm_head.weight.dtype == mx.float32
    ids = encode_chat(dense.tokenizer, QUESTION).ids
    reference = reference_model(len(dense.tokenizer), seed=3, tied=False)
    assert greedy_tokens(dense.model, ids, 6) == greedy_tokens(reference, ids, 6)


def test_unpermute_commutes_with_quantization():
    # Why the quantized path may permute rows of weight/scales/biases without dequantizing.
    w = mx.array(permute_rows(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), 4))
    q, s, b = mx.quantize(w, group_size=32, bits=4)
    moved = mx.dequantize(*(unpermute_rows(t, 4) for t in (q, s, b)), group_size=32, bits=4)
    expected = unpermute_rows(mx.dequantize(q, s, b, group_size=32, bits=4), 4)
    np.testing.assert_array_equal(np.array(moved), np.array(expected))


@pytest.mark.slow
def test_real_model_dense_matches_quantized_and_knows_paris():
    dense, quant = load_model(None, dense=True), load_model(None, dense=False)
    assert (dense.weights, quant.weights) == ("dense-float32", "quantized")
    assert dense.name == "SmolLM2-135M-Instruct.Q4_1" and dense.context_length == 8192
    assert dense.description.startswith("llama 135M, gguf Q4_1 -> dense float32")
    ids = encode_chat(dense.tokenizer, QUESTION).ids
    tokens = greedy_tokens(dense.model, ids, 16)
    assert tokens == greedy_tokens(quant.model, ids, 16)
    assert "Paris" in dense.tokenizer.decode(tokens)
