"""The body of `generate`: one request through the one-slot engine, streamed to stdout."""

from __future__ import annotations

import sys
import uuid
from typing import Optional

from rich.console import Console

from ..config import AppConfig
from ..engine.types import EngineError, Finished, Request, TokenDelta
from .common import fail
from .loading import load_or_exit


def run_generate(cfg: AppConfig, prompt: str, *, system: Optional[str], raw: bool) -> Finished:
    """Load, generate, print; returns the final event (tests read its usage and timings)."""
    err = Console(stderr=True, highlight=False)
    loaded = load_or_exit(cfg, err)
    from ..engine.engine import build_engine
    from ..engine.worker import EngineWorker
    from ..models import encode_chat, encode_text

    try:
        if raw:
            ids, boundary = encode_text(loaded.tokenizer, prompt), None
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            chat = encode_chat(loaded.tokenizer, messages)
            ids, boundary = chat.ids, chat.history_boundary
    except ValueError as exc:
        fail(str(exc), code=2)
    worker = EngineWorker(build_engine(cfg.engine, loaded)).start()
    try:
        handle = worker.submit(Request(f"gen-{uuid.uuid4().hex[:8]}", tuple(ids), cfg.sampling, boundary))
        done = _stream(handle)
    except EngineError as exc:
        fail(str(exc), code=2)
    finally:
        worker.stop()
    if done.finish_reason == "error":
        fail(done.error or "generation failed")
    _print_stats(err, done)
    return done


def _stream(handle) -> Finished:
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


def _peak_memory_gb() -> float:
    import mlx.core as mx

    try:
        peak = mx.get_peak_memory()
    except AttributeError:
        peak = 0
    if not peak:  # the CPU backend may not track it: the process's peak RSS instead
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak / 1e9


def _print_stats(err: Console, done: Finished) -> None:
    u, t = done.usage, done.timings
    cached = f" ({u.cached_tokens} cached)" if u.cached_tokens else ""
    err.print("=" * 10)
    err.print(f"Prompt: {u.prompt_tokens} tokens{cached}, {t.prompt_tps:.1f} tokens-per-sec")
    err.print(f"Generation: {u.completion_tokens} tokens, {t.decode_tps:.1f} tokens-per-sec")
    err.print(f"Time to first token: {t.ttft_ms:.0f} ms")
    err.print(f"Peak memory: {_peak_memory_gb():.3f} GB")
