"""LLVM IR for Q5_0 and Q8_0 weights repacked eight rows at a time (kquant_r8's layouts for 32-value
blocks), against input rows quantized per 32 values (kernels.quantize_rows_q8: int8 codes, a scale per
32, int32 code sums per 16), as r8_ir's K-quant groups: a vector lane is a weight row, one 32-byte
register holds four codes of each of eight rows, the input's four codes broadcast against it.

A group's block is 32 values of eight rows: d[8] (float16), then
- Q8_0 (272 bytes, the rows' own): eight code registers, register m holding codes 4m .. 4m + 3 of each
  row (int8). With AVX512-VNNI the unsigned operand is w + 128 (one xor a register) and the bias of 128
  is taken off in integers against the input's code sums, as Q5_0's 16 (`vpdpbusd` does not saturate);
  without, the signs move to the input (`vpsignb`) so that |w| is the unsigned operand: a pair sum is
  at most 2 * 128 * 127 = 32,512, inside `vpmaddubsw`'s int16.
- Q5_0 (176 bytes, the rows' own): four nibble registers, register p holding the file's bytes 4p .. 4p + 3
  of each row (codes 4p.. in the low nibbles, 16 + 4p.. in the high ones), then one register whose byte
  (row r, i) has at bit m the fifth bit of code 4m + i. Codes are 0..31 with a bias of 16, taken off in
  integers against the input's code sums (`sumi - 16 * sum(x)`).
A block's int32 sums are exact (below 2^20); the float work once a block, for eight rows:
acc = fma(float(sumi), d * d_x, acc), the same operations in every lane, so a row's sum is the same bits
in whichever group, call or thread it is computed."""

from __future__ import annotations

from llvmlite import ir

from .int8_ir import V8I32, V16I16, _prefetch, _x86
from .kblock_ir import VNNI, _fma, _total
from .r8_ir import PREFETCH_GROUPS, _broadcast32, _halves
from .vector_ir import I32, I64, V8F, V32I8, _load, _splat, _splat_f, close_unit_loop, open_unit_loop

Q5_0, Q8_0 = 6, 8
GROUP_BYTES = {Q5_0: 176, Q8_0: 272}
CODES = 16  # both layouts' codes after d[8]
Q5_HIGH = CODES + 128  # Q5_0's fifth-bit register


def _codes(builder, qtype, group, base):
    """The eight code registers of a group's block, register m holding codes 4m.. of every row: Q8_0's
    as w + 128 with AVX512-VNNI (bias 128 not taken: vpdpbusd does not saturate), else as |w| with w (for
    the input's signs: vpmaddubsw's int16 pairs would saturate on w + 128); Q5_0's codes 0..31 (bias 16
    not taken)."""
    if qtype == Q8_0:
        out = []
        for m in range(8):
            w = _load(builder, group, builder.add(base, ir.Constant(I64, CODES + 32 * m)), V32I8)
            if VNNI:
                out.append((builder.xor(w, _splat(V32I8, 128)), None))  # w + 128 as an unsigned byte
            else:
                out.append((_x86(builder, "llvm.x86.avx2.psign.b", V32I8, w, w), w))  # |w|, -128 as 128
        return out
    high = _load(builder, group, builder.add(base, ir.Constant(I64, Q5_HIGH)), V32I8)
    lows = [_load(builder, group, builder.add(base, ir.Constant(I64, CODES + 32 * p)), V32I8) for p in range(4)]
    out = []
    for m in range(8):
        nibble = builder.and_(lows[m], _splat(V32I8, 15)) if m < 4 else builder.lshr(lows[m - 4], _splat(V32I8, 4))
        top = builder.shl(builder.and_(builder.lshr(high, _splat(V32I8, m)), _splat(V32I8, 1)), _splat(V32I8, 4))
        out.append((builder.or_(nibble, top), None))
    return out


def _dot4(builder, chain, codes, x):
    """chain + each lane's four codes . x's four (u8 x s8, summed into the lane's int32)."""
    if VNNI:
        zero = ir.Constant(V8I32, None) if chain is None else chain
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", V8I32, zero, builder.bitcast(codes, V8I32),
                    builder.bitcast(x, V8I32))
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", V16I16, codes, x)
    quads = _x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs, _splat(V16I16, 1))
    return quads if chain is None else builder.add(chain, quads)


def emit_group_dots32(builder, qtype, group, xq, xd, xs, units):
    """A group of eight weight rows (i8*, `units` blocks of GROUP_BYTES[qtype]) against each input row
    (xq: i8* codes, xd: float* scale per 32, xs: i32* code sums per 16): one <8 x float> per input row,
    lane r the sum of weight row r."""
    n_in, size = len(xq), GROUP_BYTES[qtype]
    opened = open_unit_loop(builder, "r8s")
    u = opened[3]
    accs = [builder.phi(V8F) for _ in xq]
    base = builder.mul(u, ir.Constant(I64, size))
    for line in range(0, size if n_in > 1 else 0, 64):
        _prefetch(builder, [group], u, size, PREFETCH_GROUPS * size + line)
    d = _halves(builder, group, base, 0)
    codes = _codes(builder, qtype, group, base)
    first = builder.mul(u, ir.Constant(I64, 32))
    new_accs = []
    for r in range(n_in):
        sums = [None, None]
        for m, (register, signs) in enumerate(codes):
            x = _broadcast32(builder, xq[r], builder.add(first, ir.Constant(I64, 4 * m)))
            if signs is not None:
                x = _x86(builder, "llvm.x86.avx2.psign.b", V32I8, x, signs)
            sums[m % 2] = _dot4(builder, sums[m % 2], register, x)
        total = _total(builder, sums)
        if qtype == Q5_0 or VNNI:  # the codes' bias (Q5_0's 16, Q8_0's 128 with VNNI), in integers
            pair = builder.gep(xs[r], [builder.mul(u, ir.Constant(I64, 2))])
            halves = [builder.load(builder.gep(pair, [ir.Constant(I64, k)])) for k in (0, 1)]
            # int32 sums (quantize_rows_q8's); r8_rows compiles this branch for kblock's int16 ones too
            halves = [h if h.type == I32 else builder.sext(h, I32) for h in halves]
            both = builder.add(*halves)
            bias = builder.shl(both, ir.Constant(I32, 4 if qtype == Q5_0 else 7))
            total = builder.sub(total, builder.bitcast(_splat_i32(builder, bias), V8I32))
        dx = _splat_f(builder, builder.load(builder.gep(xd[r], [u]), align=4), 8)
        new_accs.append(_fma(builder, builder.sitofp(total, V8F), builder.fmul(d, dx), accs[r]))
    close_unit_loop(builder, opened, units, list(zip(accs, new_accs)))
    return new_accs


def _splat_i32(builder, value):
    one = builder.insert_element(ir.Constant(ir.VectorType(I32, 1), None), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(V8I32, [0] * 8))


__all__ = ["GROUP_BYTES", "Q5_0", "Q8_0", "emit_group_dots32"]
