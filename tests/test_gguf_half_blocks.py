"""F16/BF16 GGUF matrices held as their blocks under `--cpu-weights native` (no float32 copy): the same
logits as the float32 path, prefill through the dequantized tiles and decode through the float kernels."""

from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from mlx.utils import tree_flatten

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu.native import NativeDecoder
from mlxcel_py.models.footprint import estimate_bytes
from mlxcel_py.models.gguf_blocks import BlockEmbedding, BlockLinear

from test_cpu_decode import make_batch, prompt
from test_gguf_blocks import TILED, _logits

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
HALF = [("llama-f16", T.F16), ("qwen3-f16", T.F16), ("gemma3-f16", T.F16), ("phi3-f16", T.F16),
        ("mistral-bf16", T.BF16)]
DECODE = 1e-4  # F16/BF16 widen exactly to float32: float FMA against the float32 step's rounding only


def _pair(name):
    path = str(FIXTURES / f"{name}.gguf")
    return load_model(path, threads=1, cpu_weights="native"), load_model(path, threads=1, cpu_weights="f32")


@pytest.mark.parametrize("name, qtype", HALF)
def test_half_matrices_stay_blocks_and_prefill_equals_float32s(name, qtype):
    blocks, f32 = _pair(name)
    assert "GGUF blocks (no float32 copy)" in blocks.description and "dense float32" in f32.description
    layers = [m for _, m in blocks.model.named_modules() if isinstance(m, (BlockLinear, BlockEmbedding))]
    assert layers and {m.blocks.qtype for m in layers} == {qtype}
    assert not any(v.ndim == 2 for _, v in tree_flatten(blocks.model.parameters()))  # norms and biases only
    ids = prompt(24, 5)
    got, want = _logits(blocks, ids), _logits(f32, ids)
    assert np.abs(got - want).max() < TILED
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("name", ["llama-f16", "qwen3-f16", "mistral-bf16"])
def test_decode_over_half_blocks_equals_float32s(name):
    blocks, f32 = _pair(name)
    assert isinstance(blocks.cpu_decode, NativeDecoder) and blocks.cpu_decode.counts()[1] == 0
    prompts = [prompt(9, 0), prompt(20, 1)]
    ours, theirs = make_batch(blocks.model, prompts), make_batch(f32.model, prompts)
    tokens = [p[-1] for p in prompts]
    for _ in range(4):
        got, want = np.array(blocks.cpu_decode(tokens, ours)), np.array(f32.cpu_decode(tokens, theirs))
        assert np.abs(got - want).max() < DECODE and got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()


def test_the_memory_estimate_counts_half_matrices_as_the_file():
    path = FIXTURES / "qwen3-f16.gguf"
    size = path.stat().st_size
    assert size <= estimate_bytes(str(path), "native") < 1.1 * size
    assert estimate_bytes(str(path), "f32") > 2.5 * size  # 4 bytes a weight beside 2 in the file
