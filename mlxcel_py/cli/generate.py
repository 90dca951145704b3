"""`mlxcel-py generate`: one-shot generation through the one-slot engine, with speed stats."""

from __future__ import annotations

import sys
import uuid
from typing import TYPE_CHECKING, Optional

from rich.console import Console

from ..config import AppConfig
from ..errors import MlxcelError
from ..flags import GenerateFlags
from ..logs import setup_logging
from .common import fail, resolve_or_exit
from .parse import parses

if TYPE_CHECKING:
    from ..engine import EngineStats, Finished, RequestHandle


@parses(GenerateFlags)
def generate(flags: GenerateFlags) -> None:
    """Generate a completion for one prompt; text to stdout, speed stats to stderr."""
    cfg = resolve_or_exit("generate", flags)
    prompt = flags.prompt
    if prompt is None:
        prompt = "" if sys.stdin.isatty() else sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty: pass it as an argument or on stdin", code=2)
    setup_logging(flags.log_level or "warning")  # generate prints text, not logs, unless asked
    run_generate(cfg, prompt, system=flags.system, raw=flags.raw)


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
