"""LLVM IR for llama.cpp's integer decode product on AVX2 (candidate d): `vpmaddubsw` + `vpmaddwd`.

The input rows are quantized to int8 per 32 values (Q8_0's rule, kernels.quantize_rows_q8). For
each chunk of 32 weights and each input row, the weight codes (unsigned: Q4_0 and Q6_K keep their
bias, Q8_0's signed codes go through `vpsignb`) multiply the row's int8 codes in pairs to int16
(`vpmaddubsw`, no saturation: |pair| <= 2 * 128 * 127), then to eight int32 sums of four
(`vpmaddwd` by ones), one per four weights, so each half holds one 16-group. Per row:

    y = sum_chunks  d_x * (scale_16 . sums)  +  sum_16-groups  offset_16 * (d_x * sum(q_x))

with the scale and offset of vector_ir.unit_codes (offset = bias * scale for the biased types).
x86 only; HAS_AVX2 says whether this CPU can run it."""

from __future__ import annotations

import platform

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils

from .vector_ir import (CONTRACT, I32, I64, SIGNED_CODES, UNITS, UNSIGNED_BIAS, V2F, V8F, V32I8, close_unit_loop,
                        load_pair, open_unit_loop, reduce_sum, spread, unit_codes)

V16I16, V8I32 = ir.VectorType(ir.IntType(16), 16), ir.VectorType(I32, 8)
HAS_AVX2 = platform.machine().lower() in ("x86_64", "amd64") and bool(llvm.get_host_cpu_features().get("avx2"))


def _x86(builder, name, ret, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _int_dot(builder, codes, q, signed):
    """Eight int32 sums of four code * q products (lanes 0-3: weights 0-15, 4-7: 16-31) as float."""
    if signed:  # vpmaddubsw wants unsigned codes: |w| times q with w's sign
        q = _x86(builder, "llvm.x86.avx2.psign.b", V32I8, q, codes)
        codes = _x86(builder, "llvm.x86.avx2.psign.b", V32I8, codes, codes)
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", V16I16, codes, q)
    ones = ir.Constant(V16I16, [1] * 16)
    return builder.sitofp(_x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs, ones), V8F)


def _splat8(builder, value):
    one = builder.insert_element(ir.Constant(ir.VectorType(value.type, 1), None), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(I32, 8), [0] * 8))


def emit_row_dots(builder, qtype, rows, row, xq, xd, xs, units):
    """The loop over `units` of one weight row against `rows` quantized input rows: their sums.

    xq: i8* codes, xd: float* scale per 32, xs: float* d_x * sum(q) per 16, one of each per row."""
    return emit_dots(builder, qtype, [row], xq, xd, xs, units)


