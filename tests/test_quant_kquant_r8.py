"""Q4_K and Q6_K repacked eight rows at a time (mlxcel_py/models/cpu/quant/kquant_r8.py): the layouts
against the file's blocks, and the products at the hidden sizes real models have against a second
implementation of the same arithmetic in numpy (bit for bit), against gguf's dequantized weights in
float64, and the same bits on 1 and 2 threads, alone or in a batch, in any group."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu.quant import kblock, kquant_r8
from test_quant_blocks import _reference, _weight

needs_r8 = pytest.mark.skipif(not kquant_r8.AVAILABLE, reason="the repacked product is AVX2 and FMA code")
WIDTHS = (1536, 2048, 2560, 3072, 3584, 4096)  # Qwen2.5 1.5B .. Llama 3.1 8B


def _fields(blocks: np.ndarray):
    """Q4_K blocks (N, units * 144) -> d, dmin (N, units) float32; scales, mins (N, units, 8); codes
    (N, units, 256) in weight order, from gguf's own layout."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, 144)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc, m = kquant_r8._scale_min(b[..., 4:16])
    qs = b[..., 16:].reshape(n, -1, 4, 32)
    codes = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, -1, 256)  # 64p + i: low nibbles, then high
    return d, dmin, sc, m, codes


def _fma(a, b, c):
    """float32 a * b + c rounded once (emulated in long double)."""
    return (np.longdouble(a) * np.longdouble(b) + np.longdouble(c)).astype(np.float32)


