"""The span kernel (mlxcel_py/models/cpu/quant/span.py): a verify's 5-17 input rows over GGUF blocks,
against vector.stream_int8 (the one-token kernel plain decoding uses) and the same int8 formula in
float64, and products.linear's dispatch by row count."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu.quant import int8_ir, kblock, products, span
from test_quant_blocks import _reference, _weight

# the span's types; Q4_K and Q6_K leave it where kblock's product runs (test_k_quant_verifies_...)
VECTOR = tuple(t for t in (T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K) if int(t) not in kblock.KBLOCK_TYPES)
needs_avx2 = pytest.mark.skipif(not int8_ir.HAS_AVX2, reason="the span kernel is AVX2 code")


def _span(x, w, threads=1):
    return span.linear(x, w, np.full((x.shape[0], w.shape[0]), np.nan, np.float32), threads)


@needs_avx2
@pytest.mark.parametrize("qtype", VECTOR, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 17])
def test_span_rows_agree_with_the_one_token_kernel(qtype, rows):
    """Each input row's sums equal what the 4-row kernel gives it, to float rounding (the verify's
    logits are plain decoding's), and the int8 formula in float64."""
    w = _weight(qtype, 21, 512, seed=rows)
    x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
    got, plain = _span(x, w), products.linear_int8_vector(x, w)
    assert np.all(np.abs(got - plain) <= 1e-6 * np.abs(plain).max())
    if qtype == T.Q8_0:  # no offset (bias) FMA that LLVM may fuse otherwise: bit for bit
        assert np.array_equal(got, plain)
    xq, xd, _ = products.quantize_activations(x)
    x_hat = np.repeat(xd.astype(np.float64), 32, axis=1) * xq
    ref = _reference(w).astype(np.float64)
    assert np.all(np.abs(got - x_hat @ ref.T) <= 2e-5 * (np.abs(x_hat) @ np.abs(ref).T) + 1e-6)
    assert np.array_equal(got, _span(x, w, threads=2))  # no bit moves with threads


@pytest.mark.skipif(not kblock.KBLOCK_TYPES, reason="kblock's product is AVX2 and FMA code")
@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q6_K), ids=lambda t: t.name)
def test_k_quant_verifies_give_each_row_its_decode_bits(qtype):
    """Q4_K and Q6_K stay off the span where kblock's product runs: a verify's rows (5-17 input rows
    through products.linear) get each row's one-row product bit for bit, on 1 and 2 threads."""
    w = _weight(qtype, 21, 1024, seed=3)
    for rows in (5, 9, 17):
        assert not span.reads(qtype, rows)
        x = np.random.default_rng(rows).standard_normal((rows, 1024)).astype(np.float32)
        one = np.concatenate([products.linear(x[r : r + 1], w) for r in range(rows)])
        assert np.array_equal(products.linear(x, w), one)
        assert np.array_equal(products.linear(x, w, threads=2), one)


@needs_avx2
def test_linear_sends_five_rows_and_more_to_the_span_kernel():
    w = _weight(T.Q4_1, 7, 256)
    for rows in (1, 4, 5, 12):
        x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
        expected = _span(x, w) if rows >= span.MIN_ROWS else products.linear_int8_vector(x, w)
        assert span.reads(w.qtype, rows) == (rows >= 5)
        assert np.array_equal(products.linear(x, w), expected)
    assert not span.reads(T.Q5_0, 8)
    with pytest.raises(ValueError, match="does not read Q5_0"):
        span.linear(np.zeros((5, 32), np.float32), _weight(T.Q5_0, 2, 32), np.zeros((5, 2), np.float32), 1)


@needs_avx2
@pytest.mark.parametrize("name", ["llama-q8_0", "llamaq-q4_k_m"])
def test_a_native_verify_through_the_span_kernel_gives_plain_decodings_logits(name):
    """A 1 + 6 token verify (7 rows: the span kernel) equals 7 one-token native steps (the 4-row
    kernel) fed the same tokens, from identical caches, to float rounding, argmax for argmax."""
    from test_cpu_decode import make_batch, prompt
    from test_cpu_decode_native import _pair

    lm, native = _pair(name)
    ours, theirs = make_batch(lm.model, [prompt(11, 3)]), make_batch(lm.model, [prompt(11, 3)])
    span_tokens = list(prompt(7, 40))
    got = np.array(native.verify([span_tokens], ours))[0]
    want = np.stack([np.array(native([t], theirs))[0] for t in span_tokens])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
