"""Helpers of the stress suite: child servers, figures, memory."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Iterator

from mlxcel_py.models.footprint import resident_bytes

from server_helpers import ChildServer, spawn_server

FIGURES: dict[str, dict] = {}


def record(test: str, **figures) -> None:
    FIGURES.setdefault(test, {}).update(figures)


@contextlib.contextmanager
def serving(model: Path, *args: str) -> Iterator[ChildServer]:
    """A child server for one test, stopped with SIGTERM afterwards (it must exit 0)."""
    child = spawn_server(model, *args)
    try:
        yield child
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(60) == 0, child.log()
    finally:
        child.kill()
    assert "Traceback" not in child.log(), child.log()


def rss_mib(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    rss = resident_bytes(pid)
    assert rss > 0, "no VmRSS"
    return rss / (1 << 20)
