"""LLVM vector IR for the decode attention's two inner loops (numba intrinsics, llvmlite builder).

numba vectorizes decode_attention's loops over the head dimension but keeps every
accumulator in memory and reduces each dot product on its own: 3.5-3.8 ns a (query head,
position) for the scores and 4.2 for the V accumulation at dim 64 (docs/CPU_DECODE.md), where
the loads alone need ~1.3. Here the loops are explicit vectors, as quant/vector_ir.py writes the
products, for a head dimension that is a multiple of 8 (runtime, any such):

- `dots(q, k, out)`: out[j] = q . k[j]. Each position's <8 x float> accumulator takes the
  dimension's 8-lane slices in order (one FMA each), then its 8 lanes are summed pairwise as
  vector_ir.reduce_sum does (lane i with i + 4, then i + 2, then i + 1). Eight (then four)
  positions a pass share each load of q, and their reductions run as one transposed tree of the
  same pairings: a position's sum has the same bits in a pass of eight as alone.
- `weigh(p, v, acc)`: acc += sum_j p[j] * v[j], positions in order, one FMA a lane a position, the
  accumulator held in registers 64 lanes at a time (then 32, then 8), so a position's weight is
  added the same way wherever a range is cut.
- `dots2(q0, q1, k, out0, out1)`, `weigh2(p0, p1, v, acc0, acc1)`: the same for two queries (a GQA group's
  heads) in one pass, each K or V load serving both: every (query, position) keeps the single loops'
  FMAs, order and pairings, so the same bits (1.15-1.4x fewer ns a (query, position) at dim 64 and 128).

Nothing here is x86-specific: LLVM splits the vectors for the target (ymm on AVX2, q on NEON)."""

from __future__ import annotations

import platform

from llvmlite import binding as llvm, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .quant.vector_ir import CONTRACT, F32, I32, I64, reduce_sum

LANES = 8  # a slice of the head dimension: one AVX2 register of float32
# dots2's positions a pass: 8 (16 accumulators) where x86 has AVX-512VL's 32 vector registers, else 4
# (8 accumulators: AVX2's 16, NEON's 32 registers of half the width). A score's bits are the same in any.
_X86 = platform.machine().lower() in ("x86_64", "amd64")
PAIR_WIDTHS = (8, 4, 1) if _X86 and llvm.get_host_cpu_features().get("avx512vl") else (4, 1)
V8F = ir.VectorType(F32, LANES)
BLOCKS = (64, 32, 8)  # weigh's accumulator widths, widest first (64 lanes: 8 ymm registers)


def _i64(value):
    return ir.Constant(I64, value)


def _vload(builder, ptr, index, vtype):
    """An unaligned vector load of `vtype` from float* ptr at element `index` (i64)."""
    return builder.load(builder.bitcast(builder.gep(ptr, [index]), vtype.as_pointer()), align=4)


def _fma(builder, a, b, acc):
    return builder.fadd(builder.fmul(a, b, flags=CONTRACT), acc, flags=CONTRACT)


def _shuffle(builder, a, b, lanes):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(lanes)), lanes))


def _pairwise(builder, a, b, keep):
    """a + b lane for lane after picking, from a's and b's lanes side by side, `keep` lanes in each run
    of 2 * keep: lane i of a run with lane i + keep (reduce_sum's pairing at that level)."""
    width = 2 * a.type.count
    firsts = [i for i in range(width) if i % (2 * keep) < keep]
    return builder.fadd(_shuffle(builder, a, b, firsts), _shuffle(builder, a, b, [i + keep for i in firsts]))


def _reduce(builder, accs):
    """The sums of 4 or 8 <8 x float> accumulators as one vector, each with reduce_sum's pairings
    (lane i + lane i + 4, then + 2, then + 1): a transposed tree, two positions a vector and then more."""
    level = [_pairwise(builder, a, b, 4) for a, b in zip(accs[::2], accs[1::2])]  # lanes i, i + 4
    level = [_pairwise(builder, a, b, 2) for a, b in zip(level[::2], level[1::2])]  # then i, i + 2
    if len(level) == 2:
        return _pairwise(builder, level[0], level[1], 1)
    (last,) = level
    return builder.fadd(_shuffle(builder, last, last, [0, 2, 4, 6]), _shuffle(builder, last, last, [1, 3, 5, 7]))


def _loop(builder, name, start, stop, step, carried, body):
    """for i in range(start, stop, step) with phi values `carried` (initial values): body(i, values)
    returns the next values; returns the values after the loop (the initial ones if it never runs)."""
    entry = builder.block
    head, loop, done = (builder.append_basic_block(f"{name}_{s}") for s in ("head", "body", "done"))
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(I64)
    phis = [builder.phi(v.type) for v in carried]
    builder.cbranch(builder.icmp_signed("<", builder.add(i, _i64(step - 1)), stop), loop, done)
    builder.position_at_end(loop)
    new = body(i, phis)
    nxt, latch = builder.add(i, _i64(step)), builder.block
    builder.branch(head)
    i.add_incoming(start, entry)
    i.add_incoming(nxt, latch)
    for phi, init, value in zip(phis, carried, new):
        phi.add_incoming(init, entry)
        phi.add_incoming(value, latch)
    builder.position_at_end(done)
    return phis


