"""Read a GGUF file's metadata and tensor table, with tensor bytes as memory-mapped views.

The `gguf` package's own `GGUFReader` takes ~5 s to open the 135M default model (it builds
a numpy view per vocabulary string); this parser reads the same header in ~0.1 s and
leaves the tensor bytes memory-mapped for `gguf_tensors` to convert. Type tables and
sizes come from the `gguf` package. A split model (llama.cpp's PREFIX-00001-of-0000N.gguf) is
read from its first part (gguf_split.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from ..errors import ModelLoadError
from .gguf_split import join_parts, split_count

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {k: np.dtype(v) for k, v in _SCALARS.items()}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: rows first, the contiguous axis last
    data: np.ndarray  # uint8 view, shape (*shape[:-1], bytes per row)

    @property
    def type_name(self) -> str:
        return self.qtype.name


@dataclass(frozen=True, slots=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # plain Python values; numeric arrays as lists
    tensors: dict[str, TensorInfo]


class _Cursor:
    def __init__(self, buf: np.ndarray):
        self.buf, self.mem, self.pos = buf, memoryview(buf), 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.mem, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("<Q")
        text = bytes(self.mem[self.pos : self.pos + size]).decode("utf-8", "replace")
        self.pos += size
        return text

    def value(self, kind: int) -> Any:
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind != GGUFValueType.ARRAY:
            return self.scalar(_SCALARS[kind])
        item, count = GGUFValueType(self.scalar("<I")), self.scalar("<Q")
        if item == GGUFValueType.STRING:
            return [self.string() for _ in range(count)]
        if item == GGUFValueType.ARRAY:
            return [self.value(GGUFValueType.ARRAY) for _ in range(count)]
        dtype = _NUMPY[item]
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += count * dtype.itemsize
        return out.tolist()


def _tensor_table(cur: _Cursor, count: int) -> list[tuple[str, int, tuple[int, ...], int]]:
    table = []
    for _ in range(count):
        name = cur.string()
        dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
        qtype, offset = cur.scalar("<I"), cur.scalar("<Q")
        table.append((name, qtype, tuple(reversed(dims)), offset))
    return table


def _tensor(buf: np.ndarray, start: int, entry: tuple, source: str) -> TensorInfo:
    name, raw_type, shape, offset = entry
    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        raise ModelLoadError(f"unsupported GGUF tensor type {raw_type} for {name!r} in {source}") from None
    block, size = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ModelLoadError(f"GGUF tensor {name!r} in {source}: row of {shape[-1]} is not whole {qtype.name} blocks")
    row_bytes = shape[-1] // block * size
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    begin = start + offset
    if begin + rows * row_bytes > buf.size:
        raise ModelLoadError(f"truncated GGUF file: {source} (tensor {name!r} runs past the end)")
    data = buf[begin : begin + rows * row_bytes].reshape(*shape[:-1], row_bytes)
    return TensorInfo(name, qtype, shape, data)


def read_gguf(path: Path) -> GGUFFile:
    """Parse `path` (the first part of a split model brings its other parts' tensors: gguf_split.py);
    raises ModelLoadError when it is not a GGUF file we can read."""
    first = _read_one(path)
    return first if split_count(first.metadata) == 1 else join_parts(first, _read_one)


def _read_one(path: Path) -> GGUFFile:
    source = path.name
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"not a readable GGUF file: {path} ({exc})") from None
    cur = _Cursor(buf)
    try:
        if buf.size < 24 or cur.scalar("<I") != GGUF_MAGIC:
            raise ModelLoadError(f"not a readable GGUF file: {path} (no GGUF magic)")
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"unsupported GGUF version {version} in {source} (supported: 2, 3)")
        num_tensors, num_kv = cur.scalar("<Q"), cur.scalar("<Q")
        metadata = {}
        for _ in range(num_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"))
        table = _tensor_table(cur, num_tensors)
    except ModelLoadError:
        raise
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as exc:
        raise ModelLoadError(f"not a readable GGUF file: {path} ({exc})") from None
    align = int(metadata.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    tensors = {entry[0]: _tensor(buf, start, entry, source) for entry in table}
    return GGUFFile(path, metadata, tensors)
