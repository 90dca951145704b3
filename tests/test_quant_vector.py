"""The explicit-vector decode kernels (mlxcel_py/models/quant/vector.py) against float64 products
of the exactly dequantized weight, over the GGUF types they read and 1-8 input rows."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.quant import products
from test_quant_blocks import _reference, _weight

VECTOR = (T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K)


def _bound(x, ref):
    return 2e-5 * (np.abs(x).astype(np.float64) @ np.abs(ref).T.astype(np.float64)) + 1e-6


@pytest.mark.parametrize("qtype", VECTOR, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_vector_products_match_float64(qtype, rows):
    w = _weight(qtype, 13, 512, seed=rows)
    ref = _reference(w)
    x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
    got = products.linear_vector(x, w)
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    assert got.dtype == np.float32 and got.shape == (rows, 13)
    assert np.all(np.abs(got - exact) <= _bound(x, ref))
    assert np.array_equal(got, products.linear_vector(x, w, threads=2))  # no bit moves with threads


@pytest.mark.parametrize("qtype,shape", [(T.Q4_0, (1536, 576)), (T.Q8_0, (576, 1536)), (T.Q4_K, (257, 2048)),
                                         (T.Q6_K, (64, 768))], ids=str)
def test_vector_real_model_shapes(qtype, shape):
    w = _weight(qtype, *shape)
    ref = _reference(w)
    x = np.random.default_rng(1).standard_normal((4, shape[1])).astype(np.float32)
    got = products.linear_vector(x[:, :], w, out=np.full((4, shape[0]), np.nan, np.float32))
    assert np.all(np.abs(got - x.astype(np.float64) @ ref.astype(np.float64).T) <= _bound(x, ref))


def test_vector_refuses_what_it_does_not_read():
    with pytest.raises(ValueError, match="does not read Q5_0"):
        products.linear_vector(np.zeros((1, 32), np.float32), _weight(T.Q5_0, 2, 32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        products.linear_vector(np.zeros((1, 32), np.float32), _weight(T.Q4_0, 2, 32), out=np.zeros((1, 4), np.float32)[:, ::2])
