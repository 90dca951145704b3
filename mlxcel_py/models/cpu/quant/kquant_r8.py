"""Q4_K and Q6_K weights repacked eight rows at a time, and their products (r8_ir.py) over kblock's
activations (quantize_rows_q8k: int8 codes, a scale per 256, int16 code sums per 16); Q5_0 and Q8_0 the
same way over Q8_0's activations per 32 (r8_ir32.py has their layouts).

Q4_K: rows 8g .. 8g + 7 are group g, one array row of `units` group blocks (1,184 bytes for the eight
rows' 1,152): d[8] and dmin[8] (float16), the 6-bit scales decoded to bytes as scales[j][r] (sub-block
j, row r), the mins as pairs[q][r] = (m_2q, m_2q+1), and the 128 code bytes of each row as
codes[p][g][r][4] = row r's bytes 32p + 4g .. 32p + 4g + 3 (low nibbles: sub-block 2p, high: 2p + 1),
so that one 32-byte load holds four codes of all eight rows; 2.8% more bytes than the file's, the
scales decoded instead of packed 6 bits a value.
Q6_K (1,680 bytes, the rows' own): d[8], the int8 scales as pairs[q][r] = (s_2q, s_2q+1), then for
t = 0..15 three 32-byte registers, read in order: low nibbles t and t + 16 (register u, row r: the four
codes 4u.. in its low nibbles, 128 + 4u.. in its high ones) and the top two bits of codes 4t..,
64 + 4t.., 128 + 4t.., 192 + 4t.. (at bits 0, 2, 4, 6)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .int8_ir import HAS_AVX2
from .kblock_ir import BLOCK_BYTES, HAS_FMA
from .r8_ir import GROUP_BYTES as K_GROUP_BYTES, Q4_K, Q6_K, ROWS, emit_group_dots
from .r8_ir32 import GROUP_BYTES as GROUP_BYTES32, Q5_0, Q8_0, emit_group_dots32
from .vector_intrinsics import _rows_switch

AVAILABLE = HAS_AVX2 and HAS_FMA  # the product's CPUs (x86 with AVX2 and FMA)
MAX_ROWS = 4  # input rows a call
QTYPE = 1012  # the repacked layouts' type codes in a fused step's segments (not GGUF types): Q4_K's
Q6_K_QTYPE = 1014  # Q6_K's
Q5_0_QTYPE, Q8_0_QTYPE = 1006, 1008  # Q5_0's and Q8_0's
REPACKED = {Q4_K: QTYPE, Q6_K: Q6_K_QTYPE, Q5_0: Q5_0_QTYPE, Q8_0: Q8_0_QTYPE}  # the fused step's
R8_TYPES = (Q4_K, Q6_K, Q5_0, Q8_0)  # what `repack` lays out (r8_layers reads them all)
GROUP_BYTES = {**K_GROUP_BYTES, **GROUP_BYTES32}
FILE_BYTES = {**BLOCK_BYTES, Q5_0: 22, Q8_0: 34}  # a block's bytes in the file
VALUES = {Q4_K: 256, Q6_K: 256, Q5_0: 32, Q8_0: 32}  # a block's values


def _scale_min(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's packed 12 bytes (..., 12) -> 6-bit scales and mins (..., 8) (llama.cpp's get_scale_min_k4)."""
    q = q.astype(np.uint8)
    sc, m = np.empty(q.shape[:-1] + (8,), np.uint8), np.empty(q.shape[:-1] + (8,), np.uint8)
    sc[..., :4], m[..., :4] = q[..., 0:4] & 63, q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    m[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc, m


def _groups(blocks: np.ndarray, qtype: int) -> np.ndarray:
    """(N, units * block bytes) -> (N / 8, units, 8 rows, block bytes), N a multiple of 8."""
    n, width = blocks.shape
    if n % ROWS or width % FILE_BYTES[qtype]:
        raise ValueError(f"rows of {n} x {width} bytes do not make whole groups of {ROWS}")
    units = width // FILE_BYTES[qtype]
    return np.asarray(blocks, np.uint8).reshape(n // ROWS, ROWS, units, FILE_BYTES[qtype]).transpose(0, 2, 1, 3)


def _q4_k(b: np.ndarray) -> list:
    groups, units = b.shape[:2]
    shape = (groups, units)
    sc, m = _scale_min(b[..., 4:16])  # (G, units, rows, 8)
    return [
        b[..., 0:2].reshape(*shape, 16), b[..., 2:4].reshape(*shape, 16),
        sc.transpose(0, 1, 3, 2).reshape(*shape, 64),
        m.reshape(groups, units, ROWS, 4, 2).transpose(0, 1, 3, 2, 4).reshape(*shape, 64),
        b[..., 16:].reshape(groups, units, ROWS, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5).reshape(*shape, 1024),
    ]


def q6_k_codes(b: np.ndarray) -> np.ndarray:
    """Q6_K blocks (..., 210) -> their 256 codes (..., 256), 0-63 (the bias of 32 not taken), in weight order."""
    ql, qh = b[..., 0:128], b[..., 128:192]
    codes = np.empty(b.shape[:-1] + (256,), np.uint8)
    for h in range(2):
        lo, lo2, hi = ql[..., 64 * h: 64 * h + 32], ql[..., 64 * h + 32: 64 * h + 64], qh[..., 32 * h: 32 * h + 32]
        w = 128 * h
        codes[..., w: w + 32] = (lo & 15) | ((hi & 3) << 4)
        codes[..., w + 32: w + 64] = (lo2 & 15) | (((hi >> 2) & 3) << 4)
        codes[..., w + 64: w + 96] = (lo >> 4) | (((hi >> 4) & 3) << 4)
        codes[..., w + 96: w + 128] = (lo2 >> 4) | (((hi >> 6) & 3) << 4)
    return codes


def _q6_k(b: np.ndarray) -> list:
    groups, units = b.shape[:2]
    shape = (groups, units)
    codes = q6_k_codes(b).reshape(groups, units, ROWS, 64, 4)  # [code group c][4]: weights 4c .. 4c + 3
    low = (codes[:, :, :, :32] & 15) | ((codes[:, :, :, 32:] & 15) << 4)  # register t: groups t and t + 32
    top = codes >> 4
    high = top[:, :, :, 0:16] | (top[:, :, :, 16:32] << 2) | (top[:, :, :, 32:48] << 4) | (top[:, :, :, 48:64] << 6)
    low, high = low.transpose(0, 1, 3, 2, 4), high.astype(np.uint8).transpose(0, 1, 3, 2, 4)  # [register][row][4]
    codes = np.stack([low[:, :, :16], low[:, :, 16:], high], axis=3)  # per t: low t, low t + 16, high t
    return [
        b[..., 208:210].reshape(*shape, 16),
        b[..., 192:208].reshape(groups, units, ROWS, 8, 2).transpose(0, 1, 3, 2, 4).reshape(*shape, 128),
        codes.reshape(*shape, 1536),
    ]


def _q8_0(b: np.ndarray) -> list:
    groups, units = b.shape[:2]
    codes = b[..., 2:34].reshape(groups, units, ROWS, 8, 4).transpose(0, 1, 3, 2, 4)  # [register m][row][4]
    return [b[..., 0:2].reshape(groups, units, 16), codes.reshape(groups, units, 256)]


def _q5_0(b: np.ndarray) -> list:
    groups, units = b.shape[:2]
    nibbles = b[..., 6:22].reshape(groups, units, ROWS, 4, 4).transpose(0, 1, 3, 2, 4)  # [register p][row][4]
    bits = np.unpackbits(np.ascontiguousarray(b[..., 2:6]), axis=-1, bitorder="little")  # bit j: code j's fifth
    high = (bits.reshape(groups, units, ROWS, 8, 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=3)
    return [b[..., 0:2].reshape(groups, units, 16), nibbles.reshape(groups, units, 128),
            high.astype(np.uint8).reshape(groups, units, 32)]


def repack(blocks: np.ndarray, qtype: int = Q4_K) -> np.ndarray:
    """Q4_K, Q6_K, Q5_0 or Q8_0 blocks (N, units * block bytes), N a multiple of 8 -> (N / 8, units *
    GROUP_BYTES[qtype]) (r8_ir's and r8_ir32's layouts)."""
    b = _groups(blocks, qtype)
    parts = {Q4_K: _q4_k, Q6_K: _q6_k, Q5_0: _q5_0, Q8_0: _q8_0}[qtype](b)
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(b.shape[0], b.shape[1] * GROUP_BYTES[qtype]))


def repacked_types(model) -> tuple:
    """The GGUF types whose rows are read repacked on this CPU, whatever the `model` (R8_TYPES: by the fused
    decode step for a llama or qwen2, arch.llama_like, by the block layers' products for the others,
    r8_layers): the loader leaves them unfused (gguf_blocks.fuse_layers' `keep`), so each repacked matrix
    is a copy of file pages that can leave memory, not of an in-memory fused one."""
    return R8_TYPES if AVAILABLE else ()


def _group_dot_of(qtype: int, emit_dots=emit_group_dots):
    """The intrinsic of qtype's groups: `dot(raw, g, xq, xd, xs, b, count, out, col, units)`."""

    @intrinsic
    def dot(typingctx, raw, g, xq, xd, xs, b, count, out, col, units):
        """out[b + i, col + 8g .. col + 8g + 8] = input row b + i . group g's rows, i < count (1..MAX_ROWS)."""
        if not all(a.layout == "C" for a in (raw, xq, xd, xs, out)):
            return None

        def codegen(context, builder, signature, args):
            raw_a, xq_a, xd_a, xs_a, out_a = (context.make_array(signature.args[i])(context, builder, args[i])
                                              for i in (0, 2, 3, 4, 7))
            g, b, count, col, units = args[1], args[5], args[6], args[8], args[9]
            width = lambda a: cgutils.unpack_tuple(builder, a.shape, 2)[1]  # noqa: E731
            group = builder.gep(raw_a.data, [builder.mul(g, width(raw_a))])

            def emit(rows):
                firsts = [builder.add(b, ir.Constant(b.type, r)) for r in range(rows)]
                ptrs = [[builder.gep(a.data, [builder.mul(f, width(a))]) for f in firsts] for a in (xq_a, xd_a, xs_a)]
                for f, value in zip(firsts, emit_dots(builder, qtype, group, *ptrs, units)):
                    at = builder.add(builder.mul(f, width(out_a)), builder.add(col, builder.mul(g, ir.Constant(g.type, ROWS))))
                    ptr = builder.bitcast(builder.gep(out_a.data, [at]), value.type.as_pointer())
                    builder.store(value, ptr, align=4)

            return _rows_switch(context, builder, count, emit, MAX_ROWS)

        return types.void(raw, g, xq, xd, xs, b, count, out, col, units), codegen

    return dot


_dot_q4_k, _dot_q6_k = _group_dot_of(Q4_K), _group_dot_of(Q6_K)
_dot_q5_0, _dot_q8_0 = _group_dot_of(Q5_0, emit_group_dots32), _group_dot_of(Q8_0, emit_group_dots32)


@njit(cache=True, nogil=True, inline="always")
def r8_rows(qtype, raw, g0, g1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    """out[:, col + 8 * g0 .. col + 8 * g1] = the input rows . groups g0..g1 of the rows raw repacked
    from qtype (Q4_K or Q6_K over kblock's activations; Q5_0 or Q8_0 over kernels.quantize_rows_q8's;
    each type or its REPACKED code, the fused step's name for it)."""
    count = xq.shape[0]
    if qtype == Q4_K or qtype == QTYPE:
        for g in range(g0, g1):
            for b in range(0, count, MAX_ROWS):
                _dot_q4_k(raw, g, xq, xd, xs, b, min(MAX_ROWS, count - b), out, col, units)
    elif qtype == Q5_0 or qtype == Q5_0_QTYPE:
        for g in range(g0, g1):
            for b in range(0, count, MAX_ROWS):
                _dot_q5_0(raw, g, xq, xd, xs, b, min(MAX_ROWS, count - b), out, col, units)
    elif qtype == Q8_0 or qtype == Q8_0_QTYPE:
        for g in range(g0, g1):
            for b in range(0, count, MAX_ROWS):
                _dot_q8_0(raw, g, xq, xd, xs, b, min(MAX_ROWS, count - b), out, col, units)
    else:
        for g in range(g0, g1):
            for b in range(0, count, MAX_ROWS):
                _dot_q6_k(raw, g, xq, xd, xs, b, min(MAX_ROWS, count - b), out, col, units)


@njit(cache=True, nogil=True, parallel=True)
def stream_r8(qtype, xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """out (B, 8 * G) from quantize_rows_q8k's rows and the rows raw (G, units * GROUP_BYTES) repacked
    from qtype, the groups split over the threads."""
    groups = raw.shape[0]
    for t in prange(threads):
        r8_rows(qtype, raw, t * groups // threads, (t + 1) * groups // threads, xq, xd, xs, out, 0, units)


__all__ = ["AVAILABLE", "BLOCK_BYTES", "FILE_BYTES", "GROUP_BYTES", "Q4_K", "Q5_0", "Q6_K", "Q8_0", "QTYPE",
           "Q6_K_QTYPE", "Q5_0_QTYPE", "Q8_0_QTYPE", "R8_TYPES", "REPACKED", "ROWS", "VALUES",
           "q6_k_codes", "repack", "repacked_types", "r8_rows", "stream_r8"]
