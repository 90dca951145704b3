"""What the routes do to a pooled vector: llama.cpp's normalisations, and OpenAI's base64 encoding."""

from __future__ import annotations

import base64

import numpy as np


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize, row by row: -1 none, 0 max absolute (scaled to the int16
    range), 1 taxicab, 2 Euclidean, p > 2 the p-norm. A zero vector stays zero."""
    v = np.asarray(vector, dtype=np.float64)
    if norm < 0:
        return v.astype(np.float32)
    if norm == 0:
        total = np.abs(v).max(axis=-1, keepdims=True) / 32760.0
    elif norm == 2:
        total = np.sqrt((v * v).sum(axis=-1, keepdims=True))
    else:
        total = (np.abs(v) ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    scale = np.divide(1.0, total, out=np.zeros_like(total), where=total > 0)
    return (v * scale).astype(np.float32)


def encoded(vector: np.ndarray, encoding_format: str):
    """A float list, or (OpenAI's "base64") the little-endian float32 bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32).tolist()
