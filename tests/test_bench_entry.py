"""`python -m bench` (bench/__main__.py): the one benchmark entry point lists its subcommands, and each
subcommand hands `--help` to its script's argparse without loading a model (docs/BENCHMARKS.md, "One entry point")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.__main__ import COMMANDS  # noqa: E402

NAMES = [c.name for c in COMMANDS]
EXPECTED = {"decode", "prefill", "vs-llama-server", "side-by-side", "admission", "all", "kv-bytes",
            "speculative", "quant-kernels", "decode-step", "decode-sweep", "memory", "synthetic-gguf"}


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_every_subcommand_is_listed() -> None:
    assert EXPECTED == set(NAMES) | {a for c in COMMANDS for a in c.aliases}
    done = _bench("--help")
    assert done.returncode == 0, done.stderr
    for c in COMMANDS:
        assert c.name in done.stdout
        assert f"bench/{c.script}.py" in done.stdout
        assert (ROOT / "bench" / f"{c.script}.py").is_file()


def test_unknown_subcommand_fails() -> None:
    done = _bench("no-such-bench")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_subcommand_help(name: str) -> None:
    script = next(c.script for c in COMMANDS if name == c.name or name in c.aliases)
    done = _bench(name, "--help")
    assert done.returncode == 0, done.stderr
    # The script's own argparse answered (its prog is the script's file name), not the dispatcher's.
    assert done.stdout.startswith(f"usage: {script}.py"), done.stdout[:200]
