"""Q5_0 and Q8_0 repacked eight rows at a time (kquant_r8.repack, r8_ir32.py): the layouts against the
file's blocks, and the products at real row widths (640: Gemma 3 270M's, 576: SmolLM2's, 896, 1,024, 2,048)
against a second implementation of the same arithmetic in numpy, bit for bit, and against gguf's
dequantized weights in float64; the same bits on 1 and 2 threads, alone or in a batch, in any group."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from mlxcel_py.models.cpu.quant import kquant_r8
from mlxcel_py.models.cpu.quant.kernels import quantize_rows_q8
from test_quant_blocks import _weight
from test_quant_kquant_r8 import _fma, assert_every_split

needs_r8 = pytest.mark.skipif(not kquant_r8.AVAILABLE, reason="the repacked product is AVX2 and FMA code")
WIDTHS = (576, 640, 896, 1024, 2048)
SIZE = {T.Q5_0: 22, T.Q8_0: 34}


def _fields(blocks: np.ndarray, qtype):
    """(d (N, units) float32, codes (N, units, 32) int64 as the kernel multiplies them, bias)."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, SIZE[qtype])
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == T.Q8_0:
        return d, b[..., 2:34].view(np.int8).astype(np.int64), 0
    qh = b[..., 2:6].copy().view(np.uint32)[..., 0].astype(np.int64)
    qs = b[..., 6:22].astype(np.int64)
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)  # codes 0..15 in the low nibbles, 16..31 in the high
    high = (qh[..., None] >> np.arange(32)) & 1
    return d, low | (high << 4), 16


def _quantize(x: np.ndarray):
    xq, xd, xs = np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // 32), np.float32), \
        np.empty((x.shape[0], x.shape[1] // 16), np.int32)
    quantize_rows_q8(np.ascontiguousarray(x), xq, xd, xs)
    return xq, xd, xs


def _exact(blocks, xq, xd, qtype) -> np.ndarray:
    """Per block: sumi = codes . x - bias * sum(x) in integers, acc = fma(float(sumi), d * d_x, acc)."""
    d, codes, bias = _fields(blocks, qtype)
    out = np.zeros((xq.shape[0], blocks.shape[0]), np.float32)
    for r in range(xq.shape[0]):
        acc = np.zeros(blocks.shape[0], np.float32)
        for u in range(codes.shape[1]):
            x = xq[r, 32 * u: 32 * (u + 1)].astype(np.int64)
            sumi = codes[:, u] @ x - bias * x.sum()
            acc = _fma(sumi.astype(np.float32), d[:, u] * np.float32(xd[r, u]), acc)
        out[r] = acc
    return out


def _product(r8, xq, xd, xs, threads, units, qtype):
    out = np.full((xq.shape[0], r8.shape[0] * kquant_r8.ROWS), np.nan, np.float32)
    kquant_r8.stream_r8(int(qtype), xq, xd, xs, r8, out, threads, units)
    return out


@pytest.mark.parametrize("qtype", (T.Q5_0, T.Q8_0), ids=lambda t: t.name)
def test_the_layout_holds_each_row_s_codes_where_the_kernel_reads_them(qtype):
    w = _weight(qtype, 16, 64, seed=3)
    blocks = np.ascontiguousarray(w.blocks)
    r8 = kquant_r8.repack(blocks, int(qtype))
    d, codes, _ = _fields(blocks, qtype)
    size = kquant_r8.GROUP_BYTES[int(qtype)]
    assert r8.shape == (2, 2 * size) and size == 8 * SIZE[qtype]  # the rows' own bytes, reordered
    block = r8[1, size:]  # group 1 (rows 8..15), block 1
    assert np.array_equal(block[0:16].view(np.float16).astype(np.float32), d[8:16, 1])
    if qtype == T.Q8_0:
        got = block[16:].view(np.int8).reshape(8, 8, 4).transpose(1, 0, 2).reshape(8, 32)  # [m][row][4]
    else:
        nib = block[16:144].reshape(4, 8, 4).transpose(1, 0, 2).reshape(8, 16)  # [p][row][4]
        high = block[144:176].reshape(8, 4)  # [row][i]: bit m = code 4m + i's fifth
        bits = (high[:, None, :] >> np.arange(8)[None, :, None]) & 1  # [row][m][i]
        got = np.concatenate([nib & 15, nib >> 4], axis=1) | (bits.reshape(8, 32) << 4)
    assert np.array_equal(got, codes[8:16, 1])


@needs_r8
@pytest.mark.parametrize("qtype", (T.Q5_0, T.Q8_0), ids=lambda t: t.name)
@pytest.mark.parametrize("width", WIDTHS)
def test_each_width_gives_the_numpy_arithmetic_bit_for_bit_on_every_split(qtype, width):
    w = _weight(qtype, 24, width, seed=width)
    blocks, units = np.ascontiguousarray(w.blocks), width // 32
    r8 = kquant_r8.repack(blocks, int(qtype))
    x = np.random.default_rng(width).standard_normal((5, width)).astype(np.float32)
    xq, xd, xs = _quantize(x)
    whole = assert_every_split(lambda *a: _product(*a, units, qtype), w, r8, xq, xd, xs, 32)
    assert np.array_equal(whole, _exact(blocks, xq, xd, qtype))


@needs_r8
def test_q8_0_s_extreme_codes_do_not_saturate():
    """Codes of -128 and 127 against inputs of +-127: |w| x |x| pairs stay inside vpmaddubsw's int16."""
    w = _weight(T.Q8_0, 8, 64, seed=1)
    blocks = np.ascontiguousarray(w.blocks).copy()
    b = blocks.reshape(8, 2, 34)
    b[..., 2:34] = np.where(np.arange(32) % 2, 127, 128).astype(np.uint8)  # 127, -128 alternating
    x = np.where(np.arange(64) % 2, -1.0, 1.0).astype(np.float32)[None] * 3.0
    xq, xd, xs = _quantize(x)
    got = _product(kquant_r8.repack(blocks, int(T.Q8_0)), xq, xd, xs, 1, 2, T.Q8_0)
    assert np.array_equal(got, _exact(blocks, xq, xd, T.Q8_0))
