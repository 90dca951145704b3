"""LLVM IR for Q4_K and Q6_K weights repacked eight rows at a time (kquant_r8.py's layouts), against input
rows quantized per 256 values as kblock_ir's (codes, a scale per 256, int16 code sums per 16).

kblock_ir reads one weight row a call: each Q4_K block's scales are unpacked on the integer units,
broadcast per 32 codes with a shuffle, and the block's int32 sum and its float scale and mins are
per row, reduced across eight lanes at the row's end. Here a vector lane is a weight row: one
32-byte register holds four codes of each of eight rows, `vpmaddubsw` against those four input codes
broadcast gives each row's two pair sums, and `vpmaddwd` (`vpdpwssd` with AVX512-VNNI) by the rows'
sub-block scales adds them into the rows' own int32 lanes (with AVX512-VNNI `vpdpbusd` adds the four
codes' products straight into a sub-block's int32 lanes, then one `vpmulld` by its scales, the same
integers: Q4_K's `_k4_dpbusd` for one input row, `_k4_dpbusd_rows` and Q6_K's `_k6_dpbusd_rows` in inline
asm). The scales come decoded (one byte a row), the block's d and dmin as eight halves, and the float
work, once a block, is for eight rows:

    acc += (d * d_x) * float(sumi) ; mins += (dmin * d_x) * float(m . bsums)   (lanes = rows)

and a row's result is acc - mins in its lane: the same operations for every lane, so a row's sum is
the same bits in whichever group, call, tile or thread it is computed. Integer sums are exact: a
pair is at most 2 * 15 * 127 = 3,810, a block's int32 sum below 2^24. Q6_K the same way, its 6-bit
codes put together from a low-nibble and a 2-bit register, its int8 scales per 16 codes, and its bias
of 32 subtracted in integers (`sumi - 32 * (scales . sums)`, as kblock_ir), no mins: a pair at most
2 * 63 * 127 = 16,002, a block's sum below 2^29."""

from __future__ import annotations

from llvmlite import binding, ir

from .int8_ir import V8I32, V16I16, _prefetch, _splat8, _x86
from .kblock_ir import VNNI, _fma, _total
from .vector_ir import I8, I32, I64, V8F, V32I8, _load, _splat, _splat_f, close_unit_loop, open_unit_loop

# numba's codegen sets up LLVM's asm printer only; the inline asm below (_RowsAsm) needs the parser
binding.initialize_native_asmparser()
BW = bool(binding.get_host_cpu_features().get("avx512bw"))  # the asm's EVEX vpsrlw on any of 32 registers
ROWS = 8  # weight rows a group
Q4_K, Q6_K = 12, 14
# a group's block: Q4_K d[8], dmin[8] (halves), scales[8][8], mins as pairs[4][8][2], codes[4][8][8][4];
# Q6_K d[8], scales as pairs[8][8][2] (int8), then per t < 16: low nibbles t and t + 16, high bits t ([8][4] each)
GROUP_BYTES = {Q4_K: 1184, Q6_K: 1680}
SCALES, MINS, CODES = 32, 96, 160  # Q4_K's offsets in a group's block
K6_SCALES, K6_CODES = 16, 144  # Q6_K's
# Software prefetch, two group blocks ahead, only for calls of several input rows. One input row streams
# a group's single run of bytes faster on the hardware prefetcher alone (Zen 4, one thread, Q4_K rows of
# 2,048 / 4,096 values from DRAM: 29-30 GB/s without, 20-25 with 1-4 blocks ahead); four input rows
# spend long enough on a block that the hardware's stream falls behind (4,096: 6.0 GB/s without,
# 9.0-10.0 with). `python -m bench kquant-repack`.
PREFETCH_GROUPS = 2  # group blocks ahead
V8H, V8I8, V16I8 = ir.VectorType(ir.HalfType(), 8), ir.VectorType(I8, 8), ir.VectorType(I8, 16)
V4I32, V16I32 = ir.VectorType(I32, 4), ir.VectorType(I32, 16)


def _halves(builder, group, base, at):
    """Eight float16 at byte base + at as <8 x float>."""
    ptr = builder.bitcast(builder.gep(group, [builder.add(base, ir.Constant(I64, at))]), V8H.as_pointer())
    return builder.fpext(builder.load(ptr, align=1), V8F)


