"""The activations' int8 quantize (kernels.quantize_groups) in explicit vectors, 16 values a call.

numba left the scalar rule unvectorized (its rounding branch and the max|x| reduction, which must
not be fastmath: a numpy reference computes the same codes), 2 ns a value: the decode step's SwiGLU
phase of a 1.5B (8,960 values, quantized per 32 and per 256) was 37 us of one thread a layer. Here
the same operations run on <16 x float>: |x| by clearing the sign bit, a max by compare and select
(exact, order-free), v = x * inv (one rounding, no contraction), round half away from zero as
trunc(|v| + 0.5) with v's sign, so every code, scale and sum is the scalar rule's, bit for bit
(tests/test_quant_kblock.py checks them against numpy, per 32 and per 256)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .vector_ir import F32, I32, _splat

I8 = ir.IntType(8)
V16F, V16I, V16I8 = ir.VectorType(F32, 16), ir.VectorType(I32, 16), ir.VectorType(I8, 16)


def _row_ptr(context, builder, array_type, array, b, start):
    """An i8* to element (b, start) of a 2-D C-contiguous array."""
    a = context.make_array(array_type)(context, builder, array)
    stride = builder.extract_value(a.strides, 0)
    size = ir.Constant(b.type, context.get_abi_sizeof(context.get_data_type(array_type.dtype)))
    data = builder.bitcast(a.data, I8.as_pointer())
    return builder.gep(data, [builder.add(builder.mul(b, stride), builder.mul(start, size))])


def _abs(builder, v):
    bits = builder.and_(builder.bitcast(v, V16I), _splat(V16I, 0x7FFFFFFF))
    return builder.bitcast(bits, V16F)


def _halves(builder, v, combine):
    """Reduce a vector by halving with `combine(lo, hi)`, a fixed order."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        v = combine(lo, hi)
    return builder.extract_element(v, ir.Constant(I32, 0))


def _load16(builder, ptr):
    return builder.load(builder.bitcast(ptr, V16F.as_pointer()), align=4)


def _ok(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" for a in arrays)


@intrinsic
def absmax16(typingctx, x, b, start):
    """max |x[b, start:start + 16]| (float32 x, C-contiguous)."""
    if not _ok(x) or x.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        v = _abs(builder, _load16(builder, _row_ptr(context, builder, signature.args[0], args[0], args[1], args[2])))
        return _halves(builder, v, lambda lo, hi: builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo))

    return types.float32(x, b, start), codegen


@intrinsic
def codes16(typingctx, x, b, start, inv, xq):
    """xq[b, start:start + 16] = round half away from zero of x[b, start:start + 16] * inv (int8);
    returns their sum (int32)."""
    if not _ok(x, xq) or x.dtype != types.float32 or xq.dtype != types.int8 or inv != types.float32:
        return None

    def codegen(context, builder, signature, args):
        x_t, _, _, _, xq_t = signature.args
        x_a, b, start, inv, xq_a = args
        v = builder.fmul(_load16(builder, _row_ptr(context, builder, x_t, x_a, b, start)),
                         builder.shuffle_vector(builder.insert_element(ir.Constant(ir.VectorType(F32, 1), None), inv,
                                                                       ir.Constant(I32, 0)),
                                                ir.Constant(ir.VectorType(F32, 1), None),
                                                ir.Constant(ir.VectorType(I32, 16), [0] * 16)))
        r = builder.fptosi(builder.fadd(_abs(builder, v), _splat(V16F, 0.5)), V16I)
        q = builder.select(builder.fcmp_ordered(">=", v, _splat(V16F, 0.0)), r, builder.neg(r))
        out = builder.bitcast(_row_ptr(context, builder, xq_t, xq_a, b, start), V16I8.as_pointer())
        builder.store(builder.trunc(q, V16I8), out, align=1)
        return _halves(builder, q, builder.add)

    return types.int32(x, b, start, inv, xq), codegen
