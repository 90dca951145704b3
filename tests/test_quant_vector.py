"""The explicit-vector decode kernels (mlxcel_py/models/cpu/quant/vector.py) against float64 products
of the exactly dequantized weight, over the GGUF types they read and 1-8 input rows."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu.quant import blocks, int8_ir, kblock, products
from test_quant_blocks import _reference, _weight

VECTOR = (T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K)
FLOATS = (T.F16, T.BF16)  # candidate c only: no codes for d
OFFSET = (T.Q4_1, T.Q4_K, T.Q5_1, T.Q2_K, T.Q5_K)  # w = scale * code + offset


def _bound(x, ref):
    return 2e-5 * (np.abs(x).astype(np.float64) @ np.abs(ref).T.astype(np.float64)) + 1e-6


@pytest.mark.parametrize("qtype", VECTOR + FLOATS, ids=lambda t: t.name)
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
                                         (T.Q6_K, (64, 768)), (T.Q5_0, (1536, 576)), (T.Q5_1, (576, 1536)),
                                         (T.Q2_K, (65, 1024)), (T.Q3_K, (130, 768)), (T.Q5_K, (257, 2048))], ids=str)
def test_vector_real_model_shapes(qtype, shape):
    w = _weight(qtype, *shape)
    ref = _reference(w)
    x = np.random.default_rng(1).standard_normal((4, shape[1])).astype(np.float32)
    got = products.linear_vector(x[:, :], w, out=np.full((4, shape[0]), np.nan, np.float32))
    assert np.all(np.abs(got - x.astype(np.float64) @ ref.astype(np.float64).T) <= _bound(x, ref))


def test_vector_refuses_what_it_does_not_read():
    with pytest.raises(ValueError, match="does not read F32 rows of 32"):
        products.linear_vector(np.zeros((1, 32), np.float32), _weight(T.F32, 2, 32))
    with pytest.raises(ValueError, match="does not read F16 rows of 48"):  # not whole units of 32
        products.linear_vector(np.zeros((1, 48), np.float32), _weight(T.F16, 2, 48))
    w = _weight(T.F16, 3, 48)  # linear and dequantize take candidate a's loops there
    assert np.array_equal(products.dequantize(w), w.blocks.view(np.float16).astype(np.float32))
    assert np.array_equal(products.linear(np.ones((1, 48), np.float32), w), products.linear_float(np.ones((1, 48), np.float32), w))
    if int8_ir.HAS_AVX2:
        with pytest.raises(ValueError, match="int8 vector kernel does not read BF16"):
            products.linear_int8_vector(np.zeros((1, 32), np.float32), _weight(T.BF16, 2, 32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        products.linear_vector(np.zeros((1, 32), np.float32), _weight(T.Q4_0, 2, 32), out=np.zeros((1, 4), np.float32)[:, ::2])


needs_avx2 = pytest.mark.skipif(not int8_ir.HAS_AVX2, reason="the int8 vector kernel is AVX2 code")


@needs_avx2
@pytest.mark.parametrize("qtype", VECTOR, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_int8_vector_products_match_the_same_formula_in_float64(qtype, rows):
    w = _weight(qtype, 13, 512, seed=rows)
    ref = _reference(w).astype(np.float64)
    x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
    if int(qtype) in kblock.KBLOCK_TYPES:  # Q4_K, Q6_K: the input per 256 values (test_quant_kblock)
        xq, xd, _ = kblock.quantize(x)
        x_hat = np.repeat(xd.astype(np.float64), 256, axis=1) * xq
    else:
        xq, xd, _ = products.quantize_activations(x)  # tested against numpy in test_quant_blocks
        x_hat = np.repeat(xd.astype(np.float64), 32, axis=1) * xq
    got = products.linear_int8_vector(x, w)
    assert got.dtype == np.float32 and got.shape == (rows, 13)
    assert np.all(np.abs(got - x_hat @ ref.T) <= 2e-5 * (np.abs(x_hat) @ np.abs(ref).T) + 1e-6)
    assert np.array_equal(got, products.linear_int8_vector(x, w, threads=2))


@needs_avx2
def test_int8_vector_reads_codes_at_their_extremes():
    """Q8_0 codes of -128 and 127 against activation codes of +-127: no int16 saturation."""
    raw = np.zeros((2, 34), np.uint8)
    raw[:, :2] = np.array([1.0], np.float16).view(np.uint8)
    raw[0, 2:] = np.array([-128] * 16 + [127] * 16, np.int8).view(np.uint8)
    raw[1, 2:] = np.array([-128, 127] * 16, np.int8).view(np.uint8)
    w = blocks.make(T.Q8_0, (2, 32), raw)
    x = np.array([[-1.0] * 16 + [1.0] * 16], np.float32)  # codes -127 / 127, d = 1/127
    got = products.linear_int8_vector(x, w)
    assert np.allclose(got, [[128 * 16 + 127 * 16, 0.0]], rtol=1e-6, atol=1e-3)  # row 1: pairs cancel


@pytest.mark.parametrize("qtype", VECTOR + FLOATS, ids=lambda t: t.name)
def test_vector_unpacks_every_weight_where_the_file_has_it(qtype):
    """One-hot input rows read back each weight: exactly gguf's dequantization where the type has
    no offset (code * scale), to within float32's fused rounding of code * scale + offset otherwise."""
    w = _weight(qtype, 5, 512, seed=7)
    ref = _reference(w)
    got = products.linear_vector(np.eye(512, dtype=np.float32), w).T
    if qtype in OFFSET:
        assert np.all(np.abs(got - ref) <= 1e-6 * np.abs(ref).max())
    else:
        assert np.array_equal(got, ref)


