"""bench/synthetic.py (`python -m bench synthetic-gguf`): the Q4_K_M type choices, llama.cpp's
llama_tensor_get_type for Q4_K_M."""

import sys
from collections import Counter
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import ARCH_PRESETS, PRESETS, q4_k_m_type, use_more_bits, write_other  # noqa: E402

NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _mix(preset: str) -> Counter:
    layers, hidden, ffn, _, _ = PRESETS[preset]
    cols = {"ffn_down": ffn}
    mix = Counter([q4_k_m_type("token_embd", 0, layers, hidden)])
    mix.update(q4_k_m_type(n, i, layers, cols.get(n, hidden)) for i in range(layers) for n in NAMES)
    return mix


def test_use_more_bits_is_llama_cpps_half_of_the_layers():
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert sum(use_more_bits(i, 30) for i in range(30)) == 14


def test_a_1b_model_is_q4_k_with_q6_k_attn_v_ffn_down_and_output():
    assert _mix("1b") == Counter({T.Q4_K: 16 * 5 + 8 * 2, T.Q6_K: 8 * 2 + 1})


def test_smollm2s_576_wide_rows_take_llama_cpps_fallbacks():
    """Q4_K -> Q5_0 and Q6_K -> Q8_0 where a row is not whole 256-blocks; ffn_down's 1,536 columns are."""
    assert q4_k_m_type("token_embd", 0, 30, 576) == T.Q8_0
    assert q4_k_m_type("attn_v", 0, 30, 576) == T.Q8_0 and q4_k_m_type("attn_v", 3, 30, 576) == T.Q5_0
    assert q4_k_m_type("ffn_down", 0, 30, 1536) == T.Q6_K and q4_k_m_type("ffn_down", 3, 30, 1536) == T.Q4_K
    assert _mix("smollm2-135m") == Counter({T.Q5_0: 30 * 5 + 16, T.Q8_0: 14 + 1, T.Q6_K: 14, T.Q4_K: 16})


@pytest.mark.parametrize("arch", sorted(ARCH_PRESETS))
def test_each_architectures_synthetic_file_loads_on_the_cpu_fast_paths(arch, tmp_path):
    """Tiny dims (whole 256-blocks, so Q4_K/Q6_K): the fixture's names scaled load with both CPU fast paths."""
    from mlxcel_py.models import load_model

    out = tmp_path / f"{arch}.gguf"
    heads, kv_heads = 4, 1 if arch == "gemma3" else 2
    params = write_other(out, arch, (2, 256, 512, heads, kv_heads, 64))
    lm = load_model(str(out))
    assert lm.description.startswith(f"{arch} ") and "gguf Q4_K_M" in lm.description
    assert lm.cpu_decode is not None and lm.cpu_kernels is not None
    embeddings = 2 if arch == "phi3" else 1  # phi3's output is its own tensor; phi3's fused tensors count the same
    assert params == 2 * (256 * 256 * 2 + 2 * kv_heads * 64 * 256 + 3 * 512 * 256) + embeddings * 400 * 256
