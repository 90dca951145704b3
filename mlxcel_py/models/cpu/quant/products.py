"""x @ W.T for float32 x and a QuantWeight W: the decode kernels' Python entry points.

`linear` uses the candidate measured fastest for W's type on this CPU (`chosen`,
docs/QUANT_KERNELS.md): d (`linear_int8_vector`) where AVX2 runs it (not F16/BF16: no codes), else c (`linear_vector`),
for the types they read; a (`linear_float`) for the rest. Each `linear_*` forces one. A verify's
products of 5 or more input rows go to span.linear (one unpack per 8 rows, docs/SPECULATIVE.md)."""

from __future__ import annotations

import numba
import numpy as np
from gguf.constants import GGMLQuantizationType as T

from . import int8_ir, kblock, kernels, span, vector
from .float_ir import FLOAT_UNITS
from .blocks import BLOCK_TYPES, QuantWeight
from .unpack import LANES
from .vector_ir import UNITS

FLOAT, INT8, VECTOR, INT8_VECTOR = "float", "int8", "vector", "int8v"


def chosen(qtype: T) -> str:
    """The candidate `linear` runs for `qtype` here (the winner of python -m bench quant-kernels)."""
    if int(qtype) in vector.VECTOR_TYPES:
        return INT8_VECTOR if int8_ir.HAS_AVX2 else VECTOR
    return VECTOR if int(qtype) in FLOAT_UNITS else FLOAT


def _vector_reads(qtype, columns: int) -> bool:
    """The vector IR reads whole units of 32 (F16/BF16 rows need not be whole ones)."""
    return int(qtype) in UNITS and columns % UNITS[int(qtype)][0] == 0


def _threads(threads: int | None) -> int:
    return numba.get_num_threads() if threads is None else max(1, int(threads))


def _out(x: np.ndarray, w: QuantWeight, out: np.ndarray | None) -> np.ndarray:
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x of shape {x.shape} does not multiply a weight of shape {w.shape}")
    return np.empty((x.shape[0], w.shape[0]), np.float32) if out is None else out


def dequantize(w: QuantWeight, threads: int | None = None) -> np.ndarray:
    """The whole weight as float32 (rows, columns), equal to gguf.quants.dequantize."""
    out = np.empty(w.shape, np.float32)
    dequantize_into(w.blocks, w.qtype, out, _threads(threads))
    return out


def dequantize_into(raw: np.ndarray, qtype: T, out: np.ndarray, threads: int) -> None:
    """Rows of blocks `raw` -> out (float32, C-contiguous), exactly; the vector IR where it reads
    the type (1.8-9x faster than the numba unpackers, docs/QUANT_KERNELS.md), else kernels.dequant_rows."""
    if _vector_reads(qtype, out.shape[1]):
        vector.dequant_rows(int(qtype), np.ascontiguousarray(raw), out, threads, out.shape[1] // UNITS[int(qtype)][0])
    else:
        kernels.dequant_rows(int(qtype), raw, out, threads, LANES)


def dequantize_serial(raw: np.ndarray, qtype: T, out: np.ndarray) -> None:
    """dequantize_into on the calling thread alone (numba's pool stays asleep: prefill.matmul_tiled)."""
    if _vector_reads(qtype, out.shape[1]):
        vector.dequant_rows_serial(int(qtype), np.ascontiguousarray(raw), out, out.shape[1] // UNITS[int(qtype)][0])
    else:
        kernels.dequant_rows_serial(int(qtype), raw, out, LANES)


def linear_float(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """Candidate a: each weight row dequantized once into L1, float FMA dot products."""
    out = _out(x, w, out)
    x = np.ascontiguousarray(x, dtype=np.float32)
    kernels.stream_float(int(w.qtype), x, w.blocks, out, _threads(threads), LANES)
    return out


def linear_vector(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """Candidate c: candidate a's float FMA with every block loop as explicit LLVM vectors
    (vector.VECTOR_TYPES only)."""
    if not _vector_reads(w.qtype, w.shape[1]):
        raise ValueError(f"the vector kernel does not read {w.qtype.name} rows of {w.shape[1]}")
    out = _out(x, w, out)
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array")
    x = np.ascontiguousarray(x, dtype=np.float32)
    units = w.shape[1] // UNITS[int(w.qtype)][0]
    vector.stream_vector(int(w.qtype), x, np.ascontiguousarray(w.blocks), out, _threads(threads), units)
    return out


def linear_int8_vector(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """Candidate d: candidate b (x as int8 per 32) with AVX2's vpmaddubsw/vpmaddwd (int8_ir); Q4_K and
    Q6_K with x as int8 per 256, summed in integers over each super-block (kblock.py)."""
    if int(w.qtype) not in vector.VECTOR_TYPES or not int8_ir.HAS_AVX2:
        raise ValueError(f"the int8 vector kernel does not read {w.qtype.name} on this CPU")
    out = _out(x, w, out)
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array")
    units = w.shape[1] // UNITS[int(w.qtype)][0]
    if int(w.qtype) in kblock.KBLOCK_TYPES:  # Q4_K, Q6_K: the input per 256, as the fused step reads them
        kq, kd, ks = kblock.quantize(x)
        kblock.stream_kblock(int(w.qtype), kq, kd, ks, np.ascontiguousarray(w.blocks), out, _threads(threads), units)
        return out
    xq, xd, xs = vector.quantize_x(np.ascontiguousarray(x, dtype=np.float32))
    vector.stream_int8(int(w.qtype), xq, xd, xs, np.ascontiguousarray(w.blocks), out, _threads(threads), units)
    return out


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (B, K) float32 -> (codes int8 (B, K), scales float32 (B, K/32), code sums int32 (B, K/16))."""
    rows, k = x.shape
    xq, xd, xsum = np.empty((rows, k), np.int8), np.empty((rows, k // 32), np.float32), np.empty((rows, k // 16), np.int32)
    kernels.quantize_rows_q8(np.ascontiguousarray(x, dtype=np.float32), xq, xd, xsum)
    return xq, xd, xsum


def linear_int8(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """Candidate b: x quantized to int8 per 32 values (Q8_0), integer dot products per 16."""
    if w.qtype not in BLOCK_TYPES:
        raise ValueError(f"the int8 kernel reads block types only, not {w.qtype.name}")
    out = _out(x, w, out)
    xq, xd, xsum = quantize_activations(x)
    kernels.stream_int8(int(w.qtype), xq, xd, xsum, w.blocks, out, _threads(threads), LANES)
    return out


def linear_float_activations(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """x @ W.T with x kept in float32: candidate c where the vector IR reads W, else a."""
    return (linear_vector if _vector_reads(w.qtype, w.shape[1]) else linear_float)(x, w, out, threads)


def linear(x: np.ndarray, w: QuantWeight, out=None, threads: int | None = None) -> np.ndarray:
    """x @ W.T (B, N) float32 with the candidate chosen for W's type."""
    if span.reads(w.qtype, x.shape[0]):
        return span.linear(x, w, _out(x, w, out), _threads(threads))
    kind = chosen(w.qtype) if _vector_reads(w.qtype, w.shape[1]) or int(w.qtype) not in UNITS else FLOAT
    fn = {INT8_VECTOR: linear_int8_vector, VECTOR: linear_vector, INT8: linear_int8}.get(kind, linear_float)
    return fn(x, w, out, threads)
