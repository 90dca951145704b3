"""`mlxcel-py generate`: one-shot generation through the one-slot engine, with speed stats."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .common import fail, resolve_or_exit, setup_logging
from .options import (
    BatchSizeOpt, CtxSizeOpt, ItlBudgetOpt, LogLevelOpt, MaxTokensOpt, MinPOpt, ModelOpt, PrefillChunkOpt,
    RepeatPenaltyOpt, SeedOpt, TempOpt, TopKOpt, TopPOpt,
)

PromptArg = Annotated[
    Optional[str], typer.Argument(help="The prompt; read from stdin when omitted.", show_default=False)
]


def generate(
    prompt: PromptArg = None,
    model: ModelOpt = None,
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
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
    log_level: LogLevelOpt = None,
) -> None:
    """Generate a completion for one prompt; text to stdout, speed stats to stderr."""
    cfg = resolve_or_exit(
        "generate", model=model, max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, ctx_size=ctx_size, prefill_chunk_size=prefill_chunk_size,
        batch_size=batch_size, itl_budget_ms=itl_budget_ms, log_level=log_level,
    )
    if prompt is None:
        prompt = "" if sys.stdin.isatty() else sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty: pass it as an argument or on stdin", code=2)
    setup_logging(log_level or "warning")  # generate prints text, not logs, unless asked
    from .generate_run import run_generate  # MLX imports happen after the BLAS preload

    run_generate(cfg, prompt, system=system, raw=raw)
