"""Vector IR for A8, the block type of mlx-lm's 8-bit affine groups (quant/affine.py repacks them).

An A8 block is 32 weights: d, m (float16) and 32 uint8 codes q, w = d * q + m (36 bytes). The
IR reads the codes as the int8 q - 128 (a xor of the top bit) with offset m + 128 d, so both
candidates take them as Q8_0's signed codes (int8_ir's vpsignb path) plus an offset term. m + 128 d
is one float32 rounding: the weights are d * q + m to within an ulp, not bit for bit. Importing
this module registers A8 with vector_ir, as kquant2 does its types."""

from __future__ import annotations

from llvmlite import ir

from . import vector_ir
from .vector_ir import F32, I64, V32I8, _f16_scalar, _load, _splat, _splat_f

A8 = 200  # no ggml type: an id clear of theirs (ggml's end below 64)


def _a8(builder, row, base, unsigned):
    at = builder.add(base, ir.Constant(I64, 2))
    codes = builder.xor(_load(builder, row, builder.add(base, ir.Constant(I64, 4)), V32I8), _splat(V32I8, -128))
    d, m = _f16_scalar(builder, row, base), _f16_scalar(builder, row, at)
    offset = builder.fadd(m, builder.fmul(d, ir.Constant(F32, 128.0)))
    return [(0, codes, _splat_f(builder, d, 2), _splat_f(builder, offset, 2))]


vector_ir.UNITS[A8] = (32, 36, True)
vector_ir.SIGNED_CODES.add(A8)
vector_ir.MORE_CODES[A8] = _a8
