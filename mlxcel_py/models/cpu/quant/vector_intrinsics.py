"""The intrinsics of the explicit-vector decode products (vector.py): one numba call's LLVM IR per
block type, built from vector_ir / int8_ir's emitters. c: a weight row against up to MAX_ROWS
float input rows; d: against int8-quantized rows (one weight row, or two at one input row);
dequant: a weight row to float32. vector.py dispatches on the type and drives the threads."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import int8_ir, vector_ir


def _rows_switch(context, builder, count, emit, most=vector_ir.MAX_ROWS):
    """A switch over count = 1..most input rows, `emit(rows)` generating each case (span.py's tiles too)."""
    end = builder.append_basic_block("rows_end")
    switch = builder.switch(count, end)
    for rows in range(1, most + 1):
        block = builder.append_basic_block(f"rows{rows}")
        switch.add_case(ir.Constant(count.type, rows), block)
        builder.position_at_end(block)
        emit(rows)
        builder.branch(end)
    builder.position_at_end(end)
    return context.get_dummy_value()


def _emit_rows(context, builder, qtype, quantized, w, xs_a, out_a, b, count, n, units, most=vector_ir.MAX_ROWS,
               dots=None):
    """Weight row `w` (i8*) against input rows b..b+count (1..most) of the arrays xs_a, sums stored in
    out_a[:, n]: the body of c's and d's calls here, of span.py's tiles and (`dots`: an emitter of
    (weight rows, input rows) sums such as kblock_ir.emit_kdots) of kblock.py's calls."""
    widths = [cgutils.unpack_tuple(builder, a.shape, 2)[1] for a in (*xs_a, out_a)]
    if dots is None:
        row_dots = (int8_ir if quantized else vector_ir).emit_row_dots
    else:
        row_dots = lambda builder, qtype, rows, w, *rest: dots(builder, qtype, [w], *rest)  # noqa: E731

    def emit(rows):
        firsts = [builder.add(b, ir.Constant(b.type, r)) for r in range(rows)]
        ptrs = [[builder.gep(a.data, [builder.mul(f, k)]) for f in firsts] for a, k in zip(xs_a, widths)]
        for f, value in zip(firsts, row_dots(builder, qtype, rows, w, *ptrs, units)):
            builder.store(value, builder.gep(out_a.data, [builder.add(builder.mul(f, widths[-1]), n)]))

    return _rows_switch(context, builder, count, emit, most)


def _codegen(qtype, quantized, dots=None):
    """The IR of one call: weight row `row` against input rows b..b+count, sums stored in out[:, n]."""
    n_x = 3 if quantized else 1

    def codegen(context, builder, signature, args):
        arrays = [context.make_array(t)(context, builder, v) if isinstance(t, types.Array) else None
                  for t, v in zip(signature.args, args)]
        w, xs_a, out_a = arrays[0].data, arrays[1 : 1 + n_x], arrays[n_x + 3]
        b, count, n, units = args[n_x + 1], args[n_x + 2], args[n_x + 4], args[n_x + 5]
        return _emit_rows(context, builder, qtype, quantized, w, xs_a, out_a, b, count, n, units, dots=dots)

    return codegen


def _contiguous(*arrays) -> bool:
    return all(a.layout == "C" for a in arrays)  # the IR indexes rows as contiguous runs


def _float_intrinsic(qtype):
    """c: `dot(row, x, b, count, out, n, units)`: out[b:b+count, n] = x[b:b+count] . W row."""

    @intrinsic
    def dot(typingctx, row, x, b, count, out, n, units):
        if _contiguous(row, x, out):
            return types.void(row, x, b, count, out, n, units), _codegen(qtype, False)

    return dot


def _int8_intrinsic(qtype, dots=None):
    """d: `dot(row, xq, xd, xs, b, count, out, n, units)` on quantize_x's arrays (`dots`: another
    emitter of the sums over other int8 inputs, as kblock's)."""

    @intrinsic
    def dot(typingctx, row, xq, xd, xs, b, count, out, n, units):
        if _contiguous(row, xq, xd, xs, out):
            return types.void(row, xq, xd, xs, b, count, out, n, units), _codegen(qtype, True, dots)

    return dot


def _int8_pair_intrinsic(qtype, dots=int8_ir.emit_dots):
    """d at one input row, two weight rows a call: `dot2(raw, n, xq, xd, xs, b, out, col, units)`:
    out[b, col + k] = x[b] . raw[n + k] for k = 0, 1. The two FMA chains interleave (Q4_0/Q4_1/Q5_0/Q5_1
    14-20% faster, Q8_0 9%, Q4_K/Q3_K/Q5_K 7-12%; Q2_K equal; not Q6_K, which spills);
    each sum is the one-row call's, bit for bit (int8_ir.emit_dots)."""

    @intrinsic
    def dot2(typingctx, raw, n, xq, xd, xs, b, out, col, units):
        if not _contiguous(raw, xq, xd, xs, out):
            return None

        def codegen(context, builder, signature, args):
            raw_a, xq_a, xd_a, xs_a, out_a = (context.make_array(signature.args[i])(context, builder, args[i])
                                              for i in (0, 2, 3, 4, 6))
            n, b, col = args[1], args[5], args[7]
            width = lambda a: cgutils.unpack_tuple(builder, a.shape, 2)[1]  # noqa: E731
            rows = [builder.gep(raw_a.data, [builder.mul(builder.add(n, ir.Constant(n.type, k)), width(raw_a))]) for k in (0, 1)]
            xs = [[builder.gep(a.data, [builder.mul(b, width(a))])] for a in (xq_a, xd_a, xs_a)]
            for k, value in enumerate(dots(builder, qtype, rows, *xs, args[8])):
                at = builder.add(builder.mul(b, width(out_a)), builder.add(col, ir.Constant(col.type, k)))
                builder.store(value, builder.gep(out_a.data, [at]))
            return context.get_dummy_value()

        return types.void(raw, n, xq, xd, xs, b, out, col, units), codegen

    return dot2


def _dequant_intrinsic(qtype):
    """`dequant(row, out, units)`: the weight row's blocks -> out (K,) float32, bit-equal to gguf."""

    @intrinsic
    def dequant(typingctx, row, out, units):
        if not _contiguous(row, out):
            return None

        def codegen(context, builder, signature, args):
            row_a, out_a = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:2], args[:2]))
            vector_ir.emit_dequant_row(builder, qtype, row_a.data, out_a.data, args[2])
            return context.get_dummy_value()

        return types.void(row, out, units), codegen

    return dequant
