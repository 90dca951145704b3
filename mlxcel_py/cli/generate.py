"""`mlxcel-py generate`: one-shot generation through the one-slot engine, with speed stats."""

from __future__ import annotations

import sys
import uuid
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from ..config import AppConfig
from ..errors import MlxcelError
from ..logs import setup_logging
from .common import fail, resolve_or_exit
from .options import (
    CacheTypeKOpt, CacheTypeVOpt, ContextShiftOpt, CpuWeightsOpt,
    BatchSizeOpt, CtxSizeOpt, ItlBudgetOpt, LookupNgramOpt, DraftMaxOpt, DraftMinOpt, DraftModelOpt, LogLevelOpt, MaxTokensOpt, MinPOpt, ModelOpt, ThreadsOpt, PrefillChunkOpt,
    RepeatPenaltyOpt, SeedOpt, TempOpt, TopKOpt, TopPOpt,
)

if TYPE_CHECKING:
    from ..engine import EngineStats, Finished, RequestHandle

PromptArg = Annotated[
    Optional[str], typer.Argument(help="The prompt; read from stdin when omitted.", show_default=False)
]


def generate(
    prompt: PromptArg = None,
    model: ModelOpt = None,
    threads: ThreadsOpt = None,
    cpu_weights: CpuWeightsOpt = None,
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
    lookup_ngram: LookupNgramOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = None,
    draft_model: DraftModelOpt = None,
    context_shift: ContextShiftOpt = None,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    log_level: LogLevelOpt = None,
) -> None:
    """Generate a completion for one prompt; text to stdout, speed stats to stderr."""
    cfg = resolve_or_exit(
        "generate", model=model, threads=threads, cpu_weights=cpu_weights,
        max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, ctx_size=ctx_size, prefill_chunk_size=prefill_chunk_size,
        batch_size=batch_size, itl_budget_ms=itl_budget_ms, lookup_ngram=lookup_ngram, draft_max=draft_max, draft_min=draft_min, draft_model=draft_model,
        context_shift=context_shift, cache_type_k=cache_type_k, cache_type_v=cache_type_v, log_level=log_level,
    )
    if prompt is None:
        prompt = "" if sys.stdin.isatty() else sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty: pass it as an argument or on stdin", code=2)
    setup_logging(log_level or "warning")  # generate prints text, not logs, unless asked
    run_generate(cfg, prompt, system=system, raw=raw)


def run_generate(cfg: AppConfig, prompt: str, *, system: Optional[str], raw: bool) -> "Finished":
    """Load, generate, print; returns the final event (tests read its usage and timings)."""
    from .loading import load_draft_or_exit, load_or_exit  # preloads the BLAS before anything imports MLX

    err = Console(stderr=True, highlight=False)
    loaded = load_or_exit(cfg, err)
    draft = load_draft_or_exit(cfg, loaded, err)
    from ..engine import Request, engine_session
    from ..models import encode_chat, encode_text

    try:
        if raw:
            ids, boundary = encode_text(loaded.tokenizer, prompt), None
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            chat = encode_chat(loaded.tokenizer, messages)
            ids, boundary = chat.ids, chat.history_boundary
        with engine_session(cfg.engine, loaded, draft=draft) as worker:
            done = _stream(worker.submit(Request(f"gen-{uuid.uuid4().hex[:8]}", tuple(ids), cfg.sampling, boundary)))
        stats = worker.stats()  # the last tick's snapshot, taken once the thread has stopped
    except MlxcelError as exc:
        fail(str(exc), code=2)
    if done.finish_reason == "error":
        fail(done.error or "generation failed")
    _print_stats(err, done, stats)
    return done


def _stream(handle: "RequestHandle") -> "Finished":
    from ..engine import Finished, TokenDelta

    out = sys.stdout
    for event in handle:
        if isinstance(event, TokenDelta) and event.text:
            out.write(event.text)
            out.flush()
        elif isinstance(event, Finished):
            out.write(event.text + "\n")
            out.flush()
            return event
    raise RuntimeError("the engine ended without a final event")


def _print_stats(err: Console, done: "Finished", stats: "EngineStats") -> None:
    u, t = done.usage, done.timings
    cached = f" ({u.cached_tokens} cached)" if u.cached_tokens else ""
    err.print("=" * 10)
    err.print(f"Prompt: {u.prompt_tokens} tokens{cached}, {t.prompt_tps:.1f} tokens-per-sec")
    err.print(f"Generation: {u.completion_tokens} tokens, {t.decode_tps:.1f} tokens-per-sec")
    err.print(f"Time to first token: {t.ttft_ms:.0f} ms")
    err.print(f"Peak memory: {stats.peak_memory_bytes / 1e9:.3f} GB")