def emit_dots(builder, qtype, wrows, xq, xd, xs, units):
    """Every weight row of `wrows` (i8*) against every input row: sums in (weight row, input row)
    order. Each pair's accumulator sees the same operations in the same order whatever the
    tile, so a sum never depends on which tile computed it."""
    weights, _, has_offset = UNITS[qtype]
    bias = UNSIGNED_BIAS.get(qtype)
    pairs = [(i, r) for i in range(len(wrows)) for r in range(len(xq))]
    opened = open_unit_loop(builder, "q8")
    u = opened[3]
    accs = [builder.phi(V8F) for _ in pairs]
    # offset sums of up to 4 pairs side by side in one vector: lane for lane the same FMAs, fewer of them
    groups = [pairs[k : k + 4] for k in range(0, len(pairs), 4)]
    offs = [builder.phi(_off_type(len(g))) for g in groups] if has_offset or bias else []
    new_acc, new_off = list(accs), list(offs)
    _prefetch(builder, wrows, u, UNITS[qtype][1])
    units_of = [unit_codes(builder, qtype, w, u, unsigned=True) for w in wrows]
    for c in range(len(units_of[0])):
        j = units_of[0][c][0]
        chunk = builder.add(builder.mul(u, ir.Constant(I64, weights // 32)), ir.Constant(I64, j))
        first = builder.mul(chunk, ir.Constant(I64, 32))
        qs = [builder.load(builder.bitcast(builder.gep(q, [first]), V32I8.as_pointer()), align=1) for q in xq]
        dxs = [_splat8(builder, builder.load(builder.gep(d, [chunk]), align=4)) for d in xd]
        xsums = [load_pair(builder, s, chunk) for s in xs] if offs else []
        ovs = [units_of[i][c][3] if not bias else builder.fmul(units_of[i][c][2], ir.Constant(V2F, [bias, bias]))
               for i in range(len(wrows))]
        for p, (i, r) in enumerate(pairs):
            _, codes, sv, _ = units_of[i][c]
            sums = _int_dot(builder, codes, qs[r], signed=qtype in SIGNED_CODES)
            scaled = builder.fmul(builder.fmul(sums, dxs[r]), spread(builder, sv, 8), flags=CONTRACT)
            new_acc[p] = builder.fadd(scaled, new_acc[p], flags=CONTRACT)
        for g, group in enumerate(groups if offs else ()):
            ov, xv = (_concat(builder, [parts[k] for k in keys]) for parts, keys in
                      ((ovs, [i for i, _ in group]), (xsums, [r for _, r in group])))
            new_off[g] = builder.fadd(builder.fmul(ov, xv, flags=CONTRACT), new_off[g], flags=CONTRACT)
    close_unit_loop(builder, opened, units, list(zip(accs, new_acc)) + list(zip(offs, new_off)))
    sums = [reduce_sum(builder, v) for v in new_acc]
    if offs:
        lanes = [(new_off[g], k) for g, group in enumerate(groups) for k in range(len(group))]
        sums = [builder.fadd(s, builder.fadd(*(builder.extract_element(o, ir.Constant(I32, 2 * k + h)) for h in (0, 1))))
                for s, (o, k) in zip(sums, lanes)]
    return sums


PREFETCH_BYTES = 2048  # how far ahead of the block being read (1,024 and 4,096 measured no better, Zen 3 and Zen 5)


def _prefetch(builder, wrows, u, size, ahead=None):
    """Ask for the bytes PREFETCH_BYTES ahead of each weight row's unit u (the rows lie one after
    another, so past a row's end this is the next rows'): out-of-order execution alone keeps too few
    lines in flight to stream the blocks from DRAM. Q8_0 on a Zen 3: one thread 5.4 ns a block from
    DRAM, 3.1 from L2, 2.8 with the prefetch; every type on a Zen 5 (AVX-512): the default model's
    step at one row 8.3 -> 6.0-6.3 ms, its Q4_1 gate/up products 2.4-2.6 -> 1.45 ms (docs/CPU_DECODE.md)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32]),
                                        "llvm.prefetch.p0i8")
    ahead = builder.add(builder.mul(u, ir.Constant(I64, size)), ir.Constant(I64, PREFETCH_BYTES if ahead is None else ahead))
    for w in wrows:
        builder.call(fn, [builder.gep(w, [ahead]), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _off_type(pairs):
    """<2 x float> per pair, in a vector of 2, 4 or 8 lanes."""
    return ir.VectorType(ir.FloatType(), 2 if pairs == 1 else 4 if pairs == 2 else 8)


def _concat(builder, parts):
    """<2 x float> parts side by side in one _off_type(len(parts)) vector (zeros after the last)."""
    if len(parts) == 1:
        return parts[0]
    if all(p is parts[0] for p in parts):  # one weight row: its pair repeated
        lanes = _off_type(len(parts)).count
        return builder.shuffle_vector(parts[0], parts[0], ir.Constant(ir.VectorType(I32, lanes), [0, 1] * (lanes // 2)))
    parts = parts + [ir.Constant(V2F, None)] * (_off_type(len(parts)).count // 2 - len(parts))
    while len(parts) > 1:
        width = 2 * parts[0].type.count
        mask = ir.Constant(ir.VectorType(I32, width), list(range(width)))
        parts = [builder.shuffle_vector(a, b, mask) for a, b in zip(parts[::2], parts[1::2])]
    return parts[0]
