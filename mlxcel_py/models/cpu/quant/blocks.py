"""Quantized weights held as their GGUF blocks: a record over a view of the file's bytes.

A `QuantWeight` keeps the tensor's raw blocks as a (rows, bytes per row) uint8 array: for a
tensor from `read_gguf` (or the `gguf` package's GGUFReader) that is a view of the memory-mapped
file, so the weight costs page cache, not a float32 copy. Kernels read it in place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ....errors import ModelLoadError
from . import unpack

# Types the kernels read natively; BLOCK_TYPES go through unpack.unpack_row.
BLOCK_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
NATIVE_TYPES = BLOCK_TYPES + FLOAT_TYPES
assert all(int(t) == getattr(unpack, t.name) for t in NATIVE_TYPES)  # kernel codes are ggml's ids


@dataclass(frozen=True, slots=True)
class QuantWeight:
    """A 2-D weight (out_features, in_features) in a GGUF type, as its blocks."""

    qtype: T
    shape: tuple[int, int]  # (rows, columns) in numpy order: y = x @ W.T has `rows` outputs
    blocks: np.ndarray  # uint8 (rows, bytes per row), usually a view of the mapped file

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / (self.shape[0] * self.shape[1])


def row_bytes(qtype: T, columns: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return columns // block * size


def make(qtype: T, shape: tuple[int, ...], data: np.ndarray, name: str = "tensor") -> QuantWeight:
    """A QuantWeight over `data` (the tensor's bytes, any shape; viewed, not copied, when C-contiguous).

    `shape` is numpy order (rows first); leading axes are folded into rows. Raises
    ModelLoadError for types the kernels do not read or rows that are not whole 16-wide groups."""
    qtype = T(qtype)
    if qtype not in NATIVE_TYPES:
        supported = ", ".join(t.name for t in NATIVE_TYPES)
        raise ModelLoadError(f"{name}: GGUF type {qtype.name} has no native CPU kernel (supported: {supported})")
    columns = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if columns % max(16, GGML_QUANT_SIZES[qtype][0]):
        raise ModelLoadError(f"{name}: row of {columns} is not whole {qtype.name} blocks of 16-wide groups")
    raw = np.asarray(data)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8) if raw.flags.c_contiguous else np.ascontiguousarray(raw).view(np.uint8)
    per_row = row_bytes(qtype, columns)
    if raw.size != rows * per_row:
        raise ModelLoadError(f"{name}: {raw.size} bytes for a {qtype.name} tensor of {rows}x{columns} ({rows * per_row} expected)")
    return QuantWeight(qtype, (rows, columns), raw.reshape(rows, per_row))


def from_tensor_info(info) -> QuantWeight:
    """From models.gguf_file.TensorInfo (read_gguf's memory-mapped tensors)."""
    return make(info.qtype, info.shape, info.data, info.name)


def from_reader_tensor(tensor) -> QuantWeight:
    """From a gguf.GGUFReader tensor (`tensor.data` is a memmap view; its shape is ggml's reversed)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return make(tensor.tensor_type, shape, tensor.data, tensor.name)