def _broadcast32(builder, ptr, offset):
    """The 4 bytes at ptr + offset repeated across a <32 x i8> (one vpbroadcastd)."""
    word = builder.load(builder.bitcast(builder.gep(ptr, [offset]), I32.as_pointer()), align=1)
    return builder.bitcast(_splat8(builder, word), V32I8)


def _scales(builder, group, base):
    """The 8 sub-blocks' scales as <8 x i32> (row r's in lane r: _k4_dpbusd's) and as <16 x i16>, row r's
    at lanes 2r and 2r + 1 (vpmaddwd's pairs), and the 4 pairs of mins as <16 x i16>, row r's
    (m_2q, m_2q+1) at lanes 2r, 2r + 1."""
    words = [builder.zext(_load(builder, group, builder.add(base, ir.Constant(I64, SCALES + 8 * j)), V8I8), V8I32)
             for j in range(8)]
    scales = [builder.bitcast(builder.or_(v, builder.shl(v, _splat(V8I32, 16))), V16I16) for v in words]
    mins = [builder.zext(_load(builder, group, builder.add(base, ir.Constant(I64, MINS + 16 * q)), V16I8), V16I16)
            for q in range(4)]
    return words, scales, mins


def _bsum_pairs(builder, xs, u):
    """The input row's code sums per 32 of block u, (s_2q, s_2q+1) as one i32 for q = 0..3, each
    broadcast to <16 x i16> (pairs for vpmaddwd against a row's two mins)."""
    ptr = builder.bitcast(builder.gep(xs, [builder.mul(u, ir.Constant(I64, 16))]), V16I16.as_pointer())
    sums = builder.load(ptr, align=2)
    even = builder.shuffle_vector(sums, sums, ir.Constant(V8I32, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(sums, sums, ir.Constant(V8I32, list(range(1, 16, 2))))
    words = builder.bitcast(builder.add(even, odd), V4I32)  # |sum of 32 codes| <= 4,064: an int16
    return [builder.bitcast(builder.shuffle_vector(words, words, ir.Constant(V8I32, [q] * 8)), V16I16) for q in range(4)]


def _madd(builder, chain, pairs, scales):
    """chain + pmaddwd(pairs, scales): vpdpwssd with AVX512-VNNI, else vpmaddwd then vpaddd."""
    if chain is None:
        return _x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs, scales)
    if VNNI:
        return _x86(builder, "llvm.x86.avx512.vpdpwssd.256", V8I32, chain, builder.bitcast(pairs, V8I32),
                    builder.bitcast(scales, V8I32))
    return builder.add(chain, _x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, pairs, scales))


def _k4_codes(builder, group, base):
    """Q4_K's 32 code registers of a group's block: (codes, first weight of their four, sub-block)."""
    out = []
    for p in range(4):  # codes 64p .. 64p + 63: sub-block 2p in the low nibbles, 2p + 1 in the high
        for g in range(8):
            packed = _load(builder, group, builder.add(base, ir.Constant(I64, CODES + 256 * p + 32 * g)), V32I8)
            out.append((builder.and_(packed, _splat(V32I8, 15)), 64 * p + 4 * g, 2 * p))
            out.append((builder.lshr(packed, _splat(V32I8, 4)), 64 * p + 32 + 4 * g, 2 * p + 1))
    return out


