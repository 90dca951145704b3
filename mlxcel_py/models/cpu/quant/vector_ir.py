"""LLVM vector IR for the quantized decode products (numba `intrinsic`, llvmlite builder).

numba's loop vectorizer leaves the 16/32-wide block loops of the GGUF types scalar (no SLP
vectorizer; uint8 widened to int64; docs/QUANT_KERNELS.md). This module writes them as explicit
LLVM vectors instead: each chunk of 32 weights is one `<32 x i8>` of codes (unpacked from the
file's own block bytes with vector and/shift/or, scales too), converted to `<32 x float>`,
scaled (`w = scale * code + offset` per 16 weights) and multiplied into one `<32 x float>`
accumulator per input row (16 lanes for 3-4 rows, to fit AVX2's registers). LLVM splits the vectors for the target
(4 ymm on AVX2, 2 zmm on AVX-512, 8 q registers on NEON), so nothing here is x86-specific.

Weights stay in the GGUF layout (memory-mapped, not repacked). Accumulators are reduced in a
fixed order, so a product never depends on the thread count."""

from __future__ import annotations

import platform

import llvmlite.binding as llvm
from llvmlite import ir

I8, I32, I64, F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
V16I8, V32I8 = ir.VectorType(I8, 16), ir.VectorType(I8, 32)
V2F, V8F, V16F, V32F = (ir.VectorType(F32, n) for n in (2, 8, 16, 32))
# x86 without F16C would turn a half's fpext into a library call numba's JIT may not link
F16C = platform.machine().lower() not in ("x86_64", "amd64") or bool(llvm.get_host_cpu_features().get("f16c"))
CONTRACT = ("contract",)  # lets LLVM fuse mul+add into FMA where the target has it

# GGUF type id -> (weights per loop unit, bytes per unit, offsets used); K-quants: a super-block
UNITS = {2: (32, 18, False), 3: (32, 20, True), 8: (32, 34, False), 12: (256, 144, True), 14: (256, 210, False)}
MAX_ROWS = 4  # input rows per pass; the caller loops over more
UNSIGNED_BIAS = {2: -8.0, 14: -32.0}  # Q4_0, Q6_K: w = scale * (code + bias)
MORE_CODES: dict = {}  # type id -> unit_codes(builder, row, base, unsigned) of kquant2's, affine_ir's, float_ir's types
SIGNED_CODES = {8}  # types whose codes are signed int8 whatever `unsigned` asks (Q8_0; affine_ir's A8)


def _splat(vtype, value):
    return ir.Constant(vtype, [value] * vtype.count)


def _load(builder, ptr, offset, vtype):
    """An unaligned vector load of `vtype` at byte `offset` (i64) from the i8* `ptr`."""
    at = builder.gep(ptr, [offset])
    return builder.load(builder.bitcast(at, vtype.as_pointer()), align=1)


def _nibbles(builder, v16):
    """16 bytes -> 32 codes: the low nibbles (weights 0-15), then the high ones (16-31)."""
    lo = builder.and_(v16, _splat(V16I8, 15))
    hi = builder.lshr(v16, _splat(V16I8, 4))
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))


def _f16_scalar(builder, row, offset):
    """The float16 at byte `offset` of i8* row as a float (exact for finite values, no branch):
    one vcvtph2ps where the CPU has F16C (7 integer ops fewer a scale), else the bits moved by hand."""
    if F16C:
        at = builder.bitcast(builder.gep(row, [offset]), ir.HalfType().as_pointer())
        return builder.fpext(builder.load(at, align=1), F32)
    at = builder.bitcast(builder.gep(row, [offset]), ir.IntType(16).as_pointer())
    h = builder.zext(builder.load(at, align=1), I32)
    sign = builder.shl(builder.and_(h, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    rest = builder.shl(builder.and_(h, ir.Constant(I32, 0x7FFF)), ir.Constant(I32, 13))
    return builder.fmul(builder.bitcast(builder.or_(sign, rest), F32), ir.Constant(F32, 2.0**112))


def _splat_f(builder, value, lanes):
    one = builder.insert_element(ir.Constant(ir.VectorType(F32, 1), None), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def _f16(builder, row, offset):
    """The float16 at byte `offset` as a <2 x float> pair (the scale of both 16-groups)."""
    return _splat_f(builder, _f16_scalar(builder, row, offset), 2)


def _lanes(builder, v, idx):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(idx)), idx))


