"""GGUF block types held natively (mlxcel_py/models/cpu/quant): exact dequantization against the
`gguf` package, both decode-kernel candidates against float64 products, the tiled prefill, and
records over memory-mapped files. One numba compile per kernel (cached)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter, quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from mlxcel_py.errors import ModelLoadError
from mlxcel_py.models.gguf_file import read_gguf
from mlxcel_py.models.cpu.quant import blocks, prefill, products

QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)  # gguf 0.19 quantizes these
K_QUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)  # random valid blocks instead
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def _weight(qtype: T, rows: int, cols: int, seed: int = 0) -> blocks.QuantWeight:
    rng = np.random.default_rng(seed)
    if qtype in (T.F16, T.BF16, T.F32) or qtype in QUANTIZABLE:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.1
        data = w.view(np.uint8) if qtype == T.F32 else (
            w.astype(np.float16).view(np.uint8) if qtype == T.F16 else quants.quantize(w, qtype))
        return blocks.make(qtype, (rows, cols), data)
    size = GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:  # finite super-block scales: |d| in [1e-3, 1e-2)
        d = (rng.uniform(1e-3, 1e-2, raw.shape[0]) * rng.choice([-1, 1], raw.shape[0])).astype(np.float16)
        raw[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.make(qtype, (rows, cols), raw.reshape(rows, -1))


def _reference(w: blocks.QuantWeight) -> np.ndarray:
    if w.qtype == T.F32:
        return w.blocks.view(np.float32)
    if w.qtype == T.F16:
        return w.blocks.view(np.float16).astype(np.float32)
    return quants.dequantize(w.blocks, w.qtype)


def _q8_reference(x: np.ndarray):
    """Q8_0 activation quantization in numpy: the kernel's codes, scales and sums must equal it."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(axis=-1) / np.float32(127.0)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), np.float32(0.0)).astype(np.float32)
    v = xb * inv[..., None]
    q = np.trunc(v + np.copysign(np.float32(0.5), v)).astype(np.int8)
    return q.reshape(x.shape), d, q.reshape(x.shape[0], -1, 16).astype(np.int32).sum(axis=-1)


ALL = QUANTIZABLE + K_QUANTS + (T.F16, T.BF16, T.F32)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_dequantize_equals_gguf_exactly(qtype):
    w = _weight(qtype, 7, 512, seed=int(qtype))
    assert np.array_equal(products.dequantize(w), _reference(w))
    assert np.array_equal(products.dequantize(w, threads=2), _reference(w))


def _check_float(x, w, ref):
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    bound = 2e-5 * (np.abs(x) @ np.abs(ref).T) + 1e-6  # float32 accumulation over K terms
    got = products.linear_float(x, w)
    assert got.dtype == np.float32 and got.shape == exact.shape
    assert np.all(np.abs(got - exact) <= bound)


def _check_int8(x, w, ref):
    xq, xd, xsum = products.quantize_activations(x)
    q_ref, d_ref, s_ref = _q8_reference(x)
    assert np.array_equal(xq, q_ref) and np.array_equal(xd, d_ref) and np.array_equal(xsum, s_ref)
    x_hat = np.repeat(xd.astype(np.float64), 32, axis=1) * xq  # the same integer formula, in float64
    same_formula = x_hat @ ref.astype(np.float64).T
    got = products.linear_int8(x, w)
    assert np.all(np.abs(got - same_formula) <= 2e-5 * (np.abs(x_hat) @ np.abs(ref).T) + 1e-6)
    # Against the true product: each activation moves by at most half its block's step.
    step = np.repeat(xd.astype(np.float64), 32, axis=1) / 2
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    assert np.all(np.abs(got - exact) <= step @ np.abs(ref).T * 1.001 + 1e-5)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8])
def test_products_match_float64(qtype, rows):
    w = _weight(qtype, 13, 512, seed=rows)  # 13 outputs: not a multiple of the 4-row tile
    ref = _reference(w)
    x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
    _check_float(x, w, ref)
    if qtype in blocks.BLOCK_TYPES:
        _check_int8(x, w, ref)
    assert np.array_equal(products.linear(x, w), products.linear(x, w, threads=2))  # no bit moves


