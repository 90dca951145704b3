"""Test setup: the BLAS preload must run before anything imports mlx.core."""

import os

from mlxcel_py.models.cpu.blas import preload_blas

preload_blas(os.environ.get("MLXCEL_BLAS", "auto"))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch):
    # Rich output is asserted literally; a fixed width keeps it stable.
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERMINAL_WIDTH", "100")
    monkeypatch.delenv("MLXCEL_PREFILL_CHUNK", raising=False)
    monkeypatch.delenv("LLAMA_ARG_BATCH", raising=False)
    monkeypatch.delenv("MLXCEL_API_KEY", raising=False)
    monkeypatch.delenv("LLAMA_ARG_THREADS", raising=False)
    monkeypatch.delenv("MLXCEL_ITL_BUDGET_MS", raising=False)
