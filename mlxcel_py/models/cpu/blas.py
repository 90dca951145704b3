"""Preload an optimized BLAS so MLX's CPU `cblas_sgemm` binds to it.

The `mlx[cpu]` wheel links a reference BLAS; loading OpenBLAS with RTLD_GLOBAL before
`mlx.core` is imported makes MLX's CPU matmuls about 10x faster. Must run before that import.
Older OpenBLAS builds (Debian 12 ships 0.3.21) do not recognise recent Xeons and fall back
to SSE3 "Prescott" kernels, 5x slower than their AVX-512 ones; when OPENBLAS_CORETYPE is
unset, it is chosen from the CPU's flags.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import sys
from dataclasses import dataclass
from typing import Optional

from ...errors import ConfigError

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


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def coretype_for(flags: set[str], machine: str) -> Optional[str]:
    """The OpenBLAS kernel family this x86 CPU can run, by its instruction-set flags."""
    if machine not in ("x86_64", "AMD64"):
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


# OpenBLAS's x86 kernel families, narrowest first (the ones coretype_for picks, and those at their level).
_FAMILY_RANK = {"prescott": 0, "nehalem": 0, "sandybridge": 1, "haswell": 2, "zen": 2, "skylakex": 3,
                "cooperlake": 3, "sapphirerapids": 3}


def narrower_coretype(env_value: str, best: Optional[str]) -> bool:
    """Whether OPENBLAS_CORETYPE=`env_value` names a narrower kernel family than `best`, the one this CPU
    runs (e.g. Haswell on an AVX-512 CPU: half the SGEMM of SkylakeX on a Zen 5, measured)."""
    rank = _FAMILY_RANK.get(env_value.strip().lower())
    return best is not None and rank is not None and rank < _FAMILY_RANK[best.lower()]


def _corename() -> str:
    try:
        lib = ctypes.CDLL(None)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (AttributeError, OSError):
        return "?"


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
    coretype = coretype_for(_cpu_flags(), platform.machine())
    if "OPENBLAS_CORETYPE" not in os.environ:  # read by OpenBLAS once, when it loads
        if coretype is not None:
            os.environ["OPENBLAS_CORETYPE"] = coretype
    elif narrower_coretype(os.environ["OPENBLAS_CORETYPE"], coretype):  # respected, but said in the startup log
        log.info("OPENBLAS_CORETYPE=%s is set: this CPU runs OpenBLAS's %s kernels (about twice the "
                    "prefill's SGEMM); unset it to let mlxcel-py choose", os.environ["OPENBLAS_CORETYPE"], coretype)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        if choice != "auto":
            raise ConfigError(f"cannot load BLAS library {path!r} (MLXCEL_BLAS): {exc}", flag="MLXCEL_BLAS") from None
        _loaded = BlasInfo("reference", note=f"loading {path} failed: {exc}")
        return _loaded
    _loaded = BlasInfo("openblas", path=path, note=f"kernels {_corename()}")
    return _loaded


def set_blas_threads(threads: int) -> None:
    """Cap OpenBLAS's threads (MLX's CPU matmuls) where it is the loaded BLAS; no-op elsewhere."""
    if _loaded is None or _loaded.name != "openblas":
        return
    try:
        ctypes.CDLL(None).openblas_set_num_threads(ctypes.c_int(threads))
    except (AttributeError, OSError):  # an OpenBLAS without the call: its own default stays
        pass


def loaded_blas() -> BlasInfo:
    """What `preload_blas` chose (the reference BLAS when it never ran)."""
    return _loaded or BlasInfo("reference", note="no preload")


def slow_blas_note() -> Optional[str]:
    """What running on the wheel's reference BLAS costs, for the load's log on the CPU path (None where
    OpenBLAS, Accelerate, or the user's MLXCEL_BLAS=off is in use)."""
    info = loaded_blas()
    if info.name != "reference" or sys.platform != "linux":
        return None
    return (f"the reference BLAS is in use ({info.note}): MLX's CPU matmuls (prefill outside the fused CPU step, "
            "--cpu-weights f32) run several times slower; install libopenblas0-pthread (make blas)")


_sgemm: Optional[object] = None


def _sgemm_fn():
    global _sgemm
    if _sgemm is None:
        fn = ctypes.CDLL(_loaded.path).cblas_sgemm
        fn.restype = None
        fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
        _sgemm = fn
    return _sgemm


def sgemm_nt(a, b, out) -> bool:
    """out = a @ b.T (float32; a, b C-contiguous, out rows strided, e.g. a column slice) through the
    preloaded OpenBLAS, MLX's own (1.6-1.8x numpy's bundled one on this EPYC); False where none is loaded."""
    if _loaded is None or _loaded.name != "openblas":
        return False
    (m, k), n = a.shape, b.shape[0]
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.strides[1] == 4 and out.shape == (m, n)):
        raise ValueError("sgemm_nt: a and b C-contiguous float32, out (m, n) with unit column stride")
    # CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112
    _sgemm_fn()(101, 111, 112, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, k, 0.0, out.ctypes.data,
                out.strides[0] // 4)
    return True


_numpy_local: Optional[object] = None  # numpy's bundled OpenBLAS's openblas_set_num_threads_local, or False


def _numpy_set_local():
    global _numpy_local
    if _numpy_local is None:
        import glob

        import numpy

        libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so"))
        try:
            fn = ctypes.CDLL(libs[0]).openblas_set_num_threads_local if libs else False
        except (AttributeError, OSError):  # an OpenBLAS before 0.3.27, or another BLAS under numpy
            fn = False
        if fn:
            fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        _numpy_local = fn
    return _numpy_local


class numpy_blas_threads:
    """Cap numpy's own OpenBLAS to `threads` on the calling thread inside the block (no-op where
    numpy has no such OpenBLAS, or `threads` is None). For many small products, e.g. a fused tick's piece attention: a
    second OpenBLAS thread woken per 48x64 @ 64xS product waits on the cores numba's threads hold."""

    def __init__(self, threads: Optional[int]):
        self.threads, self.previous = threads, None

    def __enter__(self) -> "numpy_blas_threads":
        fn = _numpy_set_local() if self.threads is not None else False
        if fn:
            self.previous = fn(self.threads)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            _numpy_set_local()(self.previous)
