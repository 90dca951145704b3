"""The numpy prefill kernels on the architectures beyond llama: gemma3's sliding-window masks and GELU,
and a whole prefill with the kernels equal to mlx-lm's own for every GGUF fixture."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import make_prompt_cache

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu import prefill_kernels as cpu_kernels
from mlxcel_py.models.cpu.prefill_kernels import make_sdpa, masked_attention, numpy_gelu_mul

from gguf_fixtures import FIXTURES
from test_cpu_decode import prompt


@pytest.mark.parametrize("num_q, offset, window", [(600, 0, 100), (37, 500, 64), (300, 20, 1000)])
def test_masked_attention_matches_mlx_under_a_window_mask(num_q, offset, window):
    mx.random.seed(4)
    q = mx.random.normal((1, 8, num_q, 32))
    k, v = mx.random.normal((1, 2, offset + num_q, 32)), mx.random.normal((1, 2, offset + num_q, 32))
    mask = create_causal_mask(num_q, offset, window_size=window)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    out = masked_attention(np.asarray(q[0]), np.asarray(k[0]), np.asarray(v[0]), 0.2, np.asarray(mask))
    np.testing.assert_allclose(out, np.asarray(ref[0]), atol=2e-5)


def test_wrapped_sdpa_takes_a_boolean_mask_and_leaves_others_to_mlx():
    calls = []
    sdpa = make_sdpa(lambda q, k, v, cache, scale, mask, sinks=None: calls.append(mask) or q)
    q = mx.random.normal((1, 4, 16, 8))
    mask = create_causal_mask(16, 0, window_size=5)
    out = sdpa(q, q, q, cache=None, scale=0.5, mask=mask)
    assert calls == []  # numpy's
    np.testing.assert_allclose(np.asarray(out), np.asarray(mx.fast.scaled_dot_product_attention(q, q, q, scale=0.5, mask=mask)),
                               atol=1e-5)
    sdpa(q, q, q, cache=None, scale=0.5, mask=mask.astype(mx.float32))  # an additive mask: MLX's
    sdpa(q, q, q, cache=None, scale=0.5, mask=mask[None, None])  # a batched (4-D) one: MLX's
    assert len(calls) == 2


def test_the_sliding_layers_of_a_forward_share_their_mask_s_tiles(monkeypatch):
    """One forward hands every sliding layer the same mask: its tiles are found once; another mask (the
    next forward's, or a different window) gets its own, with MLX's result."""
    from mlxcel_py.models.cpu import prefill_kernels

    found = []
    real = prefill_kernels.range_tiles
    monkeypatch.setattr(prefill_kernels, "range_tiles", lambda seen, group: found.append(seen.shape) or real(seen, group))
    sdpa = make_sdpa(lambda *a, **k: None)
    q = mx.random.normal((1, 4, 16, 8))
    first, second = create_causal_mask(16, 0, window_size=5), create_causal_mask(16, 0, window_size=3)
    for mask in (first, first, first, second, first):
        out = sdpa(q, q, q, cache=None, scale=0.5, mask=mask)
        want = mx.fast.scaled_dot_product_attention(q, q, q, scale=0.5, mask=mask)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-5)
    assert len(found) == 3  # first, second, first again


def test_numpy_gelu_matches_mlx():
    g = mx.random.normal((64, 96)) * 4
    np.testing.assert_allclose(numpy_gelu_mul(np.asarray(g)), np.asarray(nn.gelu_approx(g)), rtol=1e-5, atol=1e-6)
    ends = mx.array([[-1e20, -200.0, -30.0, -8.0, -1e-3, 0.0, 1e-3, 8.0, 30.0, 200.0, 1e20]])  # one pass's extremes
    np.testing.assert_allclose(numpy_gelu_mul(np.asarray(ends)), np.asarray(nn.gelu_approx(ends)), rtol=1e-5, atol=1e-6)
    three = np.asarray(mx.random.normal((2, 3, 40)))  # any leading shape, as mlx-lm's (1, L, F)
    np.testing.assert_allclose(numpy_gelu_mul(three), np.asarray(nn.gelu_approx(mx.array(three))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gemma3-f16", "qwen2-f16", "qwen3-f16", "phi3long-f16", "mistral-f16"])
def test_prefill_with_the_kernels_equals_mlx_lms_and_they_run(name, monkeypatch):
    lm = load_model(str(FIXTURES / f"{name}.gguf"), threads=1, cpu_weights="f32")
    ids = mx.array([prompt(40, 3)])  # 40 tokens: past gemma3's window of 8
    want = np.array(lm.model(ids, cache=make_prompt_cache(lm.model)))
    counts = {"attention": 0, "masked": 0, "gelu": 0}
    for fn, key in ((cpu_kernels.causal_attention, "attention"), (cpu_kernels.masked_attention, "masked"),
                    (cpu_kernels.numpy_gelu_mul, "gelu")):
        monkeypatch.setattr(cpu_kernels, fn.__name__, lambda *a, _f=fn, _k=key: counts.__setitem__(_k, counts[_k] + 1) or _f(*a))
    with lm.cpu_kernels:
        got = np.array(lm.model(ids, cache=make_prompt_cache(lm.model)))
    np.testing.assert_allclose(got, want, atol=1e-4)
    layers = len(lm.model.layers)
    if name.startswith("gemma3"):  # five sliding layers, one global; GELU in every MLP
        assert counts == {"attention": 1, "masked": 5, "gelu": layers}
    else:
        assert counts == {"attention": layers, "masked": 0, "gelu": 0}
    import mlx_lm.models.gemma3_text as gemma

    assert gemma.nn is nn  # the scope put mlx.nn back


@pytest.mark.parametrize("name, note", [("gemma3-f16", "prefill attention+GELU in numpy"),
                                        ("qwen3-f16", "prefill attention+SwiGLU in numpy")])
def test_load_line_names_the_prefill_kernels_the_architecture_runs(name, note):
    """gemma3's MLP is GELU, not SwiGLU: the load line says which numpy kernels prefill runs."""
    lm = load_model(str(FIXTURES / f"{name}.gguf"))
    assert lm.cpu_kernels is not None
    assert lm.description.split(", ")[-2] == note
