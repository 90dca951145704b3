"""Row unpackers: one GGUF row of blocks -> int8 codes, and a scale and an offset per 16 weights.

Every supported block type is `w = scale[g] * code + offset[g]` over groups g of 16 weights
(Q4_0/Q8_0 blocks of 32 are two groups with the same scale; K-quant sub-blocks of 32 likewise),
so one generic product kernel serves them all. The scale and offset are the same float32
products that `gguf.quants` computes (e.g. Q4_K: d * sc and -(dmin * m)), so
`scale * code + offset` reproduces its dequantization bit for bit. Layouts: ggml-quants.c.

`lanes` is always 16 (LANES): passed at run time so that LLVM's loop vectorizer, not a full
unroll (numba runs no SLP vectorizer), handles the 16-wide loops."""

from __future__ import annotations

import numpy as np
from numba import njit

LANES = 16
_TWO_112 = np.float32(2.0**112)

# Type codes of the kernels (ggml's own type ids).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30


@njit(cache=True, nogil=True, inline="always")
def f16(r, at):  # pragma: no cover - jitted
    """The float16 at bytes r[at:at+2] as float32; exact for finite values, subnormals included."""
    h = np.uint32(r[at]) | (np.uint32(r[at + 1]) << np.uint32(8))
    bits = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((h & np.uint32(0x7FFF)) << np.uint32(13))
    return np.uint32(bits).view(np.float32) * _TWO_112  # the sign as a bit, not a branch (random signs)


