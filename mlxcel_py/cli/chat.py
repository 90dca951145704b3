"""`mlxcel-py run`: an interactive chat with a model through the one-slot engine."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from ..errors import MlxcelError
from ..flags import RunFlags
from ..logs import setup_logging
from .common import fail, resolve_or_exit
from .parse import parses


@parses(RunFlags)
def run(flags: RunFlags) -> None:
    """Chat with a model. Type /help for the commands; piped stdin is read one message per line."""
    cfg = resolve_or_exit("run", flags)
    setup_logging(flags.log_level or "warning")  # a chat shows answers, not engine logs, unless asked
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    err = Console(stderr=True, highlight=False)
    from .loading import load_draft_or_exit, load_or_exit  # preloads the BLAS before anything imports MLX

    try:
        loaded = load_or_exit(cfg, err)
        draft = load_draft_or_exit(cfg, loaded, err)
    except KeyboardInterrupt:  # Ctrl-C while loading: leave quietly, like Ctrl-C at the prompt
        raise typer.Exit(130) from None
    from ..engine import engine_session
    from .chat_render import ChatRenderer
    from .repl import ChatSession, Repl, stream_reader, terminal_reader

    try:
        with engine_session(cfg.engine, loaded, draft=draft) as worker:
            session = ChatSession(worker, loaded.tokenizer, cfg.sampling, system=flags.system)
            renderer = ChatRenderer(Console(highlight=False), err, interactive=interactive, markdown=flags.markdown)
            renderer.banner(loaded.name)
            reader = terminal_reader() if interactive else stream_reader(sys.stdin)
            code = Repl(session, renderer, reader).run()
    except MlxcelError as exc:  # e.g. a flag the model refuses at engine start (--context-shift)
        fail(str(exc), code=2)
    raise typer.Exit(code)
