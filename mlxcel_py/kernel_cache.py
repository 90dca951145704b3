"""One cache key for every numba kernel of the package.

numba caches a compiled function by its own source file's stamp, blind to what it inlines from other
files: kernels and LLVM IR of other modules, and the constants it froze (a cached kernel built against
an edited one has segfaulted). So the cache directory is keyed instead by a digest of every module
numba compiles from, found by construction: each package module whose source imports numba or
llvmlite, and the package modules those import from (what their kernels can see), plus numba's and
llvmlite's versions.
An edit to any of them starts a fresh cache (one recompile, about a minute); other edits keep it.

`install()` runs when the package is imported, before any kernel module is: it points numba at
`<base>/<digest>`, the base being NUMBA_CACHE_DIR if set, else MLXCEL_KERNEL_CACHE, else
~/.cache/mlxcel-py/numba (XDG_CACHE_HOME respected), and keeps the few most recent digests there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

PACKAGE = Path(__file__).resolve().parent
KEEP = 4  # digests kept under the base (the current one and the most recently used others)
_OURS = "MLXCEL_KERNEL_CACHE_DIR"  # the digest directory install() set (children inherit both)


def _module_file(root: Path, dotted: str) -> Optional[Path]:
    """The file of package module `dotted` ("models.cpu.quant.step"), or None outside the package."""
    parts = dotted.split(".") if dotted else []
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#]*)", re.M)


def _imports(root: Path, path: Path) -> set[Path]:
    """The package modules `path` imports (absolute mlxcel_py.* and relative imports, each package's
    __init__ on the way included), read from its import statements (a regular expression: parsing
    every kernel module costs 50 ms at each start)."""
    package = list(path.relative_to(root).parent.parts)
    text, found = path.read_text(encoding="utf-8"), set()

    def add(parts: list[str]) -> None:
        for i in range(len(parts) + 1):
            module = _module_file(root, ".".join(parts[:i]))
            if module is not None:
                found.add(module)

    for dots, module, names in _FROM.findall(text):
        if dots:
            parts = package[: len(package) - (len(dots) - 1)] + (module.split(".") if module else [])
        elif module.startswith(f"{root.name}."):
            parts = module.split(".")[1:]
        else:
            continue
        add(parts)
        for name in re.findall(r"\w+", names):
            if _module_file(root, ".".join(parts + [name])) is not None:  # `from . import a`: a module
                add(parts + [name])
    for names in _IMPORT.findall(text):
        for name in re.findall(r"[\w.]+", names):
            if name.startswith(f"{root.name}."):
                add(name.split(".")[1:])
    return found


def kernel_sources(root: Path = PACKAGE) -> list[Path]:
    """The modules numba compiles from: those importing numba or llvmlite, and the package modules
    they import from (a kernel sees its own module's globals: kernels, IR and constants bound there)."""
    kernels = [p for p in sorted(root.rglob("*.py")) if _uses_numba(p)]
    found = set(kernels)
    for path in kernels:
        found |= _imports(root, path)
    return sorted(found)


def _uses_numba(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return "import numba" in text or "from numba" in text or "llvmlite" in text


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def digest(root: Path = PACKAGE) -> str:
    """sha256 (16 hex digits) of the kernel sources' paths and bytes, and numba's and llvmlite's versions."""
    h = hashlib.sha256(f"numba {_version('numba')} llvmlite {_version('llvmlite')}\n".encode())
    for path in kernel_sources(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_base(env=os.environ) -> Path:
    """NUMBA_CACHE_DIR (unless it is the digest directory this module set, inherited by a child
    process: then its parent), else MLXCEL_KERNEL_CACHE, else ~/.cache/mlxcel-py/numba."""
    numba_dir = env.get("NUMBA_CACHE_DIR")
    if numba_dir and numba_dir == env.get(_OURS):
        return Path(numba_dir).parent
    if numba_dir:
        return Path(numba_dir)
    if env.get("MLXCEL_KERNEL_CACHE"):
        return Path(env["MLXCEL_KERNEL_CACHE"])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxcel-py" / "numba"


def install(env=os.environ) -> Optional[Path]:
    """Point numba's cache at this source digest's directory (in `env`, which numba reads when first
    imported, and in numba's config if it already is); None where numba is not installed or the
    directory cannot be made (numba then caches beside the sources, as it would by itself)."""
    if _version("numba") == "none":
        return None
    base = cache_base(env)
    path = base / digest()
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.utime(path)  # the most recently used
        _prune(base, path)
    except OSError:
        return None
    env["NUMBA_CACHE_DIR"] = env[_OURS] = str(path)
    config = getattr(sys.modules.get("numba"), "config", None)
    if config is not None and env is os.environ:  # read when a kernel is decorated: before any of ours is
        config.CACHE_DIR = str(path)
    return path


def _prune(base: Path, current: Path) -> None:
    """Keep the KEEP most recently used digest directories under `base`."""
    dirs = sorted((d for d in base.iterdir() if d.is_dir() and len(d.name) == 16 and d != current),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for old in dirs[KEEP - 1:]:
        shutil.rmtree(old, ignore_errors=True)
