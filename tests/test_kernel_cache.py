"""numba's on-disk cache keyed by the kernel sources (mlxcel_py/kernel_cache.py): the modules are found
by construction (those importing numba or llvmlite and what they import from), an edit to any of them
changes the key, and the process's kernels cache under it."""

import shutil
from pathlib import Path

import pytest

from mlxcel_py import kernel_cache

PACKAGE = Path(kernel_cache.__file__).parent


@pytest.fixture
def copy(tmp_path):
    """A copy of the package's sources to edit."""
    root = tmp_path / "mlxcel_py"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc", "static"))
    return root


def names(root, paths):
    return {p.relative_to(root).as_posix() for p in paths}


def test_the_sources_are_the_kernel_modules_and_what_they_import_from():
    found = names(PACKAGE, kernel_cache.kernel_sources())
    # kernels, the IR they inline, and modules whose names a kernel module binds (constants included)
    assert {"models/cpu/quant/step.py", "models/cpu/quant/vector_ir.py", "models/cpu/quant/int8_ir.py", "models/cpu/attention_ir.py",
            "models/cpu/decode_attention.py", "models/cpu/quant/unpack.py", "engine/runner/sampling_np.py"} <= found
    assert "server/app.py" not in found and "cli/serve.py" not in found  # no kernel sees them


@pytest.mark.parametrize("edit", ["models/cpu/quant/int8_ir.py", "models/cpu/attention_ir.py", "models/cpu/quant/vector_intrinsics.py",
                                  "models/cpu/decode_kernels.py"])
def test_an_edit_to_any_kernel_source_changes_the_key(copy, edit):
    before = kernel_cache.digest(copy)
    assert before == kernel_cache.digest(PACKAGE)  # the copy keys as the package does
    path = copy / edit
    path.write_text(path.read_text() + "\n# an edit\n")
    assert kernel_cache.digest(copy) != before


def test_an_edit_elsewhere_keeps_it_and_a_new_kernel_module_changes_it(copy):
    before = kernel_cache.digest(copy)
    server = copy / "server" / "app.py"
    server.write_text(server.read_text() + "\n# an edit\n")
    assert kernel_cache.digest(copy) == before
    (copy / "models" / "new_kernels.py").write_text("from numba import njit\n")
    assert kernel_cache.digest(copy) != before


def test_install_points_numba_at_the_digest_and_a_child_inherits_the_same(tmp_path):
    env = {"MLXCEL_KERNEL_CACHE": str(tmp_path / "base")}
    path = kernel_cache.install(env)
    assert path == tmp_path / "base" / kernel_cache.digest() and path.is_dir()
    assert env["NUMBA_CACHE_DIR"] == str(path)
    child = dict(env)  # a spawned server or rank: the same directory, not one below it
    assert kernel_cache.install(child) == path
    user = {"NUMBA_CACHE_DIR": str(tmp_path / "mine")}  # a user's own NUMBA_CACHE_DIR is the base
    assert kernel_cache.install(user) == tmp_path / "mine" / kernel_cache.digest()


def test_old_digests_are_pruned(tmp_path):
    base = tmp_path / "base"
    for i in range(6):
        (base / f"{i:016x}").mkdir(parents=True)
    path = kernel_cache.install({"MLXCEL_KERNEL_CACHE": str(base)})
    kept = sorted(d.name for d in base.iterdir())
    assert path.name in kept and len(kept) == kernel_cache.KEEP


def test_this_process_caches_its_kernels_under_the_key():
    import os

    import numba

    if not os.environ.get("MLXCEL_KERNEL_CACHE_DIR"):
        pytest.skip("no writable cache directory here: numba caches beside the sources, as it would by itself")

    from mlxcel_py.models.cpu.quant import vector

    assert Path(numba.config.CACHE_DIR).name == kernel_cache.digest()
    assert Path(vector.stream_int8.stats.cache_path).parent == Path(numba.config.CACHE_DIR)
