"""Preload an optimized BLAS so MLX's CPU `cblas_sgemm` binds to it.

The `mlx[cpu]` wheel links a reference BLAS; loading OpenBLAS with RTLD_GLOBAL before
`mlx.core` is imported makes MLX's CPU matmuls about 10x faster. Must run before that import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("mlxcel_py.models")

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


@dataclass(frozen=True, slots=True)
class BlasInfo:
    name: str  # "openblas", "reference", "system" (macOS Accelerate), "off"
    path: Optional[str] = None
    note: str = ""


_loaded: Optional[BlasInfo] = None


def _find_openblas() -> Optional[str]:
    for path in CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def preload_blas(choice: str = "auto") -> BlasInfo:
    """Load the BLAS named by `choice` ("auto", "off", or a library path); idempotent."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if sys.platform == "darwin":
        _loaded = BlasInfo("system", note="MLX uses Accelerate/Metal on macOS")
        return _loaded
    if choice == "off":
        _loaded = BlasInfo("off", note="MLXCEL_BLAS=off: the wheel's reference BLAS")
        return _loaded
    if "mlx.core" in sys.modules:
        _loaded = BlasInfo("reference", note="mlx.core was imported before the BLAS preload")
        log.warning("BLAS preload skipped: %s", _loaded.note)
        return _loaded
    path = _find_openblas() if choice == "auto" else choice
    if path is None:
        _loaded = BlasInfo("reference", note="no OpenBLAS found (apt-get install libopenblas0-pthread)")
        return _loaded
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        if choice != "auto":
            raise ValueError(f"cannot load BLAS library {path!r}: {exc}") from None
        _loaded = BlasInfo("reference", note=f"loading {path} failed: {exc}")
        return _loaded
    _loaded = BlasInfo("openblas", path=path)
    return _loaded


def loaded_blas() -> BlasInfo:
    """What `preload_blas` chose (the reference BLAS when it never ran)."""
    return _loaded or BlasInfo("reference", note="no preload")
