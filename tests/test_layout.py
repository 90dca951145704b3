"""The layout's rules (issue 21) hold for the package, and the checker sees what it claims to."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "scripts" / "check_layout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_layout", module)
    spec.loader.exec_module(module)
    return module


def test_the_package_keeps_the_layout_rules():
    assert _checker().violations(ROOT) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "mlxcel_py" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_cycles_through_local_imports_mlx_and_dialects(tmp_path):
    _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from .a import x\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n",
        "server/__init__.py": "",
        "server/openai/__init__.py": "",
        "server/openai/routes.py": "from ..llama.shapes import z\nimport mlx.core as mx\n",
        "server/llama/__init__.py": "",
        "server/llama/shapes.py": "z = 1\n",
        "engine/runner/x.py": "import mlx.core\n",
    })
    assert _checker().violations(tmp_path) == [
        "import cycle: mlxcel_py.a -> mlxcel_py.b",
        "mlxcel_py.server.openai.routes imports mlx",
        "dialect openai imports dialect llama: mlxcel_py.server.openai.routes -> mlxcel_py.server.llama.shapes",
    ]