def test_linear_runs_the_fastest_candidate_for_this_cpu():
    kind = "int8v" if int8_ir.HAS_AVX2 else "vector"
    assert [products.chosen(t) for t in VECTOR] == [kind] * 10
    assert products.chosen(T.F16) == products.chosen(T.BF16) == "vector" and products.chosen(T.F32) == "float"
    w, x = _weight(T.Q4_K, 3, 256), np.ones((2, 256), np.float32)
    expected = products.linear_int8_vector(x, w) if int8_ir.HAS_AVX2 else products.linear_vector(x, w)
    assert np.array_equal(products.linear(x, w), expected)


@needs_avx2
@pytest.mark.parametrize("qtype", VECTOR, ids=lambda t: t.name)
@pytest.mark.parametrize("columns", [512, 2048])
def test_the_fused_steps_tiles_give_each_sum_the_one_row_kernels_bits(qtype, columns):
    """quant/step._product takes two weight rows a call at one input row where a row is short
    (vector.PAIR_ROW_BYTES; 13 rows: an odd one left), one a call where it is long, and four input rows
    a call with their offsets side by side (int8_ir.emit_dots; kblock_ir.emit_kdots for Q4_K and Q6_K),
    a prompt's many rows in tiles (vector.INPUT_TILE_BYTES: 70 rows of 2,048 columns are tiles of 32, 32
    and 6): every sum equals the one-input-row, one-weight-row call's (vector.stream_int8 or
    kblock.stream_kblock of that weight row alone) bit for bit."""
    from mlxcel_py.models.cpu.quant import step, vector
    from mlxcel_py.models.cpu.quant.vector_ir import UNITS

    w = _weight(qtype, 13, columns, seed=5)
    raw, units = np.ascontiguousarray(w.blocks), columns // UNITS[int(qtype)][0]
    x = np.random.default_rng(5).standard_normal((70, columns)).astype(np.float32)
    (q,) = step.input_sets(70, (columns,))
    step._quantize(x, q)
    alone = np.zeros((70, 13), np.float32)
    assert vector.INPUT_TILE_BYTES // 2048 < 70 - 4  # the 2,048-column case crosses tiles
    for r in range(70):
        for n in range(13):
            one = (raw[n : n + 1], alone[r : r + 1, n : n + 1], 1, units)
            if int(qtype) in kblock.KBLOCK_TYPES:  # Q4_K, Q6_K: over the input per 256 (kblock.py)
                kblock.stream_kblock(int(qtype), *(a[r : r + 1] for a in q[4:]), *one)
            else:
                vector.stream_int8(int(qtype), q[0][r : r + 1], q[1][r : r + 1], q[3][r : r + 1], *one)
    for rows in (1, 4, 70):
        out = np.full((rows, 15), np.nan, np.float32)
        step._product(raw, int(qtype), units, 2, 0, 13, tuple(a[:rows] for a in q), out)
        assert np.array_equal(out[:, 2:], alone[:rows]) and np.isnan(out[:, :2]).all()
