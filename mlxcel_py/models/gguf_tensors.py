"""GGUF tensor bytes -> MLX arrays: dense float32, native float, or MLX affine-quantized.

Dense conversion uses the `gguf` package's reference dequantizers (`gguf.quants`). The
quantized path (GPU) repacks the types whose blocks are exactly MLX's affine layout
(32-wide groups, w = scale * q + bias): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K keep their
codes bit for bit (legacy scales are float16 in the file, so float16 scales are exact; a K-quant's
d * sub-scale is rounded to float16, 2^-11 of the scale). Types with 16-wide groups (Q6_K, Q3_K,
Q2_K; MLX 0.32 has no group of 16) are dequantized and requantized to MLX 8-bit (error within one
8-bit step of the group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from .gguf_file import TensorInfo
from ..errors import ModelLoadError

GROUP_SIZE = 32
FLOATS = (T.F32, T.F16, T.BF16)
REPACKED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K)
REQUANTIZED = (T.Q2_K, T.Q3_K, T.Q6_K)
SUPPORTED = FLOATS + REPACKED + REQUANTIZED
SUPPORTED_NAMES = ", ".join(t.name for t in SUPPORTED)


@dataclass(frozen=True, slots=True)
class Quantized:
    weight: mx.array  # uint32, MLX's packing
    scales: mx.array
    biases: mx.array
    bits: int


def check_supported(info: TensorInfo, source: str) -> None:
    if info.qtype not in SUPPORTED:
        raise ModelLoadError(
            f"unsupported GGUF tensor type {info.type_name} for {info.name!r} in {source} "
            f"(supported: {SUPPORTED_NAMES})"
        )


def dense(info: TensorInfo) -> mx.array:
    """float32, whatever the stored type."""
    if info.qtype == T.F32:
        return mx.array(info.data.view(np.float32))
    if info.qtype == T.F16:
        return mx.array(info.data.view(np.float16)).astype(mx.float32)
    return mx.array(quants.dequantize(info.data, info.qtype))


def native(info: TensorInfo) -> mx.array:
    """F32/F16/BF16 in their own dtype (the non-dense path keeps half precision)."""
    if info.qtype == T.F16:
        return mx.array(info.data.view(np.float16))
    if info.qtype == T.BF16:
        return mx.array(info.data.view(np.uint16)).view(mx.bfloat16)
    return dense(info)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes (rows, n) -> MLX's packing: a little-endian bitstream in uint32 words."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes.view(np.uint32)
    if bits == 4:
        pairs = codes.reshape(*codes.shape[:-1], -1, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8).view(np.uint32)
    # Any other width: 8 codes fill `bits` bytes; build each 8-code run in a uint64.
    runs = codes.reshape(*codes.shape[:-1], -1, 8).astype(np.uint64)
    word = np.bitwise_or.reduce(runs << (np.arange(8, dtype=np.uint64) * np.uint64(bits)), axis=-1)
    packed = word[..., None].view(np.uint8)[..., :bits]
    return np.ascontiguousarray(packed).reshape(*codes.shape[:-1], -1).view(np.uint32)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, span: int) -> np.ndarray:
    """Low nibbles of each `span` bytes, then their high nibbles (ggml's order)."""
    q = qs.reshape(*qs.shape[:-1], -1, 1, span) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    return (q & 0x0F).reshape(*qs.shape[:-1], -1)


def _legacy(blocks: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q4_0/Q4_1/Q8_0 blocks (n, bytes) -> codes (n, 32), scale (n, 1), bias (n, 1), bits."""
    d = _f16(blocks[:, :2])
    if qtype == T.Q8_0:
        return blocks[:, 2:].view(np.int8).astype(np.int16) + 128, d, -128.0 * d, 8
    if qtype == T.Q4_0:
        return _nibbles(blocks[:, 2:], 16), d, -8.0 * d, 4
    return _nibbles(blocks[:, 4:], 16), d, _f16(blocks[:, 2:4]), 4


def _legacy5(blocks: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q5_0/Q5_1 blocks (n, bytes) -> codes (n, 32), scale, bias, 5: code i's fifth bit is bit i of qh."""
    d = _f16(blocks[:, :2])
    at, bias = (2, -16.0 * d) if qtype == T.Q5_0 else (4, _f16(blocks[:, 2:4]))
    qh = np.ascontiguousarray(blocks[:, at : at + 4]).view("<u4")
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    return _nibbles(blocks[:, at + 4 :], 16) | (high << 4), d, bias, 5


def _k_quant(blocks: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q4_K/Q5_K super-blocks (n, bytes) -> codes (n*8, 32), scale (n*8, 1), bias (n*8, 1), bits."""
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(-1, 1)
    bias = -(dmin * m.astype(np.float32)).reshape(-1, 1)
    if qtype == T.Q4_K:
        return _nibbles(blocks[:, 16:], 32).reshape(-1, 32), scale, bias, 4
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
    high = (qh & 1).reshape(-1, 32)
    return _nibbles(blocks[:, 48:], 32).reshape(-1, 32) | (high << 4), scale, bias, 5


def quantized(info: TensorInfo, dtype=mx.float16) -> Quantized:
    """MLX affine quantization of a quantized GGUF tensor (group size 32)."""
    rows = int(np.prod(info.shape[:-1], dtype=np.int64))
    blocks = np.ascontiguousarray(info.data).reshape(-1, quants.GGML_QUANT_SIZES[info.qtype][1])
    if info.qtype in REPACKED:
        unpack = {T.Q4_0: _legacy, T.Q4_1: _legacy, T.Q8_0: _legacy, T.Q5_0: _legacy5, T.Q5_1: _legacy5}.get(
            info.qtype, _k_quant)
        codes, scale, bias, bits = unpack(blocks, info.qtype)
        shape = (*info.shape[:-1], info.shape[-1] // GROUP_SIZE)
        packed = _pack(codes.reshape(rows, -1), bits).reshape(*info.shape[:-1], -1)
        return Quantized(
            mx.array(packed), mx.array(scale.reshape(shape)).astype(dtype),
            mx.array(bias.reshape(shape)).astype(dtype), bits,
        )
    weight, scales, biases = mx.quantize(dense(info), group_size=GROUP_SIZE, bits=8)
    return Quantized(weight, scales.astype(dtype), biases.astype(dtype), 8)


def quantized_or_none(info: TensorInfo, dtype=mx.float16) -> Optional[Quantized]:
    """None for float tensors, else the MLX-quantized tensor."""
    return None if info.qtype in FLOATS else quantized(info, dtype)
