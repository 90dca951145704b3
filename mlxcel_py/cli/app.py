"""The Typer app: each command module declares its options and calls one shared function."""

from __future__ import annotations

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
    from . import bench, generate, run, serve

    app.command("generate")(generate.generate)
    app.command("run")(run.run)
    app.command("serve")(serve.serve)
    app.add_typer(bench.app, name="bench", help="Benchmarks against a running or spawned server.")


_register()


def main() -> None:
    app()
