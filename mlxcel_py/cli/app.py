"""The Typer app: each command takes its options as one flag record (flags.py, cli/parse.py)
and calls one shared function."""

from __future__ import annotations

import logging
import os
import sys

import typer

app = typer.Typer(
    name="mlxcel-py",
    help="Local LLM serving on MLX: an OpenAI-compatible server, a chat REPL and one-shot generation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Command modules import nothing heavy at import time (MLX loads after the BLAS preload).
    from . import bench, chat, generate, models, serve

    app.command("generate")(generate.generate)
    app.command("run")(chat.run)
    app.command("serve")(serve.serve)
    app.command("models")(models.models)
    app.add_typer(bench.app, name="bench", help="Benchmarks against a running or spawned server.")


_register()


def main() -> None:
    """The console script: run the app, then leave without MLX's static destructors.

    MLX used from a thread other than the main one (our engine thread) can abort the
    process at exit ("terminate called without an active exception", ml-explore/mlx#3126);
    once the command is done there is nothing left to tear down, so flush and _exit.
    """
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    if "mlx.core" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
