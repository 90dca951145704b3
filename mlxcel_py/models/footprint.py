"""How much memory a model takes: estimated from its files before loading, measured (the
process's resident set) around the load, handed back after an unload (server/registry)."""

from __future__ import annotations

import ctypes
import gc
import math
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError
from .loader import cpu_is_default, default_cpu_weights, default_model_path

_WEIGHT_FILES = ("*.safetensors", "*.npz")


def status_kib(field: str = "VmRSS", pid: int | str = "self") -> int:
    """One KiB field of /proc/PID/status (VmRSS, VmHWM, RssFile ...); 0 where /proc or the field is absent."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def resident_bytes(pid: int | str = "self") -> int:
    """A process's resident set size (VmRSS), in bytes; 0 where /proc is absent."""
    return status_kib("VmRSS", pid) * 1024


def mapped_resident_bytes(addresses: set[int]) -> int:
    """Resident bytes of this process's mappings that hold any of `addresses` (from /proc/self/smaps):
    what buffers really touched, not what they reserved; 0 where /proc is absent."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: lo-hi perms ...
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = any(lo <= a < hi for a in addresses)
                elif head == "Rss:" and inside:
                    total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


def estimate_bytes(spec: Optional[str], cpu_weights: Optional[str] = None) -> int:
    """The memory a model is expected to take once loaded; 0 when it cannot be told from local files
    (a Hugging Face id not in the cache, an unreadable file: the load itself says why).

    On the CPU a GGUF's quantized matrices stay the file's own blocks under `--cpu-weights native`
    (the default on AVX2), F16/BF16 matrices too, and its other float tensors become float32 arrays; under `f32` every tensor
    does (4 bytes per parameter) beside the file; on a GPU the weights stay as stored."""
    try:
        path = Path(spec).expanduser() if spec else Path(default_model_path())
    except ModelLoadError:
        return 0
    if path.is_dir():
        return sum(p.stat().st_size for pattern in _WEIGHT_FILES for p in path.glob(pattern))
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if path.suffix.lower() != ".gguf" or not cpu_is_default():
        return size
    from .gguf_file import read_gguf

    try:
        tensors = read_gguf(path).tensors.values()
    except ModelLoadError:
        return 0
    native = (cpu_weights or default_cpu_weights()) == "native"
    # Under native an F16/BF16 matrix stays its blocks too (gguf_blocks.is_block_type); vectors become float32.
    copied = lambda t: not native or t.type_name == "F32" or (t.type_name in ("F16", "BF16") and len(t.shape) != 2)  # noqa: E731
    return size + 4 * sum(math.prod(t.shape) for t in tensors if copied(t))


def release_memory() -> None:
    """After an unload: collect what the dropped model held and return MLX's cached buffers."""
    import mlx.core as mx

    gc.unfreeze()  # the server froze the model's objects at attach; collect them now
    gc.collect()
    mx.clear_cache()
    malloc_trim()
    gc.freeze()


def malloc_trim() -> None:
    """Hand glibc's freed heap pages back to the system (without it the resident set keeps them)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        pass
