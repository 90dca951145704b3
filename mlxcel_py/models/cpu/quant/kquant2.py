"""Vector IR unpacking for the other GGUF block types: Q5_0, Q5_1, Q2_K, Q3_K, Q5_K.

Each function returns what vector_ir.unit_codes returns for one loop unit (a block of 32, or a
K-quant super-block of 256): [(chunk within the unit, <32 x i8> codes, scale and offset pairs per
16-group)], with the same float32 operations as gguf.quants (d * code, d * code - m), so the
dequantization stays bit-equal. Importing this module registers the types with vector_ir (UNITS,
UNSIGNED_BIAS, MORE_CODES): both candidates (c: vector_ir, d: int8_ir) then read them.
Layouts: ggml-quants.c (block_q5_0 .. block_q5_K)."""

from __future__ import annotations

from llvmlite import ir

from . import vector_ir
from .vector_ir import I8, I32, I64, V16F, V16I8, V32I8, _f16, _f16_scalar, _k4_scales, _lanes, _load, _nibbles, _splat, _splat_f

Q5_0, Q5_1, Q2_K, Q3_K, Q5_K = 6, 7, 10, 11, 13


def _vec(values):
    return ir.Constant(ir.VectorType(I8, len(values)), values)


def _bit4s(builder, row, at):
    """Bit i of the little-endian u32 at byte `at` as 16 (set) or 0 in lane i: bit 4 of Q5 code i.
    A mask and a compare, as AVX2 has no per-byte variable shift."""
    four = _load(builder, row, at, ir.VectorType(I8, 4))
    wide = builder.shuffle_vector(four, four, ir.Constant(ir.VectorType(I32, 32), [i // 8 for i in range(32)]))
    masks = _vec([(1 << (i % 8)) - (256 if i % 8 == 7 else 0) for i in range(32)])
    is_set = builder.icmp_unsigned("!=", builder.and_(wide, masks), _splat(V32I8, 0))
    return builder.select(is_set, _splat(V32I8, 16), _splat(V32I8, 0))


def _q5_legacy(builder, row, base, has_min, unsigned):
    """Q5_0: d, qh u32, qs[16] (code - 16); Q5_1: d, m, qh, qs[16] (d * code + m)."""
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731 - byte n of this block
    qh = 2 + 2 * has_min
    low = _nibbles(builder, _load(builder, row, at(qh + 4), V16I8))
    codes = builder.or_(low, _bit4s(builder, row, at(qh)))
    if has_min:
        return [(0, codes, _f16(builder, row, base), _f16(builder, row, at(2)))]
    return [(0, codes if unsigned else builder.sub(codes, _splat(V32I8, 16)), _f16(builder, row, base), None)]


def _q5_k(builder, row, base, unsigned):
    """Q5_K: d, dmin, 12 scale bytes (Q4_K's), qh[32] (bit j: sub-block j), qs[128]."""
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731
    scales, offsets = _k4_scales(builder, row, base)
    qh = _load(builder, row, at(16), V32I8)
    out = []
    for p in range(4):
        v = _load(builder, row, at(48 + 32 * p), V32I8)
        for j, low in ((2 * p, builder.and_(v, _splat(V32I8, 15))), (2 * p + 1, builder.lshr(v, _splat(V32I8, 4)))):
            high = builder.shl(builder.and_(builder.lshr(qh, _splat(V32I8, j)), _splat(V32I8, 1)), _splat(V32I8, 4))
            out.append((j, builder.or_(low, high), _lanes(builder, scales, [j, j]), _lanes(builder, offsets, [j, j])))
    return out


def _q2_k(builder, row, base, unsigned):
    """Q2_K: scales[16] (low nibble: scale, high: min), qs[64], d, dmin; d * sc * q - dmin * m."""
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731
    sc = _load(builder, row, base, V16I8)
    d, dmin = _f16_scalar(builder, row, at(80)), _f16_scalar(builder, row, at(82))
    scales = builder.fmul(_splat_f(builder, d, 16), builder.uitofp(builder.and_(sc, _splat(V16I8, 15)), V16F))
    mins = builder.fmul(_splat_f(builder, dmin, 16), builder.uitofp(builder.lshr(sc, _splat(V16I8, 4)), V16F))
    offsets = builder.fneg(mins)
    out = []
    for h in range(2):
        q = _load(builder, row, at(16 + 32 * h), V32I8)
        for s in range(4):
            j = 4 * h + s
            codes = builder.and_(builder.lshr(q, _splat(V32I8, 2 * s)), _splat(V32I8, 3))
            out.append((j, codes, _lanes(builder, scales, [2 * j, 2 * j + 1]), _lanes(builder, offsets, [2 * j, 2 * j + 1])))
    return out


def _q3_k_scales(builder, row, base, d):
    """Q3_K's 16 scales d * (sc - 32): 4 low bits from bytes 96-103, 2 high from 104-107."""
    v = _load(builder, row, builder.add(base, ir.Constant(I64, 94)), V16I8)  # bytes 94-109: no read past the block
    low = builder.and_(builder.lshr(_lanes(builder, v, [2 + g % 8 for g in range(16)]), _vec([0] * 8 + [4] * 8)),
                       _splat(V16I8, 15))
    high = builder.and_(builder.lshr(_lanes(builder, v, [10 + g % 4 for g in range(16)]), _vec([2 * (g // 4) for g in range(16)])),
                        _splat(V16I8, 3))
    sc = builder.sub(builder.or_(low, builder.shl(high, _splat(V16I8, 4))), _splat(V16I8, 32))
    return builder.fmul(_splat_f(builder, d, 16), builder.sitofp(sc, V16F))


def _q3_k(builder, row, base, unsigned):
    """Q3_K: hmask[32] (bit j: chunk j's bit 2), qs[64], 12 scale bytes, d; code (q | h << 2) - 4."""
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731
    scales = _q3_k_scales(builder, row, base, _f16_scalar(builder, row, at(108)))
    hmask = _load(builder, row, base, V32I8)
    out = []
    for h in range(2):
        q = _load(builder, row, at(32 + 32 * h), V32I8)
        for s in range(4):
            j = 4 * h + s
            low = builder.and_(builder.lshr(q, _splat(V32I8, 2 * s)), _splat(V32I8, 3))
            bit = builder.and_(builder.lshr(hmask, _splat(V32I8, j)), _splat(V32I8, 1))
            codes = builder.or_(low, builder.shl(bit, _splat(V32I8, 2)))
            out.append((j, codes if unsigned else builder.sub(codes, _splat(V32I8, 4)),
                        _lanes(builder, scales, [2 * j, 2 * j + 1]), None))
    return out


vector_ir.UNITS.update({Q5_0: (32, 22, False), Q5_1: (32, 24, True), Q2_K: (256, 84, True),
                        Q3_K: (256, 110, False), Q5_K: (256, 176, True)})
vector_ir.UNSIGNED_BIAS.update({Q5_0: -16.0, Q3_K: -4.0})
vector_ir.MORE_CODES.update({
    Q5_0: lambda b, row, base, unsigned: _q5_legacy(b, row, base, 0, unsigned),
    Q5_1: lambda b, row, base, unsigned: _q5_legacy(b, row, base, 1, unsigned),
    Q2_K: _q2_k, Q3_K: _q3_k, Q5_K: _q5_k})
