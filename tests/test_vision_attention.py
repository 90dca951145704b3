"""The vision tower's attention in numpy (models/vision_attention.py) against mlx-vlm's own module: the same
outputs for one image and for several, a masked call left to mlx-vlm, and the wrapping done once per layer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx_vlm", reason="make setup installs mlx-vlm")


def _attention(dims: int = 64, heads: int = 4):
    import mlx.core as mx
    from mlx_vlm.models.attention import VisionAttention

    mx.random.seed(3)
    module = VisionAttention(dims, heads, bias=True)
    mx.eval(module.parameters())
    return module


@pytest.mark.parametrize("batch, length", [(1, 37), (3, 300)])
def test_numpy_attention_equals_mlx_vlms(batch, length):
    import mlx.core as mx

    from mlxcel_py.models.vision_attention import NumpyAttention

    module = _attention()
    x = mx.random.normal((batch, length, 64), key=mx.random.key(length))
    want, got = np.array(module(x)), np.array(NumpyAttention(module)(x))
    assert got.shape == want.shape == (batch, length, 64)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_a_mask_goes_to_mlx_vlm_and_each_layer_is_wrapped_once():
    import mlx.core as mx
    from types import SimpleNamespace

    from mlx_vlm.models.gemma3.vision import VisionModel

    from mlxcel_py.models.vision_attention import NumpyAttention, install

    module = _attention()
    x = mx.random.normal((1, 9, 64), key=mx.random.key(1))
    mask = mx.tril(mx.ones((9, 9), dtype=mx.bool_))
    np.testing.assert_array_equal(np.array(NumpyAttention(module)(x, mask)), np.array(module(x, mask)))
    tower = VisionModel(SimpleNamespace(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=3, num_attention_heads=2, patch_size=4, image_size=16,
                                        num_channels=3, layer_norm_eps=1e-6))
    assert install(tower) == 3 and install(tower) == 0
    assert all(isinstance(layer.self_attn, NumpyAttention) for layer in tower.vision_model.encoder.layers)