def _emit_dots(builder, q, k, out, n, dim, stride):
    """out[j] = q . k[j * stride : j * stride + dim] for j < n (float* all three): 8 positions a pass
    (8 independent FMA chains hide the FMA latency), then 4, then one at a time."""
    zero = ir.Constant(V8F, None)
    slices = builder.udiv(dim, _i64(LANES))

    def slice_loop(rows_at):
        def body(s, accs):
            at = builder.mul(s, _i64(LANES))
            qv = _vload(builder, q, at, V8F)
            return [_fma(builder, qv, _vload(builder, k, builder.add(r, at), V8F), acc) for r, acc in zip(rows_at, accs)]
        return _loop(builder, f"dots{len(rows_at)}", _i64(0), slices, 1, [zero] * len(rows_at), body)

    def group(width):
        def body(j, _):
            accs = slice_loop([builder.mul(builder.add(j, _i64(p)), stride) for p in range(width)])
            if width == 1:
                builder.store(reduce_sum(builder, accs[0]), builder.gep(out, [j]))
            else:
                sums = _reduce(builder, accs)
                builder.store(sums, builder.bitcast(builder.gep(out, [j]), sums.type.as_pointer()), align=4)
            return []
        return body

    first = _i64(0)
    for width in (8, 4, 1):
        _loop(builder, f"dots_by{width}", first, n, width, [], group(width))
        first = builder.mul(builder.udiv(n, _i64(width)), _i64(width))  # where the next width starts


def _emit_weigh(builder, p, v, acc, n, dim, stride):
    """acc[d] += sum_j p[j] * v[j * stride + d] for j < n, d < dim (float* all three), j in order."""
    first = _i64(0)
    for lanes in BLOCKS:
        vtype = ir.VectorType(F32, lanes)
        last = builder.mul(builder.udiv(dim, _i64(lanes)), _i64(lanes))  # blocks of this width end here

        def block(d, _, vtype=vtype, lanes=lanes):
            def position(j, values):
                weight = builder.load(builder.gep(p, [j]))
                splat = builder.insert_element(ir.Constant(vtype, None), weight, ir.Constant(I32, 0))
                splat = _shuffle(builder, splat, splat, [0] * lanes)
                return [_fma(builder, splat, _vload(builder, v, builder.add(builder.mul(j, stride), d), vtype), values[0])]

            (total,) = _loop(builder, f"weigh{lanes}_j", _i64(0), n, 1, [_vload(builder, acc, d, vtype)], position)
            builder.store(total, builder.bitcast(builder.gep(acc, [d]), vtype.as_pointer()), align=4)
            return []

        _loop(builder, f"weigh{lanes}", first, last, lanes, [], block)
        first = last


def _emit_dots_pair(builder, qs, k, outs, n, dim, stride):
    """_emit_dots for two queries at once: each K slice loaded once for both, PAIR_WIDTHS positions a
    pass, then one at a time. Each (query, position) takes
    _emit_dots's FMAs in the same order and the same reduction pairings: the same bits."""
    zero = ir.Constant(V8F, None)
    slices = builder.udiv(dim, _i64(LANES))

    def slice_loop(rows_at):
        def body(s, accs):
            at = builder.mul(s, _i64(LANES))
            qv = [_vload(builder, q, at, V8F) for q in qs]
            ks = [_vload(builder, k, builder.add(r, at), V8F) for r in rows_at]
            return [_fma(builder, qv[i], ks[p], accs[i * len(ks) + p]) for i in range(len(qs)) for p in range(len(ks))]
        return _loop(builder, f"dots2x{len(rows_at)}", _i64(0), slices, 1, [zero] * (len(qs) * len(rows_at)), body)

    def group(width):
        def body(j, _):
            accs = slice_loop([builder.mul(builder.add(j, _i64(p)), stride) for p in range(width)])
            for i, out in enumerate(outs):
                mine = accs[i * width:(i + 1) * width]
                if width == 1:
                    builder.store(reduce_sum(builder, mine[0]), builder.gep(out, [j]))
                else:
                    sums = _reduce(builder, mine)
                    builder.store(sums, builder.bitcast(builder.gep(out, [j]), sums.type.as_pointer()), align=4)
            return []
        return body

    first = _i64(0)
    for width in PAIR_WIDTHS:
        _loop(builder, f"dots2_by{width}", first, n, width, [], group(width))
        first = builder.mul(builder.udiv(n, _i64(width)), _i64(width))


