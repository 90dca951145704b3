"""`mlxcel-py run`: an interactive chat with a model through the one-slot engine."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import MlxcelError
from ..logs import setup_logging
from .common import fail, resolve_or_exit
from .options import (
    CacheTypeKOpt, CacheTypeVOpt, ContextShiftOpt, CpuWeightsOpt,
    BatchSizeOpt, CtxSizeOpt, ItlBudgetOpt, LookupNgramOpt, DraftMaxOpt, DraftMinOpt, DraftModelOpt, LogLevelOpt, MaxTokensOpt, MinPOpt, ModelOpt, ThreadsOpt, PrefillChunkOpt,
    PromptCacheOpt, RepeatPenaltyOpt, SeedOpt, TempOpt, TopKOpt, TopPOpt,
)

SystemOpt = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt (also /system in the chat).")]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown/--no-markdown", help="Redraw finished answers as Markdown on a terminal.")
]


def run(
    model: ModelOpt = None,
    threads: ThreadsOpt = None,
    cpu_weights: CpuWeightsOpt = None,
    system: SystemOpt = None,
    max_tokens: MaxTokensOpt = None,
    temp: TempOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    repeat_penalty: RepeatPenaltyOpt = None,
    seed: SeedOpt = None,
    ctx_size: CtxSizeOpt = None,
    prefill_chunk_size: PrefillChunkOpt = None,
    batch_size: BatchSizeOpt = None,
    itl_budget_ms: ItlBudgetOpt = None,
    lookup_ngram: LookupNgramOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = None,
    draft_model: DraftModelOpt = None,
    context_shift: ContextShiftOpt = None,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    prompt_cache: PromptCacheOpt = True,
    markdown: MarkdownOpt = True,
    log_level: LogLevelOpt = None,
) -> None:
    """Chat with a model. Type /help for the commands; piped stdin is read one message per line."""
    cfg = resolve_or_exit(
        "run", model=model, threads=threads, cpu_weights=cpu_weights,
        max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, ctx_size=ctx_size, prefill_chunk_size=prefill_chunk_size,
        batch_size=batch_size, itl_budget_ms=itl_budget_ms, lookup_ngram=lookup_ngram, draft_max=draft_max, draft_min=draft_min, draft_model=draft_model,
        context_shift=context_shift, cache_type_k=cache_type_k, cache_type_v=cache_type_v, prompt_cache=prompt_cache, log_level=log_level,
    )
    setup_logging(log_level or "warning")  # a chat shows answers, not engine logs, unless asked
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
            session = ChatSession(worker, loaded.tokenizer, cfg.sampling, system=system)
            renderer = ChatRenderer(Console(highlight=False), err, interactive=interactive, markdown=markdown)
            renderer.banner(loaded.name)
            reader = terminal_reader() if interactive else stream_reader(sys.stdin)
            code = Repl(session, renderer, reader).run()
    except MlxcelError as exc:  # e.g. a flag the model refuses at engine start (--context-shift)
        fail(str(exc), code=2)
    raise typer.Exit(code)
