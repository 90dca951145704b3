"""Products for a verify's span of input rows (5-17 rows: 1 + a draft per decode row) over GGUF blocks.

`vector.stream_int8` unpacks a weight row once per 4 input rows, so a 5-row product unpacks
every weight twice and a 17-row one 5 times. Here one intrinsic call takes a weight row against
up to XROWS (8) input rows in one pass (int8_ir.emit_dots: the codes unpacked once, each input
row its own accumulator), in balanced passes (9 rows: 5 + 4, not 8 + 1). Tiles of 2 weight rows
(2x3, 2x4, 2x8) and 1x6 measured no better (docs/SPECULATIVE.md). The arithmetic per pair is
emit_dots', as in `vector.stream_int8`: sums agree with it to float rounding (Q8_0 bit for bit;
the types with an offset or a bias to 1e-6 of the largest, LLVM fusing their FMAs otherwise;
tested), so a verify's logits are plain decoding's. AVX2 only (int8_ir.HAS_AVX2)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import int8_ir
from .kblock import KBLOCK_TYPES
from .unpack import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0
from .vector import quantize_x
from .vector_intrinsics import _contiguous, _emit_rows
from .vector_ir import UNITS

XROWS = 8  # most input rows per pass
MIN_ROWS = 5  # products of fewer input rows stay on vector.stream_int8 (measured: docs/SPECULATIVE.md)
# the types `_tile` has; others stay on stream_int8 (Q4_K and Q6_K on kblock's product where it runs,
# whose sums a verify must share with decoding)
SPAN_TYPES = tuple(int(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) if int(t) not in KBLOCK_TYPES)


def _codegen(qtype):
    """IR of `tile(raw, n, xq, xd, xs, b, count, out, units)`: out[b:b+count, n] from weight row n
    and input rows b..b+count (count 1..XROWS), as vector's d call on raw[n]."""

    def codegen(context, builder, signature, args):
        raw, xq, xd, xs, out = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 2, 3, 4, 7))
        n = args[1]
        row = builder.gep(raw.data, [builder.mul(n, cgutils.unpack_tuple(builder, raw.shape, 2)[1])])
        return _emit_rows(context, builder, qtype, True, row, (xq, xd, xs), out, args[5], args[6], n, args[8], XROWS)

    return codegen


def _tile_intrinsic(qtype):
    @intrinsic
    def tile(typingctx, raw, n, xq, xd, xs, b, count, out, units):
        if _contiguous(raw, xq, xd, xs, out):
            return types.void(raw, n, xq, xd, xs, b, count, out, units), _codegen(qtype)

    return tile


_t_q4_0, _t_q4_1, _t_q8_0, _t_q4_k, _t_q6_k = (_tile_intrinsic(t) for t in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K))


@njit(cache=True, nogil=True, inline="always")
def _tile(qtype, raw, n, xq, xd, xs, b, count, out, units):  # pragma: no cover - jitted
    if qtype == Q4_0:
        _t_q4_0(raw, n, xq, xd, xs, b, count, out, units)
    elif qtype == Q4_1:
        _t_q4_1(raw, n, xq, xd, xs, b, count, out, units)
    elif qtype == Q8_0:
        _t_q8_0(raw, n, xq, xd, xs, b, count, out, units)
    elif qtype == Q4_K:
        _t_q4_k(raw, n, xq, xd, xs, b, count, out, units)
    elif qtype == Q6_K:
        _t_q6_k(raw, n, xq, xd, xs, b, count, out, units)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_span(qtype, xq, xd, xs, raw, out, threads, units):  # pragma: no cover - jitted
    """out (B, N) from quantize_x's rows and W's blocks raw (N, row bytes): each weight row against
    the input rows in balanced passes of at most XROWS."""
    n_rows, rows = raw.shape[0], xq.shape[0]
    passes = (rows + XROWS - 1) // XROWS
    size = (rows + passes - 1) // passes
    for t in prange(threads):
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            for b in range(0, rows, size):
                _tile(qtype, raw, n, xq, xd, xs, b, min(size, rows - b), out, units)


def reads(qtype, rows: int) -> bool:
    """Whether `linear` should take a product of `rows` input rows over a weight of `qtype`."""
    return rows >= MIN_ROWS and int(qtype) in SPAN_TYPES and int8_ir.HAS_AVX2


def linear(x: np.ndarray, w, out: np.ndarray, threads: int) -> np.ndarray:
    """x (B, K) float32 @ W.T into out (B, N) float32, C-contiguous (products.linear checks the shapes)."""
    if int(w.qtype) not in SPAN_TYPES or not int8_ir.HAS_AVX2:
        raise ValueError(f"the span kernel does not read {w.qtype.name} on this CPU")
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array")
    xq, xd, xs = quantize_x(np.ascontiguousarray(x, dtype=np.float32))
    units = w.shape[1] // UNITS[int(w.qtype)][0]
    stream_span(int(w.qtype), xq, xd, xs, np.ascontiguousarray(w.blocks), out, threads, units)
    return out
