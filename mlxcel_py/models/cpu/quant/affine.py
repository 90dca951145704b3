"""mlx-lm's affine-quantized matrices (4 or 8 bits, groups of 32 or 64) repacked once into blocks
the CPU kernels read: no float32 copy.

MLX stores w = scale * q + bias per group, q packed little-endian into uint32 words (weight j at
bits (j % per_word) * bits of word j // per_word), scale and bias in the model's float type.
* 4 bits: each 32 weights become one Q4_1 block (d = scale, m = bias as float16; weight i in the
  low nibble of byte i, weight 16 + i in the high one); a group of 64 is two blocks with the same
  d and m. Q4_1's d * q + m is MLX's dequantization, computed in float32.
* 8 bits: A8 blocks (affine_ir.py): d, m float16, then the 32 uint8 codes as they are.
Only float16-exact scales and biases repack (float16, bfloat16 within float16's range; a float32
model's usually are not): `to_blocks` returns None otherwise and the caller keeps float32."""

from __future__ import annotations

from enum import IntEnum
from typing import Optional

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .affine_ir import A8
from .blocks import QuantWeight

BITS, GROUPS = (4, 8), (32, 64)


class AffineType(IntEnum):
    """Block types of no GGUF file (a QuantWeight's `qtype` needs a name and an id)."""

    A8 = A8


def codes(weight: np.ndarray, bits: int) -> np.ndarray:
    """uint32 (rows, K * bits / 32) packed codes -> uint8 (rows, K), weight j in column j."""
    raw = np.ascontiguousarray(weight).view(np.uint8)
    if bits == 8:
        return raw
    return np.stack([raw & np.uint8(15), raw >> np.uint8(4)], axis=-1).reshape(raw.shape[0], -1)


def _half(values: np.ndarray, group: int) -> Optional[np.ndarray]:
    """float32 (rows, K / group) -> float16 per 32 weights (rows, K / 32), or None when not exact."""
    half = values.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), values, equal_nan=True) or not np.all(np.isfinite(half)):
        return None
    return np.repeat(half, group // 32, axis=1)


def to_blocks(weight: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group: int,
              name: str = "tensor") -> Optional[QuantWeight]:
    """One MLX quantized matrix (weight uint32; scales, biases as float32 arrays) as Q4_1 or A8 blocks;
    None where it does not repack exactly (other bits or groups, scales not float16-exact)."""
    if bits not in BITS or group not in GROUPS:
        return None
    d, m = _half(np.asarray(scales, np.float32), group), _half(np.asarray(biases, np.float32), group)
    if d is None or m is None:
        return None
    q = codes(weight, bits)
    rows, k = q.shape
    groups = q.reshape(rows, k // 32, 32)
    if bits == 4:
        groups = groups[..., :16] | (groups[..., 16:] << np.uint8(4))
    out = np.concatenate([d.reshape(rows, -1, 1).view(np.uint8), m.reshape(rows, -1, 1).view(np.uint8), groups], axis=-1)
    qtype = T.Q4_1 if bits == 4 else AffineType.A8
    return QuantWeight(qtype, (rows, k), out.reshape(rows, -1))
