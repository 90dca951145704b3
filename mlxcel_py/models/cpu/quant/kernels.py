"""Products y = x @ W.T over quantized rows (numba), for decode's 1-8 input rows.

Both candidates unpack each weight row once per product (unpack.unpack_row: int8 codes plus
a scale and an offset per 16 weights) into per-thread scratch that stays in L1, then:

* `float` (candidate a): the row is dequantized to float32 scratch (scale * code + offset)
  and every input row takes its dot product with it, 4 input rows at a time (FMA).
* `int8` (candidate b, llama.cpp's way): each input row is quantized once per product to
  int8 per 32 values (Q8_0's rule: d = max|x| / 127, q = round(x / d)), and each group of 16
  takes an integer dot product: y += d_x * (scale * sum(code * q) + offset * sum(q)).

Output rows are split over numba's threads in contiguous ranges (each output computed whole
by one thread, so the thread count changes no bit), as decode_kernels._stream does.
`threads` comes from the caller: numba.get_num_threads() inside a kernel defeats its cache."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .quantize_ir import absmax16, codes16
from .unpack import BF16, F16, F32, f16, unpack_row


@njit(cache=True, nogil=True)
def dequant_row(qtype, r, out, codes, scale, offset, lanes):  # pragma: no cover - jitted
    """One row to float32, bit-equal to gguf.quants.dequantize (no fastmath: no FMA contraction)."""
    k = out.shape[0]
    if qtype == F16 or qtype == BF16 or qtype == F32:
        for i in range(k):
            if qtype == F16:
                out[i] = f16(r, 2 * i)
            elif qtype == BF16:
                out[i] = (np.uint32((np.uint32(r[2 * i]) | (np.uint32(r[2 * i + 1]) << 8)) << 16)).view(np.float32)
            else:
                out[i] = r[4 * i : 4 * i + 4].view(np.float32)[0]
        return
    unpack_row(qtype, r, codes, scale, offset, lanes)
    for c in range(k // 32):  # 32 at a time where both groups share a scale (vectorizes well)
        s, o = scale[2 * c], offset[2 * c]
        if s == scale[2 * c + 1] and o == offset[2 * c + 1]:
            for i in range(2 * lanes):
                out[c * 32 + i] = s * np.float32(codes[c * 32 + i]) + o
        else:
            for g in range(2 * c, 2 * c + 2):
                s, o = scale[g], offset[g]
                for i in range(lanes):
                    out[g * 16 + i] = s * np.float32(codes[g * 16 + i]) + o


@njit(cache=True, nogil=True, parallel=True)
def dequant_rows(qtype, raw, out, threads, lanes):  # pragma: no cover - jitted
    """raw (N, row bytes) -> out (N, K) float32, rows split over the threads."""
    n_rows, k = out.shape
    for t in prange(threads):
        codes, scale, offset = np.empty(k, np.int8), np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            dequant_row(qtype, raw[n], out[n], codes, scale, offset, lanes)


@njit(cache=True, nogil=True)
def dequant_rows_serial(qtype, raw, out, lanes):  # pragma: no cover - jitted
    """dequant_rows on the calling thread (prefill's tiles: see vector.dequant_rows_serial)."""
    k = out.shape[1]
    codes, scale, offset = np.empty(k, np.int8), np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
    for n in range(raw.shape[0]):
        dequant_row(qtype, raw[n], out[n], codes, scale, offset, lanes)


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _dots(x, w, out, n):  # pragma: no cover - jitted
    """out[:, n] = x @ w for one float32 weight row w, 4 input rows per pass."""
    rows, k = x.shape
    rows4 = rows - rows % 4
    for b in range(0, rows4, 4):
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for i in range(k):
            wv = w[i]
            a0 += x[b, i] * wv
            a1 += x[b + 1, i] * wv
            a2 += x[b + 2, i] * wv
            a3 += x[b + 3, i] * wv
        out[b, n], out[b + 1, n], out[b + 2, n], out[b + 3, n] = a0, a1, a2, a3
    for b in range(rows4, rows):
        acc = np.float32(0.0)
        for i in range(k):
            acc += x[b, i] * w[i]
        out[b, n] = acc


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_float(qtype, x, raw, out, threads, lanes):  # pragma: no cover - jitted
    """Candidate a: out (B, N) = x (B, K) @ W.T, each W row dequantized once into L1."""
    n_rows, k = raw.shape[0], x.shape[1]
    for t in prange(threads):
        codes, scale, offset = np.empty(k, np.int8), np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
        w = np.empty(k, np.float32)
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            dequant_row(qtype, raw[n], w, codes, scale, offset, lanes)
            _dots(x, w, out, n)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def quantize_groups(x, xq, xd, xsum, group):  # pragma: no cover - jitted
    """x (B, K) -> int8 codes xq (B, K), a scale per `group` values xd (B, K/group) and code sums per 16
    xsum (B, K/16): d = max|x| / 127, q = round half away from 0 of x / d, so |q| <= 127. Sixteen
    values a call of quantize_ir's vectors, each the scalar rule's bits (a numpy reference computes
    the same codes)."""
    for b in range(x.shape[0]):
        for j in range(x.shape[1] // group):
            amax = np.float32(0.0)
            for g in range(group // 16):
                m = absmax16(x, b, j * group + g * 16)
                amax = m if m > amax else amax
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            xd[b, j] = d
            for g in range(group // 16):
                xsum[b, j * (group // 16) + g] = codes16(x, b, j * group + g * 16, inv, xq)


@njit(cache=True, nogil=True, error_model="numpy")
def quantize_rows_q8(x, xq, xd, xsum):  # pragma: no cover - jitted
    """x (B, K) -> int8 codes xq (B, K), scales xd (B, K/32), code sums xsum (B, K/16) (int32):
    Q8_0's rule (ggml's quantize_row_q8_0_ref), `quantize_groups` per 32 values."""
    quantize_groups(x, xq, xd, xsum, 32)


@njit(fastmath=True, cache=True, nogil=True, parallel=True)
def stream_int8(qtype, xq, xd, xsum, raw, out, threads, lanes):  # pragma: no cover - jitted
    """Candidate b: out (B, N) from the int8 activations of quantize_rows_q8 and W's codes."""
    n_rows, k = raw.shape[0], xq.shape[1]
    rows = xq.shape[0]
    for t in prange(threads):
        codes, scale, offset = np.empty(k, np.int8), np.empty(k // 16, np.float32), np.empty(k // 16, np.float32)
        for n in range(t * n_rows // threads, (t + 1) * n_rows // threads):
            unpack_row(qtype, raw[n], codes, scale, offset, lanes)
            for b in range(rows):
                acc = np.float32(0.0)
                for g in range(k // 16):
                    dot = np.int32(0)
                    for i in range(lanes):
                        dot += np.int32(codes[g * 16 + i]) * np.int32(xq[b, g * 16 + i])
                    acc += xd[b, g >> 1] * (scale[g] * np.float32(dot) + offset[g] * np.float32(xsum[b, g]))
                out[b, n] = acc