@njit(cache=True, nogil=True)
def _legacy(r, codes, scale, offset, size, has_min, five, signed_off, lanes):  # pragma: no cover
    """Q4_0/Q4_1/Q5_0/Q5_1: d (f16) [m (f16)] [qh (u32)] qs[16] per 32 weights."""
    qs_at = 2 + 2 * has_min + 4 * five
    off = np.int8(signed_off)
    for j in range(codes.shape[0] // 32):
        base, out = j * size, j * 32
        d = f16(r, base)
        m = f16(r, base + 2) if has_min else np.float32(0.0)
        if five:
            _five_bits(r, codes, base + qs_at, base + 2 + 2 * has_min, out, off, lanes)
        else:  # every op stays narrow (it ends in an int8), so LLVM vectorizes 16 bytes at once
            for i in range(lanes):
                q = r[base + qs_at + i]
                codes[out + i] = np.int8(q & np.uint8(15)) - off
                codes[out + 16 + i] = np.int8(q >> np.uint8(4)) - off
        scale[2 * j] = scale[2 * j + 1] = d
        offset[2 * j] = offset[2 * j + 1] = m


@njit(cache=True, nogil=True, inline="always")
def _five_bits(r, codes, qs, qh, out, off, lanes):  # pragma: no cover - jitted
    """Q5_0/Q5_1 codes: the nibbles of qs[16] and bit i of the 32-bit qh as bit 4 of code i."""
    for half in range(2):
        byte = qh + 2 * half
        for i in range(lanes):
            bit = (r[byte + (i >> 3)] >> np.uint8(i & 7)) & np.uint8(1)
            q = r[qs + i]
            nib = (q & np.uint8(15)) if half == 0 else (q >> np.uint8(4))
            codes[out + 16 * half + i] = np.int8(nib | (bit << np.uint8(4))) - off


@njit(cache=True, nogil=True)
def _q8_0(r, codes, scale, offset, lanes):  # pragma: no cover - jitted
    for j in range(codes.shape[0] // 32):
        base, out = j * 34, j * 32
        for i in range(2 * lanes):
            codes[out + i] = np.int8(r[base + 2 + i])  # wraps: the byte's int8 value
        scale[2 * j] = scale[2 * j + 1] = f16(r, base)
        offset[2 * j] = offset[2 * j + 1] = 0.0


@njit(cache=True, nogil=True)
def _q2_k(r, codes, scale, offset, lanes):  # pragma: no cover - jitted
    for sb in range(codes.shape[0] // 256):
        base, out = sb * 84, sb * 256
        d, dmin = f16(r, base + 80), f16(r, base + 82)
        for g in range(16):
            sc = np.int32(r[base + g])
            scale[sb * 16 + g] = d * np.float32(sc & np.uint8(15))
            offset[sb * 16 + g] = -(dmin * np.float32(sc >> 4))
        for h in range(2):
            for s in range(4):
                for i in range(2 * lanes):
                    codes[out + h * 128 + s * 32 + i] = np.int8((r[base + 16 + h * 32 + i] >> np.uint8(2 * s)) & np.uint8(3))


@njit(cache=True, nogil=True)
def _q3_k(r, codes, scale, offset, lanes):  # pragma: no cover - jitted
    for sb in range(codes.shape[0] // 256):
        base, out = sb * 110, sb * 256
        d = f16(r, base + 108)
        for g in range(16):
            low = (np.int32(r[base + 96 + g % 8]) >> (4 * (g // 8))) & 15
            high = (np.int32(r[base + 104 + g % 4]) >> (2 * (g // 4))) & 3
            scale[sb * 16 + g] = d * np.float32((low | (high << 4)) - 32)
            offset[sb * 16 + g] = 0.0
        for h in range(2):
            for s in range(4):
                for i in range(2 * lanes):
                    q = (r[base + 32 + h * 32 + i] >> np.uint8(2 * s)) & np.uint8(3)
                    bit = (r[base + i] >> np.uint8(h * 4 + s)) & np.uint8(1)
                    codes[out + h * 128 + s * 32 + i] = np.int8(q | (bit << np.uint8(2))) - np.int8(4)


@njit(cache=True, nogil=True, inline="always")
def _scale_min_k4(r, at, j):  # pragma: no cover - jitted
    """The 6-bit scale and min of sub-block j from a K-quant's 12 packed bytes at r[at]."""
    if j < 4:
        return np.int32(r[at + j]) & 63, np.int32(r[at + j + 4]) & 63
    md = np.int32(r[at + j + 4])
    sc = (md & np.uint8(15)) | ((np.int32(r[at + j - 4]) >> 2) & 0x30)
    return sc, (md >> 4) | ((np.int32(r[at + j]) >> 2) & 0x30)


@njit(cache=True, nogil=True)
def _q45_k(r, codes, scale, offset, size, five, lanes):  # pragma: no cover - jitted
    """Q4_K (144 bytes) / Q5_K (176 bytes): d, dmin, 12 scale bytes, [qh 32], qs 128 per 256."""
    qs_at = 48 if five else 16
    for sb in range(codes.shape[0] // 256):
        base, out = sb * size, sb * 256
        d, dmin = f16(r, base), f16(r, base + 2)
        for j in range(8):
            sc, m = _scale_min_k4(r, base + 4, j)
            scale[sb * 16 + 2 * j] = scale[sb * 16 + 2 * j + 1] = d * np.float32(sc)
            offset[sb * 16 + 2 * j] = offset[sb * 16 + 2 * j + 1] = -(dmin * np.float32(m))
        for c in range(4):
            for s in range(2):
                for i in range(2 * lanes):
                    q = (r[base + qs_at + c * 32 + i] >> np.uint8(4 * s)) & np.uint8(15)
                    if five:
                        q |= ((r[base + 16 + i] >> np.uint8(2 * c + s)) & np.uint8(1)) << np.uint8(4)
                    codes[out + c * 64 + s * 32 + i] = np.int8(q)


@njit(cache=True, nogil=True)
def _q6_k(r, codes, scale, offset, lanes):  # pragma: no cover - jitted
    for sb in range(codes.shape[0] // 256):
        base, out = sb * 210, sb * 256
        d = f16(r, base + 208)
        for g in range(16):
            sc = np.int32(r[base + 192 + g])
            scale[sb * 16 + g] = d * np.float32(sc - ((sc >> 7) << 8))
            offset[sb * 16 + g] = 0.0
        for h in range(2):
            for s in range(4):  # quarter s of this half: ql bytes (s & 1) * 32 on, nibble s >> 1
                for i in range(2 * lanes):
                    low = (r[base + h * 64 + (s & 1) * 32 + i] >> np.uint8(4 * (s >> 1))) & np.uint8(15)
                    high = (r[base + 128 + h * 32 + i] >> np.uint8(2 * s)) & np.uint8(3)
                    codes[out + h * 128 + s * 32 + i] = np.int8(low | (high << np.uint8(4))) - np.int8(32)


@njit(cache=True, nogil=True)
def unpack_row(qtype, r, codes, scale, offset, lanes):  # pragma: no cover - jitted
    """Row r (its blocks' bytes) of a block type -> codes (K,) int8, scale/offset (K/16,) float32."""
    if qtype == Q4_0:
        _legacy(r, codes, scale, offset, 18, 0, 0, 8, lanes)
    elif qtype == Q4_1:
        _legacy(r, codes, scale, offset, 20, 1, 0, 0, lanes)
    elif qtype == Q5_0:
        _legacy(r, codes, scale, offset, 22, 0, 1, 16, lanes)
    elif qtype == Q5_1:
        _legacy(r, codes, scale, offset, 24, 1, 1, 0, lanes)
    elif qtype == Q8_0:
        _q8_0(r, codes, scale, offset, lanes)
    elif qtype == Q2_K:
        _q2_k(r, codes, scale, offset, lanes)
    elif qtype == Q3_K:
        _q3_k(r, codes, scale, offset, lanes)
    elif qtype == Q4_K:
        _q45_k(r, codes, scale, offset, 144, False, lanes)
    elif qtype == Q5_K:
        _q45_k(r, codes, scale, offset, 176, True, lanes)
    elif qtype == Q6_K:
        _q6_k(r, codes, scale, offset, lanes)
