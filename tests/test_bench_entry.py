"""`python -m bench` (bench/__main__.py): the one benchmark entry point lists its subcommands, each
subcommand's `--help` is its own argparse's and loads no model, bench/ stays at most 12 modules each
reachable from the entry, and every bench path or subcommand the docs name exists (docs/BENCHMARKS.md)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))

from bench.__main__ import COMMANDS  # noqa: E402

NAMES = [c.name for c in COMMANDS]
ALIASES = {a: c for c in COMMANDS for a in c.aliases}
EXPECTED = {
    "all", "admission", "peers", "vs-llama-server", "side-by-side", "kv-bytes", "decode", "serve-path", "models",
    "mixed-embeddings", "distributed", "engine", "generate", "fast-path", "prefill", "cpu-weights", "memory",
    "decode-step", "decode-sweep", "arch-decode", "roofline", "quant-kernels", "kquant-repack", "decode-attention",
    "prefill-attention",
    "prefill-weights", "tick-costs", "tick-fused", "tick-split", "tick-spikes", "kv-join", "context-shift",
    "speculative", "constraints", "grammar-libs", "synthetic-gguf", "vision-encode",
}
MAX_MODULES = 12


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _tree(module: str) -> ast.Module:
    return ast.parse((BENCH / f"{module}.py").read_text(encoding="utf-8"))


def _bench_imports(module: str) -> set[str]:
    """The bench modules `module` imports (`from bench import x`, `from bench.x import ...`)."""
    found = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            found.add(node.module.split(".")[1])
    return found


def test_every_subcommand_is_listed() -> None:
    assert EXPECTED == set(NAMES) | set(ALIASES)
    assert len(NAMES) == len(set(NAMES))
    done = _bench("--help")
    assert done.returncode == 0, done.stderr
    for c in COMMANDS:
        assert c.name in done.stdout
        assert f"bench/{c.module}.py" in done.stdout
        functions = {n.name for n in _tree(c.module).body if isinstance(n, ast.FunctionDef)}
        assert c.function in functions, f"bench/{c.module}.py has no {c.function}() for {c.name}"


def test_bench_is_at_most_12_modules_each_reachable_from_the_entry() -> None:
    modules = sorted(p.stem for p in BENCH.glob("*.py"))
    assert len(modules) <= MAX_MODULES, modules
    others = [p.name for p in BENCH.iterdir() if p.suffix != ".py" and p.name != "__pycache__"]
    assert not others, f"bench/ holds its Python modules only (no subpackages, no scripts): {others}"
    reachable, todo = {"__main__"}, [c.module for c in COMMANDS]
    while todo:  # a subcommand's module, or a helper one of them imports
        module = todo.pop()
        if module not in reachable:
            reachable.add(module)
            todo += sorted(_bench_imports(module))
    assert set(modules) == reachable, set(modules) ^ reachable


def test_unknown_subcommand_fails() -> None:
    done = _bench("no-such-bench")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_subcommand_help(name: str) -> None:
    command = ALIASES.get(name) or next(c for c in COMMANDS if c.name == name)
    done = _bench(name, "--help")
    assert done.returncode == 0, done.stderr
    # The mode's own argparse answered (its prog names the subcommand), not the dispatcher's.
    assert done.stdout.startswith(f"usage: python -m bench {command.name}"), done.stdout[:200]


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "Makefile"] + sorted((ROOT / "docs").rglob("*.md"))


def test_the_docs_name_only_bench_paths_and_subcommands_that_exist() -> None:
    """Every `bench/<file>` and `python -m bench <subcommand>` in README.md, the Makefile and docs/ (history
    included) names a file or subcommand of today's bench/."""
    missing = []
    for path in _documents():
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"(?<![\w/.-])bench/([\w.]+\.(?:py|sh))", text):
            if not (BENCH / m.group(1)).is_file():
                missing.append(f"{path.relative_to(ROOT)}: bench/{m.group(1)}")
        for m in re.finditer(r"-m bench ([a-z][\w-]*)", text):
            if m.group(1) not in EXPECTED:
                missing.append(f"{path.relative_to(ROOT)}: python -m bench {m.group(1)}")
    assert not missing, "\n".join(missing)
