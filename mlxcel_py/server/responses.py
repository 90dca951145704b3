"""Engine events -> OpenAI's response shapes: SSE frames for streams, one JSON body otherwise.

Pure functions of a `Reply` (what a response is labelled with) and engine events; the
transport (watching the client, cutting at shutdown) lives in streaming.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Optional

from ..engine import Finished, PromptProgress, TokenDelta
from .errors import APIError, error_body

Kind = Literal["chat", "completion"]
DONE = "data: [DONE]\n\n"
CUT_REASON = "abort"  # the finish_reason of a request the server ended (shutdown, engine stop)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a response is labelled with."""

    kind: Kind
    id: str
    created: int
    model: str
    include_usage: bool = False
    return_progress: bool = False
    fingerprint: Optional[str] = None  # system_fingerprint: the build and the model


def usage_json(f: Finished) -> dict:
    u = f.usage
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def timings_json(f: Finished) -> dict:
    """llama-server's `timings` block (prompt_n counts the tokens actually prefilled)."""
    t, u = f.timings, f.usage
    prompt_n = u.prompt_tokens - u.cached_tokens
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": t.prefill_ms,
        "prompt_per_token_ms": t.prefill_ms / prompt_n if prompt_n else 0.0, "prompt_per_second": t.prompt_tps,
        "predicted_n": u.completion_tokens, "predicted_ms": t.decode_ms,
        "predicted_per_token_ms": t.decode_ms / u.completion_tokens if u.completion_tokens else 0.0,
        "predicted_per_second": t.decode_tps,
    }


def _choice(reply: Reply, text: Optional[str], finish: Optional[str], role: bool = False) -> dict:
    if reply.kind == "completion":
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    delta: dict = {"role": "assistant", "content": ""} if role else {}
    if text is not None:
        delta["content"] = text
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def chunk(reply: Reply, choices: list, **extra: Any) -> dict:
    kind = "chat.completion.chunk" if reply.kind == "chat" else "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": choices, **extra}


def final_json(reply: Reply, text: str, f: Finished) -> dict:
    """The non-streaming response body."""
    if reply.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": f.finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": f.finish_reason}
        kind = "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": [choice], "usage": usage_json(f),
            "timings": timings_json(f)}


def failure(f: Finished) -> APIError:
    """A request that ended without a normal finish reason."""
    if f.finish_reason == "abort":
        return APIError(503, f.error or "the request was aborted", code="server_shutting_down")
    return APIError(500, f.error or "the engine failed on this request", code="engine_error")


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def role_frame(reply: Reply) -> list[str]:
    """A chat stream opens with the assistant's role; a completions stream has no such frame."""
    return [sse(chunk(reply, [_choice(reply, None, None, role=True)]))] if reply.kind == "chat" else []


def event_frames(reply: Reply, event: Any) -> list[str]:
    """The SSE frames of one engine event (none for progress unless asked, or an empty delta)."""
    if isinstance(event, PromptProgress):
        if not reply.return_progress:
            return []
        progress = {"total": event.total, "cache": event.cache, "processed": event.processed,
                    "time_ms": event.time_ms}
        return [sse(chunk(reply, [_choice(reply, None, None)], prompt_progress=progress))]
    if isinstance(event, TokenDelta):
        return [sse(chunk(reply, [_choice(reply, event.text, None)]))] if event.text else []
    frames = [sse(chunk(reply, [_choice(reply, event.text, None)]))] if event.text else []
    if event.finish_reason not in ("stop", "length"):
        return frames + ended_frames(reply, event.finish_reason, failure(event))
    last = [chunk(reply, [_choice(reply, None, event.finish_reason)])]
    if reply.include_usage:
        last.append(chunk(reply, [], usage=usage_json(event)))
    last[-1]["timings"] = timings_json(event)  # on the last chunk, as llama-server does
    return frames + [sse(c) for c in last]


def ended_frames(reply: Reply, finish_reason: str, error: APIError) -> list[str]:
    """A stream the server ended: a final chunk saying so, then OpenAI's error object."""
    return [sse(chunk(reply, [_choice(reply, None, finish_reason)])), sse(error.body())]


def bug_frames() -> list[str]:
    return [sse(error_body(500, "internal server error (see the server log)"))]