def _exact(blocks: np.ndarray, xq, xd, xs, qtype=T.Q4_K) -> np.ndarray:
    """The repacked product's arithmetic in numpy: a block's integer sums exact, then per block
    acc = fma(float(sumi), d * d_x, acc) (fused: one rounding), Q4_K's mins likewise and the result
    acc - mins; Q6_K's bias of 32 subtracted from sumi in integers. All float32."""
    if qtype == T.Q4_K:
        d, dmin, sc, m, codes = _fields(blocks)
        sub = 32
    else:
        b = blocks.reshape(blocks.shape[0], -1, 210)
        d = b[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
        sc, codes, sub = b[..., 192:208].view(np.int8), kquant_r8.q6_k_codes(b), 16
    units = codes.shape[1]
    out = np.zeros((xq.shape[0], blocks.shape[0]), np.float32)
    for r in range(xq.shape[0]):
        acc = np.zeros(blocks.shape[0], np.float32)
        mins = np.zeros(blocks.shape[0], np.float32)
        for u in range(units):
            x = xq[r, 256 * u: 256 * (u + 1)].astype(np.int64).reshape(-1, sub)
            sumi = ((codes[:, u].astype(np.int64).reshape(-1, 256 // sub, sub) * x).sum(axis=2) * sc[:, u]).sum(axis=1)
            sums16 = xs[r, 16 * u: 16 * (u + 1)].astype(np.int64)
            dx = np.float32(xd[r, u])
            if qtype == T.Q4_K:
                msum = (m[:, u].astype(np.int64) * sums16.reshape(8, 2).sum(axis=1)).sum(axis=1)
                mins = _fma(msum.astype(np.float32), dmin[:, u] * dx, mins)
            else:
                sumi = sumi - 32 * (sc[:, u].astype(np.int64) * sums16).sum(axis=1)
            acc = _fma(sumi.astype(np.float32), d[:, u] * dx, acc)
        out[r] = acc - mins
    return out


def _product(r8, xq, xd, xs, threads, units, qtype=T.Q4_K):
    out = np.full((xq.shape[0], r8.shape[0] * kquant_r8.ROWS), np.nan, np.float32)
    kquant_r8.stream_r8(int(qtype), xq, xd, xs, r8, out, threads, units)
    return out


def assert_every_split(product, w, r8, xq, xd, xs, values):
    """`product(r8, xq, xd, xs, threads)`'s rows: the same bits on 1 and 2 threads, each row alone as in
    the batch, group 2 read first as last; and within float rounding of gguf's dequantized weights times
    the quantized input (scales per `values`), in float64. Returns the product on 2 threads."""
    whole = product(r8, xq, xd, xs, 2)
    assert np.array_equal(whole, product(r8, xq, xd, xs, 1))
    for b in range(xq.shape[0]):  # alone == in the batch (4 + 1 a call for 5)
        assert np.array_equal(product(r8, xq[b:b + 1], xd[b:b + 1], xs[b:b + 1], 2)[0], whole[b])
    moved = product(np.ascontiguousarray(r8[::-1]), xq, xd, xs, 2)  # group 2 first: the same bits
    assert np.array_equal(moved[:, :8], whole[:, 16:])
    x_hat = np.repeat(xd.astype(np.float64), values, axis=1) * xq
    ref = _reference(w).astype(np.float64)
    assert np.all(np.abs(whole - x_hat @ ref.T) <= 2e-5 * (np.abs(x_hat) @ np.abs(ref).T) + 1e-6)
    return whole


def test_the_layout_holds_each_row_s_fields_where_the_kernel_reads_them():
    w = _weight(T.Q4_K, 16, 512, seed=3)
    r8 = kquant_r8.repack(w.blocks)
    d, dmin, sc, m, codes = _fields(np.ascontiguousarray(w.blocks))
    assert r8.shape == (2, 2 * kquant_r8.GROUP_BYTES[kquant_r8.Q4_K])
    block = r8[1, kquant_r8.GROUP_BYTES[kquant_r8.Q4_K]:]  # group 1 (rows 8..15), block 1
    assert np.array_equal(block[0:16].view(np.float16).astype(np.float32), d[8:16, 1])
    assert np.array_equal(block[16:32].view(np.float16).astype(np.float32), dmin[8:16, 1])
    assert np.array_equal(block[32:96].reshape(8, 8), sc[8:16, 1].T)  # scales[j][row]
    assert np.array_equal(block[96:160].reshape(4, 8, 2), m[8:16, 1].reshape(8, 4, 2).transpose(1, 0, 2))
    packed = block[160:].reshape(4, 8, 8, 4)  # [p][g][row][4 bytes]
    for row in (0, 5):
        low = packed[:, :, row].reshape(4, 32) & 15
        assert np.array_equal(low, codes[8 + row, 1].reshape(4, 64)[:, :32])


def test_rows_that_do_not_make_whole_groups_are_refused():
    w = _weight(T.Q4_K, 12, 256)
    with pytest.raises(ValueError, match="whole groups of 8"):
        kquant_r8.repack(w.blocks)
    with pytest.raises(ValueError, match="whole groups of 8"):
        kquant_r8.repack(_weight(T.Q6_K, 4, 256).blocks, int(T.Q6_K))


@needs_r8
@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q6_K), ids=lambda t: t.name)
@pytest.mark.parametrize("width", WIDTHS)
def test_each_width_gives_the_numpy_arithmetic_bit_for_bit_on_every_split(qtype, width):
    w = _weight(qtype, 24, width, seed=width)
    blocks, units = np.ascontiguousarray(w.blocks), width // 256
    r8 = kquant_r8.repack(blocks, int(qtype))
    x = np.random.default_rng(width).standard_normal((5, width)).astype(np.float32)
    xq, xd, xs = kblock.quantize(x)
    whole = assert_every_split(lambda *a: _product(*a, units, qtype), w, r8, xq, xd, xs, 256)
    assert np.array_equal(whole, _exact(blocks, xq, xd, xs, qtype))


@needs_r8
@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q6_K), ids=lambda t: t.name)
def test_the_repacked_product_agrees_with_kblock_s_within_float_rounding(qtype):
    w = _weight(qtype, 64, 2048, seed=7)
    blocks = np.ascontiguousarray(w.blocks)
    xq, xd, xs = kblock.quantize(np.random.default_rng(7).standard_normal((3, 2048)).astype(np.float32))
    want = np.zeros((3, 64), np.float32)
    kblock.stream_kblock(int(qtype), xq, xd, xs, blocks, want, 2, 8)
    got = _product(kquant_r8.repack(blocks, int(qtype)), xq, xd, xs, 2, 8, qtype)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale and not np.array_equal(got, np.zeros_like(got))