def k4_scale_codes(builder, row, base):
    """Q4_K's 8 sub-block scales and mins (<8 x i8>, 6 bits each) from its 12 packed bytes at base + 4,
    as unpack._scale_min_k4 computes them one by one, and its d and dmin as floats."""
    q = _load(builder, row, builder.add(base, ir.Constant(I64, 4)), V16I8)  # 12 bytes used
    v8 = ir.VectorType(I8, 8)
    first = ir.Constant(v8, [1] * 4 + [0] * 4)  # sub-blocks 0-3 hold 6 plain bits
    c = lambda values: ir.Constant(v8, values)  # noqa: E731
    sc_src, m_src = _lanes(builder, q, [0, 1, 2, 3, 8, 9, 10, 11]), _lanes(builder, q, [4, 5, 6, 7, 8, 9, 10, 11])
    top_sc, top_m = _lanes(builder, q, [0, 1, 2, 3, 0, 1, 2, 3]), _lanes(builder, q, [4, 5, 6, 7, 4, 5, 6, 7])
    high = lambda v: builder.shl(builder.lshr(v, c([6] * 8)), c([4] * 8))  # noqa: E731 - bits 6-7 as 4-5
    sc = builder.or_(builder.and_(sc_src, c([63] * 4 + [15] * 4)), builder.mul(high(top_sc), builder.sub(c([1] * 8), first)))
    m_low = builder.select(builder.icmp_unsigned("!=", first, c([0] * 8)), builder.and_(m_src, c([63] * 8)),
                           builder.lshr(m_src, c([4] * 8)))
    m = builder.or_(m_low, builder.mul(high(top_m), builder.sub(c([1] * 8), first)))
    d, dmin = _f16_scalar(builder, row, base), _f16_scalar(builder, row, builder.add(base, ir.Constant(I64, 2)))
    return sc, m, d, dmin


def _k4_scales(builder, row, base):
    """Q4_K's 8 sub-block scales d * sc and offsets -(dmin * m) (<8 x float>)."""
    sc, m, d, dmin = k4_scale_codes(builder, row, base)
    scales = builder.fmul(_splat_f(builder, d, 8), builder.uitofp(sc, V8F))
    offsets = builder.fneg(builder.fmul(_splat_f(builder, dmin, 8), builder.uitofp(m, V8F)))
    return scales, offsets


def unit_codes(builder, qtype, row, u, unsigned=False):
    """The chunks of loop unit u of a row: [(chunk index within the unit, <32 x i8> codes,
    scale and offset per 16-group as <2 x float> pairs, or None)].

    With `unsigned`, Q4_0 and Q6_K codes keep their bias (UNSIGNED_BIAS; 0-15 and 0-63)."""
    _, size, _ = UNITS[qtype]
    base = builder.mul(u, ir.Constant(I64, size))
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731 - byte n of this block
    if qtype in MORE_CODES:
        return MORE_CODES[qtype](builder, row, base, unsigned)
    if qtype == 2:  # Q4_0: d f16, qs[16]; code - 8
        codes = _nibbles(builder, _load(builder, row, at(2), V16I8))
        return [(0, codes if unsigned else builder.sub(codes, _splat(V32I8, 8)), _f16(builder, row, base), None)]
    if qtype == 3:  # Q4_1: d, m f16, qs[16]
        codes = _nibbles(builder, _load(builder, row, at(4), V16I8))
        return [(0, codes, _f16(builder, row, base), _f16(builder, row, at(2)))]
    if qtype == 8:  # Q8_0: d f16, qs int8[32]
        return [(0, _load(builder, row, at(2), V32I8), _f16(builder, row, base), None)]
    if qtype == 12:  # Q4_K: d, dmin, 12 scale bytes, qs[128]; 32 bytes of qs hold sub-blocks 2p, 2p + 1
        scales, offsets = _k4_scales(builder, row, base)
        out = []
        for p in range(4):
            v = _load(builder, row, at(16 + 32 * p), V32I8)
            for j, codes in ((2 * p, builder.and_(v, _splat(V32I8, 15))), (2 * p + 1, builder.lshr(v, _splat(V32I8, 4)))):
                out.append((j, codes, _lanes(builder, scales, [j, j]), _lanes(builder, offsets, [j, j])))
        return out
    if qtype == 14:  # Q6_K: ql[128], qh[64], int8 scales[16], d; halves of 128 weights
        d = _f16_scalar(builder, row, at(208))
        scales = builder.fmul(_splat_f(builder, d, 16), builder.sitofp(_load(builder, row, at(192), V16I8), V16F))
        out = []
        for h in range(2):
            ql0, ql1, high = (_load(builder, row, at(n), V32I8) for n in (64 * h, 64 * h + 32, 128 + 32 * h))
            for s, low in enumerate((builder.and_(ql0, _splat(V32I8, 15)), builder.and_(ql1, _splat(V32I8, 15)),
                                     builder.lshr(ql0, _splat(V32I8, 4)), builder.lshr(ql1, _splat(V32I8, 4)))):
                bits = builder.and_(builder.lshr(high, _splat(V32I8, 2 * s)), _splat(V32I8, 3))
                codes = builder.or_(low, builder.shl(bits, _splat(V32I8, 4)))
                j = 4 * h + s
                out.append((j, codes if unsigned else builder.sub(codes, _splat(V32I8, 32)), _lanes(builder, scales, [2 * j, 2 * j + 1]), None))
        return out
    raise ValueError(f"no vector IR for GGUF type {qtype}")


