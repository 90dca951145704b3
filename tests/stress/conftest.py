"""The stress suite (`make stress`): real `mlxcel-py serve` child processes on 127.0.0.1,
hostile and unlucky clients, every loop bounded in count and time.

The model is the tiny random-weight GGUF (the server's machinery is what is under test);
MLXCEL_STRESS_MODEL=<path> runs the suite on another model. Each test records its figures
(stress_helpers.record); they are printed at the end of the run and docs/RELIABILITY.md
quotes them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stress_helpers import FIGURES


def pytest_terminal_summary(terminalreporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("stress figures")
    for test, figures in FIGURES.items():
        shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        terminalreporter.write_line(f"{test}: {shown}")


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> Path:
    chosen = os.environ.get("MLXCEL_STRESS_MODEL")
    if chosen:
        return Path(chosen)
    from tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("stress") / "tiny.gguf")
