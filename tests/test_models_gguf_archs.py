"""Each GGUF architecture against two other implementations.

The fixtures were made by transformers (HF checkpoint) and llama.cpp's converter (GGUF):
our load of the GGUF must give mlx-lm's logits for the HF directory, our tokenizer the
HF tokenizer's ids, and greedy decoding llama-server's tokens on the same file."""

import mlx.core as mx
import numpy as np
import pytest

from gguf_fixtures import (
    FIXTURES, ARCH_FILES, KQUANT_FILES, LOSSY_FILES, PROMPT, arch_of, fixture_files, fixture_model, hf_reference,
    hf_tokenizer, llama_server_record,
)
from mlxcel_py.models import gguf_tensors
from mlxcel_py.models.gguf_file import read_gguf

TEXTS = [PROMPT, "Hello world!\n  def main():\n    return 42", "<|im_start|>user\nhi<|im_end|>\n", " 2024 had 366 days"]
# gemma3 only: its converter adds 1 to the float16 norm weights in float16 (1 + w rounded
# to 2^-10), values we must read as stored; every other architecture matches exactly.
LOGIT_ATOL = {"gemma3": 2e-2, "gemma3spm": 2e-2}
# Logits within which llama.cpp's pick may differ from our argmax: it rounds activations to
# float16 for F16 weights (~1e-3 here) and to 8 bits for Q8_0 and K-quant weights (~1e-2).
NEAR_TIE = {"F16": 0.01, "BF16": 0.01, "Q8_0": 0.03, "Q4_K_M": 0.03, "Q5_K_M": 0.03, "Q6_K": 0.03}
DESCRIBED = {
    "llama": "llama 125K", "mistral": "llama 125K", "qwen2": "qwen2 100K", "qwen3": "qwen3 124K",
    "gemma3": "gemma3 249K", "phi3": "phi3 125K", "llamaspm": "llama 125K",
    "qwen2yarn": "qwen2 100K", "phi3long": "phi3 125K", "gemma3spm": "gemma3 249K",
}


def _ids(model):
    return list(model.tokenizer.encode(PROMPT, add_special_tokens=True))


@pytest.mark.parametrize("arch", sorted(ARCH_FILES))
def test_logits_match_mlx_lm_on_the_hf_checkpoint(arch):
    ours = fixture_model(ARCH_FILES[arch])
    ids = mx.array([_ids(ours)])
    want = np.array(hf_reference(arch)(ids))
    got = np.array(ours.model(ids))
    assert got.shape == want.shape == (1, ids.shape[1], 400)
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL.get(arch, 1e-5), rtol=0)


@pytest.mark.parametrize("arch", sorted(ARCH_FILES))
def test_description_names_the_architecture(arch):
    ours = fixture_model(ARCH_FILES[arch])
    assert ours.description.startswith(f"{DESCRIBED[arch]}, gguf F16 -> dense float32")
    assert (ours.source, ours.weights, ours.context_length) == ("gguf", "dense-float32", 4096)
    # A sentencepiece vocabulary asks for BOS (llama.cpp's default and the file's flag); the
    # byte-level ones end on <|im_end|> (eos, 2) and <|endoftext|> (0), as llama.cpp does.
    spm = arch in ("llamaspm", "gemma3spm")
    assert ours.eos_token_ids == frozenset({2} if spm else {0, 2}) and ours.add_bos is spm


@pytest.mark.parametrize("arch", sorted(ARCH_FILES))
@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_the_hf_tokenizer(arch, text):
    ours = fixture_model(ARCH_FILES[arch]).tokenizer
    assert list(ours.encode(text, add_special_tokens=False)) == hf_tokenizer(arch).encode(text, add_special_tokens=False)


@pytest.mark.parametrize("arch", sorted(ARCH_FILES))
def test_chat_template_comes_from_the_gguf(arch):
    ours = fixture_model(ARCH_FILES[arch]).tokenizer
    text = ours.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("filename", LOSSY_FILES + KQUANT_FILES)
def test_quantized_path_matches_the_dense_path(filename):
    """dense=False keeps MLX-quantized weights (the GPU path); same logits as dequantizing up front."""
    if filename not in fixture_files():
        pytest.skip(f"{filename} not generated (needs llama-quantize)")
    dense, kept = fixture_model(filename), fixture_model(filename, dense=False)
    expected = "bfloat16" if "bf16" in filename else "quantized"
    assert (dense.weights, kept.weights) == ("dense-float32", expected)
    ids = mx.array([_ids(dense)])
    want = np.array(dense.model(ids))
    # Repacked types keep their codes; float16 scales and activations cost ~1e-2. Q6_K
    # (in every *_K_M file) is requantized to 8 bits: one 8-bit step per group more.
    types = {t.qtype for t in read_gguf(FIXTURES / filename).tensors.values()}
    atol = 0.1 if types & set(gguf_tensors.REQUANTIZED) else 0.02
    np.testing.assert_allclose(np.array(kept.model(ids).astype(mx.float32)), want, atol=atol, rtol=0)


@pytest.mark.parametrize("filename", LOSSY_FILES)
def test_lossy_files_stay_close_to_the_checkpoint(filename):
    ours = fixture_model(filename)
    ids = mx.array([_ids(ours)])
    want = np.array(hf_reference(arch_of(filename))(ids))
    assert np.abs(np.array(ours.model(ids)) - want).max() < 0.25


def _server_cases():
    record = llama_server_record()
    return sorted(record["fixtures"]) if record else []


@pytest.mark.skipif(llama_server_record() is None, reason="llama_server_tokens.json not recorded yet")
@pytest.mark.parametrize("filename", _server_cases())
def test_prompt_ids_and_greedy_tokens_match_llama_server(filename):
    """Same prompt ids; llama-server's greedy tokens are ours, step by step on its sequence.

    Where our two best tokens are closer than NEAR_TIE its pick may be either; everywhere
    else it must be our argmax. Compared teacher-forced on llama-server's own sequence."""
    record = llama_server_record()
    want = record["fixtures"][filename]
    ours = fixture_model(filename)
    assert _ids(ours) == want["prompt_ids"]
    prompt, tokens = want["prompt_ids"], want["greedy_ids"]
    assert len(tokens) == record["num_tokens"]
    logits = np.array(ours.model(mx.array([prompt + tokens[:-1]])))[0, len(prompt) - 1 :]
    logits[:, sorted(ours.eos_token_ids)] = -np.inf  # the record's ignore_eos: llama.cpp bans every end token
    gaps = [float(row.max() - row[token]) for row, token in zip(logits, tokens)]
    tol = NEAR_TIE[ours.description.split("gguf ")[1].split(" ")[0]]
    assert max(gaps) <= tol, f"llama-server's token is {max(gaps):.4f} below our best at step {np.argmax(gaps)}"


def test_every_fixture_has_llama_server_tokens():
    record = llama_server_record()
    if record is None:
        pytest.skip("llama_server_tokens.json not recorded yet")
    assert sorted(record["fixtures"]) == fixture_files(generative=True) and record["llama_cpp"]


def test_turn_end_tokens_end_generation_like_llama_cpp():
    from mlxcel_py.models.tokenizer import end_of_generation_ids

    tokens = ["<bos>", "<eos>", "hi", "<end_of_turn>", "<|end|>", "<|eot_id|>", "end_of_turn"]
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": 1}
    assert end_of_generation_ids(meta) == {1, 3, 4, 5}
    assert end_of_generation_ids({**meta, "tokenizer.ggml.eot_token_id": 2}) == {1, 2, 3, 4, 5}