def load_pair(builder, ptr, chunk):
    """<2 x float>: ptr[2 chunk], ptr[2 chunk + 1] (the two 16-groups of a chunk)."""
    at = builder.gep(ptr, [builder.mul(chunk, ir.Constant(I64, 2))])
    return builder.load(builder.bitcast(at, V2F.as_pointer()), align=4)


def spread(builder, pair, lanes):
    """A <2 x float> pair over `lanes` lanes: the first value in the first half, the second in the rest."""
    mask = [0] * (lanes // 2) + [1] * (lanes // 2)
    return builder.shuffle_vector(pair, pair, ir.Constant(ir.VectorType(I32, lanes), mask))


def _half(builder, v, first):
    """Lanes first..first+15 of a <32 x float>."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 16), list(range(first, first + 16))))


def reduce_sum(builder, v):
    """Sum of a float vector by halving, a fixed order."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(I32, 0))


def open_unit_loop(builder, name: str) -> tuple:
    """Start a loop over a row's units (blocks): (entry block, loop block, done block, the unit index phi).
    The caller adds its accumulators' phis, the body, then `close_unit_loop`."""
    entry = builder.block
    loop, done = builder.append_basic_block(name + "loop"), builder.append_basic_block(name + "done")
    builder.branch(loop)
    builder.position_at_end(loop)
    return entry, loop, done, builder.phi(I64)


def close_unit_loop(builder, opened: tuple, units, phis) -> None:
    """End `open_unit_loop`'s loop after `units` units: each (phi, its next value) pair of `phis` starts
    at zero; the builder is left after the loop."""
    entry, loop, done, u = opened
    nxt = builder.add(u, ir.Constant(I64, 1))
    u.add_incoming(ir.Constant(I64, 0), entry)
    u.add_incoming(nxt, loop)
    for phi, value in phis:
        phi.add_incoming(ir.Constant(phi.type, None), entry)
        phi.add_incoming(value, loop)
    builder.cbranch(builder.icmp_signed("<", nxt, units), loop, done)
    builder.position_at_end(done)


def emit_row_dots(builder, qtype, rows, row, xs, units):
    """Emit the loop over `units` of one weight row: returns `rows` float sums, one per x row.

    row: i8* (the row's blocks); xs: float* per input row."""
    weights, _, has_offset = UNITS[qtype]
    chunks = weights // 32
    opened = open_unit_loop(builder, "q")
    u = opened[3]
    # 32 lanes per row for 1-2 rows; 16 for 3-4, so that the accumulators fit AVX2's 16 registers
    acc_type = V32F if rows <= 2 else V16F
    accs = [builder.phi(acc_type) for _ in range(rows)]
    new = list(accs)
    for j, codes, sv, ov in unit_codes(builder, qtype, row, u):
        chunk = builder.add(builder.mul(u, ir.Constant(I64, chunks)), ir.Constant(I64, j))
        w = codes if sv is None else builder.fmul(builder.sitofp(codes, V32F), spread(builder, sv, 32), flags=CONTRACT)
        if has_offset:
            w = builder.fadd(w, spread(builder, ov, 32), flags=CONTRACT)
        first = builder.mul(chunk, ir.Constant(I64, 32))
        parts = [w] if acc_type is V32F else [_half(builder, w, 0), _half(builder, w, 16)]
        for r in range(rows):
            for p, wp in enumerate(parts):
                at = builder.gep(xs[r], [builder.add(first, ir.Constant(I64, 16 * p))])
                xv = builder.load(builder.bitcast(at, acc_type.as_pointer()), align=4)
                new[r] = builder.fadd(builder.fmul(wp, xv, flags=CONTRACT), new[r], flags=CONTRACT)
    close_unit_loop(builder, opened, units, list(zip(accs, new)))
    return [reduce_sum(builder, v) for v in new]


def emit_dequant_row(builder, qtype, row, out, units):
    """Emit the loop writing one row's weights as float32 to float* `out`: scale * code (+ offset)
    with no fusing, the same float32 operations as gguf.quants.dequantize, so bit-equal to it."""
    weights, _, has_offset = UNITS[qtype]
    opened = open_unit_loop(builder, "dq")
    u = opened[3]
    for j, codes, sv, ov in unit_codes(builder, qtype, row, u):
        w = codes if sv is None else builder.fmul(builder.sitofp(codes, V32F), spread(builder, sv, 32))  # float_ir: weights
        if has_offset:
            w = builder.fadd(w, spread(builder, ov, 32))
        first = builder.add(builder.mul(u, ir.Constant(I64, weights)), ir.Constant(I64, 32 * j))
        builder.store(w, builder.bitcast(builder.gep(out, [first]), V32F.as_pointer()), align=4)
    close_unit_loop(builder, opened, units, [])