@pytest.mark.parametrize("qtype,shape", [(T.Q4_1, (1536, 576)), (T.Q8_0, (576, 1536)), (T.Q4_K, (576, 1536)),
                                         (T.Q6_K, (1536, 768)), (T.Q5_0, (577, 576))], ids=str)
def test_real_model_shapes(qtype, shape):
    w = _weight(qtype, *shape)
    ref = _reference(w)
    x = np.random.default_rng(1).standard_normal((4, shape[1])).astype(np.float32)
    _check_float(x, w, ref)
    _check_int8(x, w, ref)


@pytest.mark.parametrize("qtype", (T.Q4_0, T.Q6_K, T.F16, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K), ids=lambda t: t.name)
def test_tiled_prefill_equals_blas_on_the_dequantized_weight(qtype):
    w = _weight(qtype, 600, 512)  # three tiles of 256 rows (512 KiB), the last one short
    x = np.random.default_rng(2).standard_normal((37, 512)).astype(np.float32)
    ref = _reference(w)
    got = prefill.matmul_tiled(x, w, tile_bytes=256 * 512 * 4)
    bound = 2e-5 * (np.abs(x) @ np.abs(ref).T) + 1e-6  # float32 BLAS against float64
    assert np.all(np.abs(got - x.astype(np.float64) @ ref.astype(np.float64).T) <= bound)
    assert prefill.scratch_bytes(w) == 600 * 512 * 4  # the 16 MiB default holds all 600 rows
    assert prefill.scratch_bytes(w, 256 * 512 * 4) == 256 * 512 * 4
    small_tiles = prefill.matmul_tiled(x, w, tile_bytes=64 * 512 * 4)  # BLAS blocks differ: rounding only
    assert np.all(np.abs(small_tiles - got) <= 2 * bound)


def test_records_are_views_of_the_mapped_file(tmp_path):
    path = tmp_path / "q.gguf"
    writer = GGUFWriter(path, "llama")
    dense = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    for name, qtype in (("a", T.Q4_0), ("b", T.Q8_0)):
        writer.add_tensor(name, quants.quantize(dense, qtype), raw_dtype=qtype)
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    parsed = read_gguf(path)
    for info in parsed.tensors.values():
        w = blocks.from_tensor_info(info)
        assert w.shape == (8, 64) and np.shares_memory(w.blocks, info.data)
        assert np.array_equal(products.dequantize(w), quants.dequantize(info.data, info.qtype))
    reader_tensor = GGUFReader(path).tensors[1]
    w = blocks.from_reader_tensor(reader_tensor)
    assert w.qtype == T.Q8_0 and w.shape == (8, 64) and np.shares_memory(w.blocks, reader_tensor.data)
    assert w.bits_per_weight == 8.5


def test_bad_tensors_are_refused_with_their_name():
    with pytest.raises(ModelLoadError, match="w: GGUF type IQ2_XXS has no native CPU kernel"):
        blocks.make(T.IQ2_XXS, (1, 256), np.zeros(66, np.uint8), "w")
    with pytest.raises(ModelLoadError, match=r"w: 10 bytes for a Q4_0 tensor of 1x32 \(18 expected\)"):
        blocks.make(T.Q4_0, (1, 32), np.zeros(10, np.uint8), "w")
    with pytest.raises(ModelLoadError, match="w: row of 8 is not whole F16 blocks"):
        blocks.make(T.F16, (1, 8), np.zeros(16, np.uint8), "w")
    with pytest.raises(ValueError, match="does not multiply"):
        products.linear(np.zeros((1, 31), np.float32), _weight(T.Q4_0, 2, 32))
