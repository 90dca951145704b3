"""mlxcel-py: local LLM serving on MLX."""

import os as _os

# OpenBLAS workers spin for 2^28 cycles (~0.1 s) after every call before they sleep. A CPU
# process here holds two OpenBLAS pools (MLX's matmuls, numpy's prefill attention) and
# numba's decode threads; on a few cores each pool's spinners steal the cores the next
# call needs: a 128-token prefill piece took 1.2 s, 0.19 s with the shortest timeout (a
# 512-token piece 1.49 s -> 0.70 s; docs/CPU_FAST_PATH.md). Each library reads this once
# when it loads, so it is set here, before numpy or MLX load; a value in the environment
# wins. Nothing else reads it (Metal and CUDA builds use no OpenBLAS for their own work).
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# numba's OpenMP decode worker spins ~300,000 rounds (ms) after each step for the next one; the
# server's loop and its clients need that core between steps. 20,000 (~0.3 ms) is faster in process
# and through HTTP on 2 cores (docs/CPU_DECODE.md, "The server's share"); read once by libgomp.
_os.environ.setdefault("GOMP_SPINCOUNT", "20000")

__version__ = "0.1.0"

# numba's on-disk cache keyed by the kernel sources, before any kernel module is imported (kernel_cache.py).
from . import kernel_cache as _kernel_cache  # noqa: E402

_kernel_cache.install()
