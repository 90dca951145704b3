"""The K-quant products over super-block activations (mlxcel_py/models/cpu/quant/kblock.py): the
activations' quantizer against numpy, and Q4_K / Q6_K products at the hidden sizes real models have
against the same formula in float64, bit for bit across thread counts and tiles."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu.quant import kblock
from mlxcel_py.models.cpu.quant.kernels import quantize_rows_q8
from test_quant_blocks import _reference, _weight

needs_kblock = pytest.mark.skipif(not kblock.KBLOCK_TYPES, reason="kblock's product is AVX2 and FMA code")
WIDTHS = (1536, 2048, 2560, 3072, 3584, 4096)  # Qwen2.5 1.5B .. Llama 3.1 8B


def _numpy_q8k(x: np.ndarray, group: int = 256):
    """llama.cpp's Q8_K rule (Q8_0's: group 32) with int8_ir's rounding, in numpy: d = max|x| / 127 per
    `group` values, q = round half away from zero of x / d, sums per 16."""
    blocks = x.reshape(x.shape[0], -1, group)
    d = (np.abs(blocks).max(axis=2) / np.float32(127.0)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = (blocks * inv[:, :, None]).astype(np.float32)
    q = np.where(v >= 0, np.floor(v + np.float32(0.5)), -np.floor(np.float32(0.5) - v)).astype(np.int8)
    sums = q.reshape(x.shape[0], -1, 16).astype(np.int32).sum(axis=2)
    return q.reshape(x.shape), d, sums.astype(np.int16 if group == 256 else np.int32)


@pytest.mark.parametrize("group", [32, 256])
def test_the_activations_quantizer_matches_numpy(group):
    """quantize_ir's vectors (16 values a call) give the scalar rule's codes, scales and sums."""
    rng = np.random.default_rng(group)
    x = rng.standard_normal((3, 8960 if group == 32 else 1024)).astype(np.float32) * np.float32(3.0)
    x[1, 256:512] = 0.0  # an all-zero block: scale 0, codes 0
    x[2, :4] = [1e-30, -5.0, 5.0, 2.5]
    x[0, 64:96] = np.arange(-15.5, 16.5, dtype=np.float32)  # with max|x| 127 (scale 1): exact halves
    x[0, 64] = 127.0
    if group == 256:
        got = kblock.quantize(x)
    else:
        got = (np.zeros(x.shape, np.int8), np.zeros((3, x.shape[1] // 32), np.float32),
               np.zeros((3, x.shape[1] // 16), np.int32))
        quantize_rows_q8(x, *got)
    want = _numpy_q8k(x, group)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.abs(got[0]).max() <= 127 and got[1][1, 256 // group] == 0.0 and not got[0][1, 256:512].any()
    assert got[1][0, 64 // group] == 1.0 and got[0][0, 65:67].tolist() == [-15, -14]  # -14.5 -> -15, -13.5 -> -14
    assert got[0][0, 79:81].tolist() == [-1, 1]  # -0.5 -> -1, 0.5 -> 1


@needs_kblock
@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q6_K), ids=lambda t: t.name)
@pytest.mark.parametrize("width", WIDTHS)
def test_each_width_gives_the_formula_and_the_same_bits_on_every_split(qtype, width):
    w = _weight(qtype, 19, width, seed=width)
    raw, units = np.ascontiguousarray(w.blocks), width // 256
    x = np.random.default_rng(width).standard_normal((5, width)).astype(np.float32)
    xq, xd, xs = kblock.quantize(x)
    x_hat = np.repeat(xd.astype(np.float64), 256, axis=1) * xq
    ref = _reference(w).astype(np.float64)

    def product(rows, threads, r=slice(None)):
        out = np.full((rows.stop - rows.start, raw[r].shape[0]), np.nan, np.float32)
        kblock.stream_kblock(int(qtype), xq[rows], xd[rows], xs[rows], raw[r], out, threads, units)
        return out

    whole = product(slice(0, 5), 2)
    assert np.all(np.abs(whole - x_hat @ ref.T) <= 2e-5 * (np.abs(x_hat) @ np.abs(ref).T) + 1e-6)
    assert np.array_equal(whole, product(slice(0, 5), 1))
    for b in range(5):  # one input row (one weight row a call) == its row in the batch of 5 (4 + 1 a call)
        assert np.array_equal(product(slice(b, b + 1), 2)[0], whole[b])
        assert np.array_equal(product(slice(b, b + 1), 1, slice(7, 8))[0, 0], whole[b, 7])
