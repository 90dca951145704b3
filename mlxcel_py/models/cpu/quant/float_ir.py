"""Vector IR for F16 and BF16 matrices: 32 weights per loop unit, converted to float32 in registers
(`fpext` of <32 x half>: vcvtph2ps where the CPU has F16C; BF16 as its 16 high bits), exactly.

They have no codes to take integer dot products with, so only candidate c (float FMA, vector_ir) and
the exact dequantization read them: `unit_codes` hands vector_ir the float weights themselves (scale
None). Importing this module registers them with vector_ir; FLOAT_UNITS tells products to keep them
off candidate d."""

from __future__ import annotations

from llvmlite import ir

from . import vector_ir
from .vector_ir import I32, V32F, _load

F16, BF16 = 1, 30
FLOAT_UNITS = (F16, BF16)
V32I16, V32I32 = ir.VectorType(ir.IntType(16), 32), ir.VectorType(I32, 32)


def _f16(builder, row, base, unsigned):
    bits = _load(builder, row, base, V32I16)
    return [(0, builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 32)), V32F), None, None)]


def _bf16(builder, row, base, unsigned):
    wide = builder.shl(builder.zext(_load(builder, row, base, V32I16), V32I32), ir.Constant(V32I32, [16] * 32))
    return [(0, builder.bitcast(wide, V32F), None, None)]


vector_ir.UNITS.update({F16: (32, 64, False), BF16: (32, 64, False)})
vector_ir.MORE_CODES.update({F16: _f16, BF16: _bf16})
