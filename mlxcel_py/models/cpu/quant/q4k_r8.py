"""Q4_K weights repacked eight rows at a time, and their products (r8_ir.py) over kblock's
activations (quantize_rows_q8k: int8 codes, a scale per 256, int16 code sums per 16).

Layout: rows 8g .. 8g + 7 are group g, one array row of `units` group blocks (GROUP_BLOCK_BYTES,
1,184 bytes for the eight rows' 1,152 of Q4_K): d[8] and dmin[8] (float16), the 6-bit scales
decoded to bytes as scales[j][r] (sub-block j, row r), the mins as pairs[q][r] = (m_2q, m_2q+1), and
the 128 code bytes of each row as codes[p][g][r][4] = row r's bytes 32p + 4g .. 32p + 4g + 3 (low
nibbles: sub-block 2p, high: 2p + 1), so that one 32-byte load holds four codes of all eight rows.
The bytes are 2.8% more than the file's: the scales decoded instead of packed 6 bits a value."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .int8_ir import HAS_AVX2
from .kblock_ir import HAS_FMA
from .r8_ir import GROUP_BLOCK_BYTES, ROWS, emit_group_dots
from .vector_intrinsics import _rows_switch

AVAILABLE = HAS_AVX2 and HAS_FMA  # the product's CPUs (x86 with AVX2 and FMA)
Q4_K, Q4_K_BLOCK = 12, 144
MAX_ROWS = 4  # input rows a call
QTYPE = 1012  # the repacked layout's type code in a fused step's segments (not a GGUF type)


def _scale_min(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's packed 12 bytes (..., 12) -> 6-bit scales and mins (..., 8) (llama.cpp's get_scale_min_k4)."""
    q = q.astype(np.uint8)
    sc, m = np.empty(q.shape[:-1] + (8,), np.uint8), np.empty(q.shape[:-1] + (8,), np.uint8)
    sc[..., :4], m[..., :4] = q[..., 0:4] & 63, q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    m[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc, m


def repack(blocks: np.ndarray) -> np.ndarray:
    """Q4_K blocks (N, units * 144), N a multiple of 8 -> (N / 8, units * GROUP_BLOCK_BYTES)."""
    n, width = blocks.shape
    if n % ROWS or width % Q4_K_BLOCK:
        raise ValueError(f"Q4_K rows ({n} x {width} bytes) do not make whole groups of {ROWS}")
    units = width // Q4_K_BLOCK
    b = np.asarray(blocks, np.uint8).reshape(n // ROWS, ROWS, units, Q4_K_BLOCK).transpose(0, 2, 1, 3)
    groups, shape = n // ROWS, (n // ROWS, units)
    sc, m = _scale_min(b[..., 4:16])  # (G, units, rows, 8)
    parts = [
        b[..., 0:2].reshape(*shape, 16), b[..., 2:4].reshape(*shape, 16),
        sc.transpose(0, 1, 3, 2).reshape(*shape, 64),
        m.reshape(groups, units, ROWS, 4, 2).transpose(0, 1, 3, 2, 4).reshape(*shape, 64),
        b[..., 16:].reshape(groups, units, ROWS, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5).reshape(*shape, 1024),
    ]
    return np.ascontiguousarray(np.concatenate(parts, axis=-1).reshape(groups, units * GROUP_BLOCK_BYTES))


def repacked_types(model) -> tuple:
    """The GGUF types whose rows the fused decode step reads repacked on this CPU for `model` (a llama
    or qwen2: arch.llama_like): the loader leaves them unfused (gguf_blocks.fuse_layers' `keep`), so
    each repacked matrix is a copy of file pages that can leave memory, not of an in-memory fused one."""
    from ..arch import llama_like

    return (Q4_K,) if AVAILABLE and llama_like(model) else ()


@intrinsic
def _group_dot(typingctx, raw, g, xq, xd, xs, b, count, out, col, units):
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
            for f, value in zip(firsts, emit_group_dots(builder, group, *ptrs, units)):
                at = builder.add(builder.mul(f, width(out_a)), builder.add(col, builder.mul(g, ir.Constant(g.type, ROWS))))
                ptr = builder.bitcast(builder.gep(out_a.data, [at]), value.type.as_pointer())
                builder.store(value, ptr, align=4)

        return _rows_switch(context, builder, count, emit, MAX_ROWS)

    return types.void(raw, g, xq, xd, xs, b, count, out, col, units), codegen


@njit(cache=True, nogil=True, inline="always")
def r8_rows(raw, g0, g1, xq, xd, xs, out, col, units):  # pragma: no cover - jitted
    """out[:, col + 8 * g0 .. col + 8 * g1] = the input rows . groups g0..g1 of the repacked rows raw."""
    count = xq.shape[0]
    for g in range(g0, g1):
        for b in range(0, count, MAX_ROWS):
            _group_dot(raw, g, xq, xd, xs, b, min(MAX_ROWS, count - b), out, col, units)


@njit(cache=True, nogil=True, parallel=True)
def stream_r8(xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """out (B, 8 * G) from quantize_rows_q8k's rows and the repacked rows raw (G, units * 1184),
    the groups split over the threads."""
    groups = raw.shape[0]
    for t in prange(threads):
        r8_rows(raw, t * groups // threads, (t + 1) * groups // threads, xq, xd, xs, out, 0, units)


__all__ = ["AVAILABLE", "GROUP_BLOCK_BYTES", "Q4_K", "QTYPE", "ROWS", "repack", "repacked_types", "r8_rows", "stream_r8"]