def _emit_weigh_pair(builder, ps, v, accs, n, dim, stride):
    """_emit_weigh for two queries at once: each V load serves both, 32 lanes at a time (4 + 4
    accumulators), then 8; each lane takes the same FMAs in the same order: the same bits."""
    first = _i64(0)
    for lanes in (32, 8):
        vtype = ir.VectorType(F32, lanes)
        last = builder.mul(builder.udiv(dim, _i64(lanes)), _i64(lanes))

        def block(d, _, vtype=vtype, lanes=lanes):
            def position(j, values):
                got = _vload(builder, v, builder.add(builder.mul(j, stride), d), vtype)
                out = []
                for p, value in zip(ps, values):
                    splat = builder.insert_element(ir.Constant(vtype, None), builder.load(builder.gep(p, [j])),
                                                   ir.Constant(I32, 0))
                    out.append(_fma(builder, _shuffle(builder, splat, splat, [0] * lanes), got, value))
                return out

            init = [_vload(builder, acc, d, vtype) for acc in accs]
            totals = _loop(builder, f"weigh2_{lanes}_j", _i64(0), n, 1, init, position)
            for acc, total in zip(accs, totals):
                builder.store(total, builder.bitcast(builder.gep(acc, [d]), vtype.as_pointer()), align=4)
            return []

        _loop(builder, f"weigh2_{lanes}", first, last, lanes, [], block)
        first = last


def _arrays(context, builder, signature, args):
    return [context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args)]


def _ok(*arrays) -> bool:
    """float32 arrays, C-contiguous or any ("A": rows at their stride; the caller checks that the last
    axis of each is contiguous, decode_attention._segment)."""
    return all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout in "CA" for a in arrays)


def _row_stride(builder, a):
    """The element stride between rows of a 2-D float32 array (its byte stride / 4)."""
    return builder.sdiv(cgutils.unpack_tuple(builder, a.strides, 2)[0], _i64(4))


@intrinsic
def dots(typingctx, q, k, out):
    """out[j] = q . k[j] for the rows j of k (n, dim), q (dim,), out (n,); dim a multiple of 8, each
    array's last axis contiguous."""
    if not (_ok(q, k, out) and k.ndim == 2 and q.ndim == out.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        q_a, k_a, out_a = _arrays(context, builder, signature, args)
        n, dim = cgutils.unpack_tuple(builder, k_a.shape, 2)
        _emit_dots(builder, q_a.data, k_a.data, out_a.data, n, dim, _row_stride(builder, k_a))
        return context.get_dummy_value()

    return types.void(q, k, out), codegen


@intrinsic
def weigh(typingctx, p, v, acc):
    """acc += p @ v for p (n,), v (n, dim), acc (dim,); dim a multiple of 8, last axes contiguous."""
    if not (_ok(p, v, acc) and v.ndim == 2 and p.ndim == acc.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        p_a, v_a, acc_a = _arrays(context, builder, signature, args)
        n, dim = cgutils.unpack_tuple(builder, v_a.shape, 2)
        _emit_weigh(builder, p_a.data, v_a.data, acc_a.data, n, dim, _row_stride(builder, v_a))
        return context.get_dummy_value()

    return types.void(p, v, acc), codegen


@intrinsic
def dots2(typingctx, q0, q1, k, out0, out1):
    """dots(q0, k, out0) and dots(q1, k, out1) in one pass over k: the same bits."""
    if not (_ok(q0, q1, k, out0, out1) and k.ndim == 2 and q0.ndim == q1.ndim == out0.ndim == out1.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        q0_a, q1_a, k_a, o0_a, o1_a = _arrays(context, builder, signature, args)
        n, dim = cgutils.unpack_tuple(builder, k_a.shape, 2)
        _emit_dots_pair(builder, [q0_a.data, q1_a.data], k_a.data, [o0_a.data, o1_a.data], n, dim,
                        _row_stride(builder, k_a))
        return context.get_dummy_value()

    return types.void(q0, q1, k, out0, out1), codegen


@intrinsic
def weigh2(typingctx, p0, p1, v, acc0, acc1):
    """weigh(p0, v, acc0) and weigh(p1, v, acc1) in one pass over v: the same bits."""
    if not (_ok(p0, p1, v, acc0, acc1) and v.ndim == 2 and p0.ndim == p1.ndim == acc0.ndim == acc1.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        p0_a, p1_a, v_a, a0_a, a1_a = _arrays(context, builder, signature, args)
        n, dim = cgutils.unpack_tuple(builder, v_a.shape, 2)
        _emit_weigh_pair(builder, [p0_a.data, p1_a.data], v_a.data, [a0_a.data, a1_a.data], n, dim,
                         _row_stride(builder, v_a))
        return context.get_dummy_value()

    return types.void(p0, p1, v, acc0, acc1), codegen
