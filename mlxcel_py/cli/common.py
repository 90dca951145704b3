"""What every command shares: resolving the config and one-line errors."""

from __future__ import annotations

from typing import Any, Mapping, NoReturn, Optional

import typer
from rich.console import Console

from ..config import AppConfig, Command, resolve
from ..errors import ConfigError


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: <message>` on one line to stderr and exit with `code`."""
    # A fresh console each time, so redirected stderr (tests, pipes) is honoured.
    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


def resolve_or_exit(command: Command, flags: Any, env: Optional[Mapping[str, str]] = None) -> AppConfig:
    """config.resolve, with a bad flag or env value reported as a usage error (exit 2)."""
    try:
        return resolve(command, flags, env)
    except ConfigError as exc:
        fail(str(exc), code=2)
