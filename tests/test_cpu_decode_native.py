"""The CPU decode step over a GGUF's own blocks (`--cpu-weights native`) against the float32 one."""

from pathlib import Path

import numpy as np
import pytest

from mlxcel_py.config import resolve, startup_summary
from mlxcel_py.errors import ConfigError
from mlxcel_py.models import load_model
from mlxcel_py.models.cpu import decoder as cpu_decode
from mlxcel_py.models.loader import default_cpu_weights
from mlxcel_py.models.cpu.native import NativeDecoder, blocks_of, native_decoder_for
from mlxcel_py.models.cpu.quant import int8_ir, products

from test_cpu_decode import compare, make_batch, prompt
from config_helpers import flags_for
from tiny import LAYERS, write_tiny_gguf

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
# (file, products over blocks, float32 fallbacks): layers (2, 1, 1) x (qkv, o, gate_up, down) + the head;
# q4_k_m's v is Q6_K beside Q4_K q/k, so its q/k/v stay three products.
QUANTIZED = [("llama-q8_0", 9, 0), ("llamaq-q4_k_m", 7, 0), ("llamaq-q6_k", 5, 0)]
EXACT = 1e-5  # float activations (products.linear_vector): float32 rounding only
INT8 = 0.15  # int8 activations per 32 values (llama.cpp's rounding): ~3-5% of these logits' range (~3)
DEFAULT_INT8 = 1.5  # the default model (SmolLM2-135M Q4_1), random-token prompts: measured 0.81


def _pair(name):
    path = FIXTURES / f"{name}.gguf"
    lm = load_model(str(path), threads=1, cpu_weights="f32")
    assert type(lm.cpu_decode) is cpu_decode.CpuDecoder  # rope_freqs (FactorRoPE) llamas decode on the CPU too
    return lm, native_decoder_for(lm.model, path, 1)


def _gap(lm, native, steps=6):
    """Worst logit gap of native vs float32 from identical caches, and whether every argmax agreed."""
    prompts = [prompt(9, 0), prompt(20, 1)]
    ours, theirs = make_batch(lm.model, prompts), make_batch(lm.model, prompts)
    tokens, worst, same = [p[-1] for p in prompts], 0.0, True
    for _ in range(steps):
        got, want = np.array(native(tokens, ours)), np.array(lm.cpu_decode(tokens, theirs))
        worst = max(worst, float(np.abs(got - want).max()))
        same &= got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()
    return worst, same


def test_float32_decode_of_a_rope_freqs_gguf_matches_mlx_lm():
    lm = load_model(str(FIXTURES / "llama-q8_0.gguf"), threads=1, cpu_weights="f32")
    assert compare(lm.model, lm.cpu_decode, [prompt(9, 0), prompt(20, 1)], 6) < 1e-4


@pytest.mark.parametrize("name,quantized,fallback", QUANTIZED)
def test_native_products_read_the_blocks_and_equal_float32_with_float_activations(name, quantized, fallback, monkeypatch):
    lm, native = _pair(name)
    assert native.counts() == (quantized, fallback)
    monkeypatch.setattr(products, "linear", products.linear_vector)
    worst, same = _gap(lm, native)
    assert worst < EXACT and same


@pytest.mark.skipif(not int8_ir.HAS_AVX2, reason="the int8 kernel is chosen on AVX2 only")
@pytest.mark.parametrize("name", [q[0] for q in QUANTIZED])
def test_native_int8_products_are_within_the_stated_tolerance(name):
    lm, native = _pair(name)
    worst, _ = _gap(lm, native)  # argmax may differ: these random logits have near ties
    assert 0 < worst < INT8


