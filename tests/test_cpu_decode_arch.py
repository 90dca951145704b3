"""The CPU decode step for every GGUF architecture against mlx-lm's float32 forward:
logits at batch 1 and a ragged batch of 3, a verify span, and greedy tokens through the engine."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu import decoder as cpu_decode
from mlxcel_py.models.cpu import arch_kernels as AK
from mlxcel_py.models.cpu.arch import GELU_TANH
from mlxcel_py.models.cpu import decode_kernels as K

from gguf_fixtures import FIXTURES
from test_cpu_decode import ATOL, compare, make_batch, prompt
from config_helpers import flags_for
from tiny import greedy_tokens

# fixture -> the mlx-lm module its spec reads; mistral's converter writes a llama GGUF
ARCHS = {"qwen2-f16": "qwen2", "qwen2yarn-f16": "qwen2", "qwen3-f16": "qwen3", "qwen3-q8_0": "qwen3",
         "gemma3-f16": "gemma3_text", "gemma3spm-f16": "gemma3_text", "phi3-f16": "phi3",
         "phi3long-f16": "phi3", "mistral-f16": "llama"}
_LOADED: dict = {}


def fixture(name):
    if name not in _LOADED:
        _LOADED[name] = load_model(str(FIXTURES / f"{name}.gguf"), threads=1, cpu_weights="f32")
    return _LOADED[name]


@pytest.mark.parametrize("name", sorted(ARCHS))
@pytest.mark.parametrize("lengths", [(9,), (5, 17, 40)])  # 17 and 40: past gemma3's window of 8
def test_every_architecture_decodes_like_mlx_lm(name, lengths):
    lm = fixture(name)
    assert type(lm.cpu_decode) is cpu_decode.CpuDecoder and lm.description.endswith("decode in numpy")
    assert lm.cpu_decode.spec.arch == ARCHS[name]
    assert compare(lm.model, lm.cpu_decode, [prompt(n, i) for i, n in enumerate(lengths)], 8) < ATOL


def test_gemma3_spec_reads_windows_ropes_norm_offset_and_embedding_scale():
    spec = fixture("gemma3-f16").cpu_decode.spec
    # five sliding layers (window 8, local rope base) then a global one (its own rope)
    assert spec.windows == (8, 8, 8, 8, 8, 0) and spec.rope_of == (0, 0, 0, 0, 0, 1) and len(spec.ropes) == 2
    assert spec.embed_scale == 8.0 and spec.norm_offset == 1.0 and spec.activation == GELU_TANH
    assert spec.scale == 16 ** -0.5  # query_pre_attn_scalar


@pytest.mark.parametrize("name", ["gemma3-f16", "qwen2-f16", "qwen3-f16", "phi3long-f16"])
def test_verify_span_matches_mlx_lm_per_architecture(name):
    lm = fixture(name)
    prompts = [prompt(n, n) for n in (12, 3, 20)]
    ours, theirs = make_batch(lm.model, prompts), make_batch(lm.model, prompts)
    rows = [list(prompt(5, 40 + i)) for i in range(len(prompts))]
    got = np.array(lm.cpu_decode.verify(rows, ours))
    np.testing.assert_allclose(got, np.array(lm.model(mx.array(rows), cache=theirs)), atol=ATOL)


def _engine_greedy(lm, prompts, parallel, n):
    from mlxcel_py.config import resolve
    from mlxcel_py.engine import build_engine

    from test_speculative import greedy, run

    engine = build_engine(resolve("serve", flags_for("serve", parallel=parallel, prompt_cache=False),
                                  env={}).engine, lm)
    assert engine.runner._fast_decode is lm.cpu_decode  # the numba step, not mlx-lm's forward
    out = run(engine, [greedy(f"r{i}", p, n) for i, p in enumerate(prompts)])
    return [out[f"r{i}"][0] for i in range(len(prompts))]


@pytest.mark.parametrize("name", ["gemma3-f16", "qwen2-f16", "qwen3-q8_0", "phi3-f16"])
def test_engine_greedy_tokens_equal_mlx_lms_batched_and_alone(name):
    lm = fixture(name)
    prompts = [tuple(prompt(n, 60 + n)) for n in (11, 4, 25)]
    want = [greedy_tokens(lm.model, p, 12) for p in prompts]
    assert _engine_greedy(lm, prompts, 3, 12) == want
    assert _engine_greedy(lm, prompts[:1], 1, 12) == want[:1]


def test_windowed_attention_sees_only_the_last_window_positions():
    rng = np.random.default_rng(2)
    rows, heads, kv_heads, dim, end, window = 2, 4, 2, 8, 9, 3
    qkv = rng.standard_normal((rows, (heads + 2 * kv_heads) * dim), dtype=np.float32)
    keys = rng.standard_normal((rows, kv_heads, 12, dim), dtype=np.float32)
    values = rng.standard_normal((rows, kv_heads, 12, dim), dtype=np.float32)
    pad = np.array([0, 7])  # row 1's padding leaves fewer than `window` positions
    got = K.attend(qkv, keys, values, end, pad, heads, 0.5, 1, window)
    for b in range(rows):
        start = max(pad[b], end - window)
        for h in range(heads):
            q, kv = qkv[b, h * dim : (h + 1) * dim], h // 2
            s = keys[b, kv, start:end] @ q * 0.5
            p = np.exp(s - s.max())
            np.testing.assert_allclose(got[b, h * dim : (h + 1) * dim], p @ values[b, kv, start:end] / p.sum(),
                                       rtol=1e-5, atol=1e-5)


def test_gelu_and_head_norm_kernels_match_mlx():
    import mlx.nn as nn

    rng = np.random.default_rng(3)
    gu = rng.standard_normal((3, 40), dtype=np.float32) * 3
    want = np.array(nn.gelu_approx(mx.array(gu[:, :20])) * mx.array(gu[:, 20:]))
    np.testing.assert_allclose(AK.gelu_mul(gu), want, rtol=1e-5, atol=1e-5)
    qkv, w = rng.standard_normal((2, 5 * 8), dtype=np.float32), rng.standard_normal(8, dtype=np.float32)
    got = qkv.copy()
    AK.head_norm(got, w, 1, 3, 8, 1e-6)  # heads 1..3 only
    heads = mx.fast.rms_norm(mx.array(qkv.reshape(2, 5, 8)), mx.array(w), 1e-6)
    want = np.array(heads).reshape(2, -1)
    np.testing.assert_allclose(got[:, 8:32], want[:, 8:32], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[:, :8], qkv[:, :8])
    np.testing.assert_array_equal(got[:, 32:], qkv[:, 32:])


def test_mlx_lms_own_gemma3_keeps_its_decode_for_rotating_caches():
    """An mlx-lm gemma3 directory gives sliding layers RotatingKVCache, which the step does not write:
    it decodes through mlx-lm (the GGUF loader gives every layer a KVCache and a window mask)."""
    lm = load_model(str(FIXTURES / "gemma3-hf"), threads=1)
    assert lm.cpu_decode is None
    assert cpu_decode.supported(lm.model) == "KV caches KVCache, RotatingKVCache"


def requantized(source, out, qtype_name="Q8_0"):
    """`source` (an F16 fixture) rewritten with every matrix in `qtype_name` by the `gguf` package's
    quantizer (the tiny fixtures' rows are 64-128 wide: only the 32-value block types fit)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

    qtype = GGMLQuantizationType[qtype_name]
    reader = GGUFReader(source)
    writer = GGUFWriter(out, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.data.ndim == 2 and not t.name.startswith("rope_"):
            writer.add_tensor(t.name, quants.quantize(np.asarray(t.data, np.float32), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


NATIVE = ["gemma3-f16", "qwen2-f16", "qwen3-f16", "phi3long-f16", "mistral-f16"]


@pytest.fixture(scope="module")
def q8_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q8")
    files = {n: requantized(FIXTURES / f"{n}.gguf", folder / f"{n.split('-')[0]}-q8_0.gguf") for n in NATIVE}
    return {**files, "qwen3-q8_0": FIXTURES / "qwen3-q8_0.gguf"}


def _native_pair(path, monkeypatch=None):
    """(the f32 load, the default load: block layers and the native step over them). With `monkeypatch`
    the layers keep the file's blocks (not repacked: quant/r8_layers.py), whose products have a
    float-activation kernel to compare against float32."""
    from mlxcel_py.models import gguf
    from mlxcel_py.models.cpu.native import NativeDecoder

    if monkeypatch is not None:
        monkeypatch.setattr(gguf, "repack_block_layers", lambda model, copies=False: 0)
    f32, native = load_model(str(path), threads=1, cpu_weights="f32"), load_model(str(path), threads=1, cpu_weights="native")
    assert type(f32.cpu_decode) is cpu_decode.CpuDecoder and isinstance(native.cpu_decode, NativeDecoder)
    assert native.description.endswith("decode over GGUF blocks") and native.cpu_decode.counts()[1] == 0
    return f32, native


@pytest.mark.parametrize("name", NATIVE + ["qwen3-q8_0"])
def test_native_step_over_q8_0_blocks_equals_float32_with_float_activations(name, q8_files, monkeypatch):
    from mlxcel_py.models.cpu.quant import products

    f32, native = _native_pair(q8_files[name], monkeypatch)
    monkeypatch.setattr(products, "linear", products.linear_vector)
    prompts = [prompt(9, 0), prompt(20, 1), prompt(31, 2)]
    ours, theirs = make_batch(f32.model, prompts), make_batch(f32.model, prompts)
    tokens = [p[-1] for p in prompts]
    for _ in range(6):
        got, want = np.array(native.cpu_decode(tokens, ours)), np.array(f32.cpu_decode(tokens, theirs))
        np.testing.assert_allclose(got, want, atol=1e-5)
        tokens = want.argmax(-1).tolist()


@pytest.mark.parametrize("name", ["gemma3-f16", "qwen3-q8_0"])
def test_native_engine_greedy_batched_equals_alone(name, q8_files):
    _, native = _native_pair(q8_files[name])
    prompts = [tuple(prompt(n, 80 + n)) for n in (13, 5, 22)]
    batched = _engine_greedy(native, prompts, 3, 10)
    assert [_engine_greedy(native, [p], 1, 10)[0] for p in prompts] == batched


@pytest.mark.parametrize("name", ["gemma3-f16", "qwen2-f16"])
def test_native_verify_span_equals_the_float32_one_with_float_activations(name, q8_files, monkeypatch):
    from mlxcel_py.models.cpu.quant import products

    f32, native = _native_pair(q8_files[name], monkeypatch)
    monkeypatch.setattr(products, "linear", products.linear_vector)
    prompts = [prompt(n, n) for n in (12, 3, 20)]
    ours, theirs = make_batch(f32.model, prompts), make_batch(f32.model, prompts)
    rows = [list(prompt(5, 50 + i)) for i in range(len(prompts))]
    got, want = np.array(native.cpu_decode.verify(rows, ours)), np.array(f32.cpu_decode.verify(rows, theirs))
    np.testing.assert_allclose(got, want, atol=1e-5)
