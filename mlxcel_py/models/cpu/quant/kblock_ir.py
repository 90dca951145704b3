"""LLVM IR for the K-quant decode products over super-block activations (AVX2): Q4_K and Q6_K
against input rows quantized per 256 values (llama.cpp's Q8_K: one float scale a block, int8 codes,
int16 code sums per 16), summed in integers across the whole block.

int8_ir's product quantizes the input per 32 values, so each chunk of 32 weights ends in a float
conversion, two multiplies and an add (in cache on a Zen 4, one thread: 9.2 ns a Q4_K block, 11.6 a
Q6_K block; here 6.9 and 6.7). With one input scale per 256 values a block is integer work up to its end: each chunk
is `vpmaddubsw` (codes x input codes, pairs to int16) and `vpmaddwd` by the chunk's 6-bit (Q4_K) or
int8 (Q6_K) scales broadcast as int16, added into eight int32 lanes; then, once a block,

    Q4_K: acc += (d * d_x) * float(sumi) ; mins += (dmin * d_x) * float(m . bsums)
    Q6_K: acc += (d * d_x) * float(sumi - 32 * (scales . bsums))      (the codes' bias of 32)

and the row's sum is reduce(acc) - reduce(mins). Integer sums are exact, and every (weight row,
input row) pair runs the same operations in the same order whatever the tile, so a sum never
depends on the thread count, the tile or the batch. Bounds: |x codes| <= 127, so a pair of
products is at most 2 * 63 * 127 = 16,002 (Q6_K), and a block's int32 sum below 2^26."""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from .int8_ir import HAS_AVX2, V8I32, V16I16, _prefetch, _x86
from .vector_ir import (I32, I64, V8F, V16I8, V32I8, _f16_scalar, _lanes, _load, _splat, _splat_f, close_unit_loop,
                        open_unit_loop, reduce_sum)

HAS_FMA = bool(llvm.get_host_cpu_features().get("fma")) if HAS_AVX2 else False
Q4_K, Q6_K = 12, 14
KBLOCK_TYPES = (Q4_K, Q6_K) if HAS_AVX2 and HAS_FMA else ()  # the types this product reads (x86 with AVX2)
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}
# How far ahead of the block being read to prefetch: the 1B Q4_K_M fused step on 2 threads (Zen 4, fresh
# compiles, interleaved) 22.6-23.7 ms at 512 against 24.9-25.6 at int8_ir's 2,048 (batch 4: 48.9 against
# 57-61): farther ahead, the prefetched lines evict the input rows' codes a long row reuses.
PREFETCH_BYTES = 512


def _k4_scales_scalar(builder, row, base):
    """Q4_K's 6-bit scales and mins from their 12 bytes at base + 4 as llama.cpp unpacks them, in three
    32-bit words on the integer units (the vector units are what a Q4_K block is short of), then
    widened to <16 x i16>: scales 0-7, mins 0-7."""
    words = [builder.load(builder.bitcast(builder.gep(row, [builder.add(base, ir.Constant(I64, 4 + 4 * k))]),
                                          I32.as_pointer()), align=1) for k in range(3)]
    k1, k2, k3 = (ir.Constant(I32, m) for m in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))
    shr = lambda v, n: builder.lshr(v, ir.Constant(I32, n))  # noqa: E731
    shl = lambda v, n: builder.shl(v, ir.Constant(I32, n))  # noqa: E731
    w0, w1, w2 = words
    u3 = builder.or_(builder.and_(shr(w2, 4), k2), shl(builder.and_(shr(w1, 6), k3), 4))
    u2 = builder.and_(w1, k1)
    u1 = builder.or_(builder.and_(w2, k2), shl(builder.and_(shr(w0, 6), k3), 4))
    u0 = builder.and_(w0, k1)
    vec = ir.Constant(ir.VectorType(I32, 4), None)
    for k, u in enumerate((u0, u1, u2, u3)):
        vec = builder.insert_element(vec, u, ir.Constant(I32, k))
    return builder.zext(builder.bitcast(vec, V16I8), V16I16)