def test_float_weights_fall_back_to_float32_products_to_float32_products(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    lm = load_model(str(path), threads=1, cpu_weights="f32")
    assert type(native_decoder_for(lm.model, path, 1)) is cpu_decode.CpuDecoder  # nothing to read as blocks
    native = NativeDecoder(lm.model, blocks_of(lm.model, path), 1)
    assert native.counts() == (0, LAYERS * (3 + 1 + 2 + 1) + 1)  # F32 tensors: unfused float32 products
    worst, same = _gap(lm, native, steps=3)
    assert worst < EXACT and same


def test_loader_installs_the_native_decoder_by_default_on_avx2_and_when_asked():
    path = str(FIXTURES / "llama-q8_0.gguf")
    lm = load_model(path, threads=1, cpu_weights="native")
    assert isinstance(lm.cpu_decode, NativeDecoder)
    assert lm.description.endswith("decode over GGUF blocks")
    assert type(load_model(path, threads=1, cpu_weights="f32").cpu_decode) is cpu_decode.CpuDecoder
    assert default_cpu_weights() == ("native" if int8_ir.HAS_AVX2 else "f32")
    assert isinstance(load_model(path, threads=1).cpu_decode, NativeDecoder) == int8_ir.HAS_AVX2


def test_cpu_weights_flag_and_env_resolve_and_refuse_bad_values():
    assert resolve("generate", env={}).model.cpu_weights is None  # the loader's default_cpu_weights()
    assert "cpu_weights auto" in " ".join(startup_summary(resolve("serve", env={})))
    assert resolve("generate", env={"MLXCEL_CPU_WEIGHTS": "Native"}).model.cpu_weights == "native"
    assert resolve("serve", flags_for("serve", cpu_weights="f32"),
                   env={"MLXCEL_CPU_WEIGHTS": "native"}).model.cpu_weights == "f32"
    assert "cpu_weights native" in " ".join(startup_summary(resolve("run", flags_for("run", cpu_weights="native"),
                                                                    env={})))
    with pytest.raises(ConfigError, match=r"^--cpu-weights must be one of native, f32 \(got 'q4'\)$"):
        resolve("generate", flags_for("generate", cpu_weights="q4"), env={})
    with pytest.raises(ConfigError, match=r"^MLXCEL_CPU_WEIGHTS must be one of native, f32 \(got 'x'\)$"):
        resolve("generate", env={"MLXCEL_CPU_WEIGHTS": "x"})


def _greedy(lm, decode, ids, steps):
    caches, tokens, out = make_batch(lm.model, [ids]), [ids[-1]], []
    for _ in range(steps):
        tokens = np.array(decode(tokens, caches)).argmax(-1).tolist()
        out += tokens
    return out


@pytest.mark.slow
def test_default_model_native_greedy_tokens_equal_float32s():
    from mlxcel_py.models import default_model_path

    lm = load_model(None, threads=1, cpu_weights="f32")
    native = native_decoder_for(lm.model, Path(default_model_path()), 1)
    ids = lm.tokenizer.encode("The capital of France is Paris. The capital of Germany is")
    assert _greedy(lm, native, ids, 16) == _greedy(lm, lm.cpu_decode, ids, 16)
    worst, _ = _gap(lm, native, steps=3)
    assert worst < DEFAULT_INT8


@pytest.mark.parametrize("name", [q[0] for q in QUANTIZED])
def test_native_verify_span_equals_the_float32_one_with_float_activations(name, monkeypatch):
    """A draft's verify forward (speculative decoding) runs over the blocks too, through the
    same overridable layer step: with float activations it equals the float32 decoder's span."""
    lm, native = _pair(name)
    monkeypatch.setattr(products, "linear", products.linear_vector)
    prompts = [prompt(9, 0), prompt(20, 1)]
    ours, theirs = make_batch(lm.model, prompts), make_batch(lm.model, prompts)
    rows = [list(prompt(4, 30 + i)) for i in range(len(prompts))]
    got, want = np.array(native.verify(rows, ours)), np.array(lm.cpu_decode.verify(rows, theirs))
    assert got.shape == want.shape == (2, 4, want.shape[-1])
    np.testing.assert_allclose(got, want, atol=EXACT)
