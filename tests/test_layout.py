"""The layout's rules hold for the package, and the checker sees what it claims to."""

import importlib.util
import re
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


LABELS = re.compile(r"[Ii]ssue [0-9]+|[Ss]ession [0-9]+|/tmp/s[0-9]+|/work/")
CHECKERS = {"tests/test_layout.py", "tests/test_docs.py"}  # they spell the patterns out


def test_the_code_names_no_development_round_issue_number_or_machine_path():
    """Code, tests, benchmarks and scripts describe the project as it is: no "issue 26" or "session 34"
    labels, and no absolute paths of one machine (paths come from flags or environment variables)."""
    found = []
    for folder in ("mlxcel_py", "tests", "bench", "scripts", "deploy"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".sh", ".js", ".html", ".css", ".conf", ".md", ".toml", ".cfg", ".txt") \
                    or "fixtures" in path.parts or "vendor" in path.parts or not path.is_file():
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if LABELS.search(line) and path.relative_to(ROOT).as_posix() not in CHECKERS:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_every_path_architecture_md_names_exists():
    """docs/ARCHITECTURE.md names modules and folders in backticks: each exists (a move updates it)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:mlxcel_py|tests|scripts|docs)/[\w./]+|(?:server|engine|models|quant)/[\w./]+)`", text))
    assert len(named) > 30
    missing = []
    for path in sorted(named):
        candidates = [ROOT / path, ROOT / "mlxcel_py" / path, ROOT / "mlxcel_py" / "models" / path]
        if not any(c.exists() for c in candidates):
            missing.append(path)
    assert not missing, missing
