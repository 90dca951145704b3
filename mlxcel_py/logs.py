"""Logging for every front end: the "mlxcel_py" loggers through one rich handler on stderr."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

from .errors import ConfigError


def setup_logging(level: str) -> None:
    """Send the "mlxcel_py" loggers through one rich handler at `level`; safe to call again."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {level!r}; use debug, info, warning, error or critical",
                          flag="--log-level")
    logger = logging.getLogger("mlxcel_py")
    for handler in [h for h in logger.handlers if getattr(h, "_mlxcel", False)]:
        logger.removeHandler(handler)
    handler = RichHandler(console=Console(stderr=True), show_path=False)
    handler._mlxcel = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(numeric)