def _k6_codes(builder, group, base):
    """Q6_K's 64 code registers (0-63, bias 32 not taken): low-nibble register t holds code groups t and
    t + 32 (weights 4t.., 128 + 4t..), high-bit register t (of 16) the top bits of t, t + 16, t + 32, t + 48."""
    out = []
    for t in range(16):  # the registers in memory order (one stream for the prefetchers)
        lows = [_load(builder, group, builder.add(base, ir.Constant(I64, K6_CODES + 96 * t + 32 * k)), V32I8) for k in (0, 1)]
        high = _load(builder, group, builder.add(base, ir.Constant(I64, K6_CODES + 96 * t + 64)), V32I8)
        for k, c in enumerate((t, t + 16, t + 32, t + 48)):
            low = lows[k % 2]
            nibble = builder.and_(low, _splat(V32I8, 15)) if k < 2 else builder.lshr(low, _splat(V32I8, 4))
            top = builder.shl(builder.and_(builder.lshr(high, _splat(V32I8, 2 * k)), _splat(V32I8, 3)), _splat(V32I8, 4))
            out.append((builder.or_(nibble, top), 4 * c, c // 4))
    return out


def _k6_scales(builder, group, base):
    """Q6_K's 16 sub-block scales as <16 x i16> (row r's at lanes 2r, 2r + 1), and the 8 scale pairs
    (s_2q, s_2q+1) of each row as <16 x i16>, for the bias against the code sums per 16."""
    pairs = [builder.sext(_load(builder, group, builder.add(base, ir.Constant(I64, K6_SCALES + 16 * q)), V16I8), V16I16)
             for q in range(8)]
    scales = []
    for q in range(8):
        for k in range(2):
            scales.append(builder.shuffle_vector(pairs[q], pairs[q], ir.Constant(V16I32, [2 * (i // 2) + k for i in range(16)])))
    return scales, pairs


def _sums16_pairs(builder, xs, u):
    """The input row's code sums per 16 of block u as 8 pairs (s_2q, s_2q+1), each broadcast to <16 x i16>."""
    ptr = builder.bitcast(builder.gep(xs, [builder.mul(u, ir.Constant(I64, 16))]), V8I32.as_pointer())
    words = builder.load(ptr, align=2)
    return [builder.bitcast(builder.shuffle_vector(words, words, ir.Constant(V8I32, [q] * 8)), V16I16) for q in range(8)]


def _k4_dpbusd(builder, scale32, codes, xq, first):
    """Q4_K's int32 sums with AVX512-VNNI's vpdpbusd: each register's four codes a row (unsigned) against
    the four input codes (signed) added straight into the sub-block's int32 lanes (two chains a
    sub-block, even and odd registers), then times the rows' sub-block scales (vpmulld): one
    instruction a register and input row where vpmaddubsw + vpdpwssd take two. The same integers as
    the pairs' path (exact sums, any order): the same bits. Returns [[sum]] per input row."""
    zero = ir.Constant(V8I32, None)
    parts = [{} for _ in xq]  # [input row][sub-block] = its two chains, while the sub-block runs
    totals = [[] for _ in xq]
    for n, (register, weight, sub) in enumerate(codes):  # each register loaded once for every input row
        for r in range(len(xq)):
            x = _broadcast32(builder, xq[r], builder.add(first, ir.Constant(I64, weight)))
            chains = parts[r].setdefault(sub, [zero, zero])
            chains[(n // 2) % 2] = _x86(builder, "llvm.x86.avx512.vpdpbusd.256", V8I32, chains[(n // 2) % 2],
                                        builder.bitcast(register, V8I32), builder.bitcast(x, V8I32))
            if n % 16 >= 14:  # the sub-block's last register (codes come 16 a pair of sub-blocks): fold it
                a, b = parts[r].pop(sub)
                totals[r].append(builder.mul(builder.add(a, b), scale32[sub]))
    return totals


class _RowsAsm:
    """The inline-asm statements of _k4_dpbusd_rows and _k6_dpbusd_rows: `sums` int32 sums a statement adds
    into, the rows' running totals (passed through untouched: they order each fold, done in IR between
    statements, before the next sums; else LLVM leaves the sums on the stack), `scratch` registers, the
    codes' pointer, the input rows' pointers at this block, and `masks` byte splats. The operands' names
    in the asm text: `sum(i)`, `scratch`, `codes`, `xs`, `mask`."""

    def __init__(self, builder, rows: int, sums: int, scratch: int, masks: tuple):
        self.builder, self.rows, self.count, self.masks = builder, rows, sums, masks
        held = sums + rows
        self.type = ir.FunctionType(ir.LiteralStructType([V8I32] * (held + scratch)),
                                    [V8I32] * held + [I8.as_pointer()] * (rows + 1) + [V32I8] * len(masks))
        self.constraint = ",".join(["=v"] * held + ["=&v"] * scratch + [str(i) for i in range(held)]
                                   + ["r"] * (rows + 1) + ["v"] * len(masks))
        first = 2 * held + scratch
        self.scratch = [f"${held + i}" for i in range(scratch)]
        self.codes, self.xs = f"${first}", [f"${first + 1 + r}" for r in range(rows)]
        self.mask = [f"${first + rows + 1 + i}" for i in range(len(masks))]

    def sum(self, i: int) -> str:
        return f"${i}"

    def run(self, text: list, sums: list, totals: list, codes, xs: list) -> tuple[list, list]:
        b = self.builder
        res = b.asm(self.type, "\n".join(text), self.constraint,
                    sums + totals + [codes] + xs + [_splat(V32I8, m) for m in self.masks], False)
        return ([b.extract_value(res, i) for i in range(self.count)],
                [b.extract_value(res, self.count + r) for r in range(self.rows)])


def _k4_dpbusd_rows(builder, scale32, group, base, xq, first):
    """_k4_dpbusd for several input rows, a packed register's two code registers against every row in one
    inline-asm statement (_RowsAsm): LLVM's scheduler otherwise runs the rows one after another over all
    64 code registers, which then do not fit the 32 vector registers (Zen 4, 4 rows: ~290 spill loads and
    stores a block). The same integers as the pairs' path. Returns [[sum]] per input row."""
    n = len(xq)
    xs = [builder.gep(x, [first]) for x in xq]
    codes = builder.gep(group, [builder.add(base, ir.Constant(I64, CODES))])
    zero = ir.Constant(V8I32, None)
    asm = _RowsAsm(builder, n, 2 * n, 2, (15,))  # sums [half][row]
    lo, hi = asm.scratch
    totals = [zero] * n
    for p in range(4):  # sub-blocks 2p (low nibbles) and 2p + 1 (high), 8 packed registers each
        sums = [zero] * (2 * n)
        for g in range(8):
            text = [f"vmovdqu64 {256 * p + 32 * g}({asm.codes}), {lo}", f"vpsrlw $$4, {lo}, {hi}",
                    f"vpandd {asm.mask[0]}, {lo}, {lo}", f"vpandd {asm.mask[0]}, {hi}, {hi}"]
            for half, register in enumerate((lo, hi)):
                weight = 64 * p + 32 * half + 4 * g
                text += [f"vpdpbusd {weight}({asm.xs[r]}){{1to8}}, {register}, {asm.sum(half * n + r)}" for r in range(n)]
            sums, totals = asm.run(text, sums, totals, codes, xs)
        for r in range(n):
            scaled = builder.add(builder.mul(sums[r], scale32[2 * p]), builder.mul(sums[n + r], scale32[2 * p + 1]))
            totals[r] = builder.add(totals[r], scaled)
    return [[t] for t in totals]


def _k6_scale32(builder, pairs, sub):
    """Q6_K's sub-block `sub` scales as <8 x i32>, row r's in lane r (_k6_dpbusd_rows's), from _k6_scales'
    scale pairs (row r's (s_2q, s_2q+1) at lanes 2r, 2r + 1 of pairs[q])."""
    pair = pairs[sub // 2]
    return builder.sext(builder.shuffle_vector(pair, pair, ir.Constant(V8I32, [2 * r + sub % 2 for r in range(8)])), V8I32)


def _k6_dpbusd_rows(builder, pairs, group, base, xq, first):
    """Q6_K's int32 sums with AVX512-VNNI's vpdpbusd, in inline asm as _k4_dpbusd_rows: each 96-byte step t
    of the block (two low-nibble registers and a top-bits register) puts together its four 6-bit code
    registers (codes t, t + 16, t + 32, t + 48: sub-blocks t // 4 + 0, 4, 8, 12; the top bits joined with
    `vpternlogd`) and adds each against every input row into that sub-block's int32 lanes; four steps
    complete four sub-blocks, then times their scales (vpmulld). The same integers as the pairs' path (the
    bias of 32 is the caller's). Returns [[sum]] per input row."""
    n = len(xq)
    xs = [builder.gep(x, [first]) for x in xq]
    codes = builder.gep(group, [builder.add(base, ir.Constant(I64, K6_CODES))])
    zero = ir.Constant(V8I32, None)
    asm = _RowsAsm(builder, n, 4 * n, 5, (15, 48))  # sums [k][row]
    low0, low1, high, code, top = asm.scratch
    m15, m48 = asm.mask
    totals = [zero] * n
    for s in range(4):  # steps 4s .. 4s + 3 complete sub-blocks s, s + 4, s + 8, s + 12
        sums = [zero] * (4 * n)
        for t in range(4 * s, 4 * s + 4):
            text = [f"vmovdqu64 {96 * t + 32 * i}({asm.codes}), {reg}" for i, reg in enumerate((low0, low1, high))]
            for k, c in enumerate((t, t + 16, t + 32, t + 48)):
                low = low0 if k % 2 == 0 else low1
                if k < 2:
                    text.append(f"vpandd {m15}, {low}, {code}")
                else:
                    text += [f"vpsrlw $$4, {low}, {code}", f"vpandd {m15}, {code}, {code}"]
                shift = (4, 2, 0, -2)[k]  # the top bits 2k, 2k + 1 to bits 4, 5
                if shift:
                    text.append(f"vpsllw $${shift}, {high}, {top}" if shift > 0 else f"vpsrlw $${-shift}, {high}, {top}")
                text.append(f"vpternlogd $$0xF8, {m48}, {top if shift else high}, {code}")  # code |= top & 48
                text += [f"vpdpbusd {4 * c}({asm.xs[r]}){{1to8}}, {code}, {asm.sum(k * n + r)}" for r in range(n)]
            sums, totals = asm.run(text, sums, totals, codes, xs)
        scales = [_k6_scale32(builder, pairs, s + 4 * k) for k in range(4)]
        for r in range(n):
            for k in range(4):
                totals[r] = builder.add(totals[r], builder.mul(sums[k * n + r], scales[k]))
    return [[t] for t in totals]


def emit_group_dots(builder, qtype, group, xq, xd, xs, units):
    """A group of eight weight rows (i8*, `units` blocks of GROUP_BYTES[qtype]) against each input row
    (xq: i8* codes, xd: float* scale per 256, xs: i16* code sums per 16): one <8 x float> per input
    row, lane r the sum of weight row r."""
    n_in, size = len(xq), GROUP_BYTES[qtype]
    chains = max(2, (8 if VNNI else 4) // n_in)  # independent int32 sums a block (integer: any order)
    opened = open_unit_loop(builder, "r8")
    u = opened[3]
    accs = [builder.phi(V8F) for _ in xq]
    mins = [builder.phi(V8F) for _ in xq] if qtype == Q4_K else []
    base = builder.mul(u, ir.Constant(I64, size))
    for line in range(0, size if n_in > 1 else 0, 64):  # every line of the block PREFETCH_GROUPS ahead
        _prefetch(builder, [group], u, size, PREFETCH_GROUPS * size + line)
    d = _halves(builder, group, base, 0)
    if qtype == Q4_K:
        dmin = _halves(builder, group, base, 16)
        words, scales, bias_pairs = _scales(builder, group, base)
    else:
        scales, bias_pairs = _k6_scales(builder, group, base)
    first = builder.mul(u, ir.Constant(I64, 256))
    if VNNI and qtype == Q4_K and n_in == 1:
        sums = _k4_dpbusd(builder, words, _k4_codes(builder, group, base), xq, first)
    elif VNNI and BW:  # several input rows, or Q6_K: the codes are the asm's own
        sums = (_k4_dpbusd_rows(builder, words, group, base, xq, first) if qtype == Q4_K
                else _k6_dpbusd_rows(builder, bias_pairs, group, base, xq, first))
    else:
        sums = [[None] * chains for _ in xq]
        codes = _k4_codes(builder, group, base) if qtype == Q4_K else _k6_codes(builder, group, base)
        for n, (register, weight, sub) in enumerate(codes):
            for r in range(n_in):
                x = _broadcast32(builder, xq[r], builder.add(first, ir.Constant(I64, weight)))
                pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", V16I16, register, x)
                sums[r][n % chains] = _madd(builder, sums[r][n % chains], pairs, scales[sub])
    new_accs, new_mins = [], []
    for r in range(n_in):
        dx = _splat_f(builder, builder.load(builder.gep(xd[r], [u]), align=4), 8)
        bsums = _bsum_pairs(builder, xs[r], u) if qtype == Q4_K else _sums16_pairs(builder, xs[r], u)
        bias = _total(builder, [_x86(builder, "llvm.x86.avx2.pmadd.wd", V8I32, bp, bs) for bp, bs in zip(bias_pairs, bsums)])
        total = _total(builder, sums[r])
        if qtype == Q6_K:  # the codes' bias of 32, in integers
            total = builder.sub(total, builder.shl(bias, _splat(V8I32, 5)))
        new_accs.append(_fma(builder, builder.sitofp(total, V8F), builder.fmul(d, dx), accs[r]))
        if qtype == Q4_K:
            new_mins.append(_fma(builder, builder.sitofp(bias, V8F), builder.fmul(dmin, dx), mins[r]))
    close_unit_loop(builder, opened, units, list(zip(accs, new_accs)) + list(zip(mins, new_mins)))
    return [builder.fsub(a, m) for a, m in zip(new_accs, new_mins)] if mins else new_accs