def _block(builder, qtype, row, u):
    """One weight row's block u: ([(chunk j, <32 x i8> unsigned codes, <16 x i16> scales)], the
    <16 x i16> the block's code sums are multiplied by, d, dmin or None)."""
    base = builder.mul(u, ir.Constant(I64, BLOCK_BYTES[qtype]))
    at = lambda n: builder.add(base, ir.Constant(I64, n))  # noqa: E731
    chunks = []
    if qtype == Q4_K:  # d, dmin, 12 scale bytes, qs[128]; 32 bytes of qs hold sub-blocks 2p, 2p + 1
        scm = _k4_scales_scalar(builder, row, base)  # <16 x i16>: the 8 scales, then the 8 mins
        d, dmin = _f16_scalar(builder, row, base), _f16_scalar(builder, row, at(2))
        for p in range(4):
            v = _load(builder, row, at(16 + 32 * p), V32I8)
            for j, codes in ((2 * p, builder.and_(v, _splat(V32I8, 15))), (2 * p + 1, builder.lshr(v, _splat(V32I8, 4)))):
                chunks.append((j, codes, _lanes(builder, scm, [j] * 16)))
        return chunks, _lanes(builder, scm, [8 + k // 2 for k in range(16)]), d, dmin
    # Q6_K: ql[128], qh[64], int8 scales[16], d; halves of 128 weights; codes 0-63 (bias 32)
    d = _f16_scalar(builder, row, at(208))
    scales = builder.sext(_load(builder, row, at(192), V16I8), V16I16)
    for h in range(2):
        ql0, ql1, high = (_load(builder, row, at(n), V32I8) for n in (64 * h, 64 * h + 32, 128 + 32 * h))
        for s, low in enumerate((builder.and_(ql0, _splat(V32I8, 15)), builder.and_(ql1, _splat(V32I8, 15)),
                                 builder.lshr(ql0, _splat(V32I8, 4)), builder.lshr(ql1, _splat(V32I8, 4)))):
            bits = builder.and_(builder.lshr(high, _splat(V32I8, 2 * s)), _splat(V32I8, 3))
            j = 4 * h + s
            chunks.append((j, builder.or_(low, builder.shl(bits, _splat(V32I8, 4))),
                           _lanes(builder, scales, [2 * j] * 8 + [2 * j + 1] * 8)))
    return chunks, scales, d, None


def _fma(builder, a, b, c):
    """a * b + c, fused always (the same bits in every tile: no contraction left to LLVM's choice)."""
    fn = builder.module.globals.get("llvm.fma.v8f32") or ir.Function(
        builder.module, ir.FunctionType(V8F, [V8F, V8F, V8F]), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


# With AVX512-VNNI, LLVM fuses `sum += pmaddwd(a, b)` into `vpdpwssd` (4-5 cycles a result on a Zen 4): a block's
# eight chunks in one chain of them bound a Q4_K block to its latency (7.2 ns a block in cache, one row against
# one input row). So the chunks go into SPLIT sums (shared among the (weight row, input row) pairs of a call, whose
# chains interleave anyway), each a chain of explicit vpdpwssd, added at the end (6.1 ns; integer sums: the same bits
# in any order).
VNNI = HAS_AVX2 and all(llvm.get_host_cpu_features().get(f) for f in ("avx512vnni", "avx512vl"))
SPLIT = 4


def _accumulate(builder, sums, c, pairs16, scales, split):
    """Chunk c's int16 pair sums times its scales (pmaddwd) into `sums` (a list of `split` running sums)."""
    if not VNNI or split == 1:  # vpaddd after vpmaddwd: one cycle a link; or the pairs' chains interleave
        part = _x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs16, scales)
        return [part] if not sums else [builder.add(sums[0], part)]
    if c < split:
        return sums + [_x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs16, scales)]
    k = c % split
    fused = _x86(builder, "llvm.x86.avx512.vpdpwssd.256", V8I32, sums[k], builder.bitcast(pairs16, V8I32),
                 builder.bitcast(scales, V8I32))
    return sums[:k] + [fused] + sums[k + 1:]


def _total(builder, sums):
    """The running sums added pairwise."""
    while len(sums) > 1:
        sums = [builder.add(a, b) for a, b in zip(sums[::2], sums[1::2])] + sums[len(sums) // 2 * 2:]
    return sums[0]


def emit_kdots(builder, qtype, wrows, xq, xd, xs, units):
    """Every weight row of `wrows` (i8*, `units` blocks each) against every input row: sums in
    (weight row, input row) order. xq: i8* codes, xd: float* scale per 256, xs: i16* code sums per
    16, one of each per input row."""
    pairs = [(i, r) for i in range(len(wrows)) for r in range(len(xq))]
    opened = open_unit_loop(builder, "k")
    u = opened[3]
    accs = [builder.phi(V8F) for _ in pairs]
    mins = [builder.phi(V8F) for _ in pairs] if qtype == Q4_K else []
    new_acc, new_min = list(accs), list(mins)
    _prefetch(builder, wrows, u, BLOCK_BYTES[qtype], PREFETCH_BYTES)
    blocks = [_block(builder, qtype, w, u) for w in wrows]
    first = builder.mul(u, ir.Constant(I64, 256))
    dxs = [builder.load(builder.gep(d, [u]), align=4) for d in xd]
    sums = [builder.load(builder.bitcast(builder.gep(s, [builder.mul(u, ir.Constant(I64, 16))]), V16I16.as_pointer()), align=2)
            for s in xs]
    sumi = [[] for _ in pairs]  # per pair, SPLIT / pairs running sums (chunk c into sum c % that)
    for c in range(8):
        qs = [builder.load(builder.bitcast(builder.gep(q, [builder.add(first, ir.Constant(I64, 32 * c))]), V32I8.as_pointer()),
                           align=1) for q in xq]
        for p, (i, r) in enumerate(pairs):
            _, codes, sc = blocks[i][0][c]
            sumi[p] = _accumulate(builder, sumi[p], c, _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", V16I16, codes, qs[r]), sc,
                                  max(1, SPLIT // len(pairs)))
    sumi = [_total(builder, s) for s in sumi]
    for p, (i, r) in enumerate(pairs):
        _, by, d, dmin = blocks[i]
        bsum = _x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, sums[r], by)
        total = sumi[p]
        if qtype == Q6_K:
            total = builder.sub(total, builder.shl(bsum, ir.Constant(V8I32, [5] * 8)))
        scale = _splat_f(builder, builder.fmul(d, dxs[r]), 8)
        new_acc[p] = _fma(builder, builder.sitofp(total, V8F), scale, accs[p])
        if qtype == Q4_K:
            mscale = _splat_f(builder, builder.fmul(dmin, dxs[r]), 8)
            new_min[p] = _fma(builder, builder.sitofp(bsum, V8F), mscale, mins[p])
    close_unit_loop(builder, opened, units, list(zip(accs, new_acc)) + list(zip(mins, new_min)))
    out = [reduce_sum(builder, v) for v in new_acc]
    if mins:
        out = [builder.fsub(s, reduce_sum(builder, m)) for s, m in zip(out, new_min)]
    return out
