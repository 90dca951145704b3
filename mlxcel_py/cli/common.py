"""What every command shares: resolving the config, one-line errors, logging setup."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler

from ..config import AppConfig, Command, ConfigError, resolve


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: <message>` on one line to stderr and exit with `code`."""
    # A fresh console each time, so redirected stderr (tests, pipes) is honoured.
    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


def resolve_or_exit(command: Command, **kwargs: Any) -> AppConfig:
    """config.resolve, with a bad flag or env value reported as a usage error (exit 2)."""
    try:
        return resolve(command, **kwargs)
    except ConfigError as exc:
        fail(str(exc), code=2)


def setup_logging(level: str) -> None:
    """Send the "mlxcel_py" loggers through one rich handler at `level`; safe to call again."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning, error or critical")
    logger = logging.getLogger("mlxcel_py")
    for handler in [h for h in logger.handlers if getattr(h, "_mlxcel", False)]:
        logger.removeHandler(handler)
    handler = RichHandler(console=Console(stderr=True), show_path=False)
    handler._mlxcel = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(numeric)
