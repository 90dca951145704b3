"""Engine events -> OpenAI's response shapes: SSE frames for streams, one JSON body otherwise.

Functions of a `Reply` (what a response is labelled with) and the parts an `Assembler`
makes of engine events; the transport (watching the client, cutting at shutdown) lives in
generation/submit.py and generation/stream.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from ...engine import Finished, PromptProgress
from ..generation.assembler import Assembler, Part, Shape, merge
from ..generation.logprobs import TokenRow, chat_logprobs, legacy_logprobs
from ..generation.stream import sse
from ..generation.submit import failure
from ..generation.usage import timings_json
from ..http.errors import APIError, error_body

Kind = Literal["chat", "completion"]
DONE = "data: [DONE]\n\n"
CUT_REASON = "abort"  # the finish_reason of a request the server ended (shutdown, engine stop)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a response is labelled with, and what it carries beyond text."""

    kind: Kind
    id: str
    created: int
    model: str
    include_usage: bool = False
    return_progress: bool = False
    shape: Shape = Shape()
    fingerprint: Optional[str] = None  # system_fingerprint: the build and the model
    index: int = 0  # the choice this reply's events make (n > 1: choices.py)
    choices: int = 1  # the request's n


def usage_json(f: Finished, hidden: bool = False) -> dict:
    """`hidden`: the generated token was not returned (echo with max_tokens 0), so not counted."""
    u = f.usage
    completion = 0 if hidden else u.completion_tokens
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": completion,
        "total_tokens": u.prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _logprobs(reply: Reply, rows: list[TokenRow], whole: bool = False) -> Optional[dict]:
    if reply.shape.logprobs is None or not (rows or whole):
        return None
    return chat_logprobs(rows) if reply.kind == "chat" else legacy_logprobs(rows)


def _tool_call(call: dict, legacy: bool, index: bool) -> dict:
    if legacy:
        return call["function"]
    return call if index else {k: v for k, v in call.items() if k != "index"}


def _choice(reply: Reply, part: Optional[Part], finish: Optional[str], role: bool = False) -> dict:
    """A chunk's choice: the part's text or tool calls, and its tokens' logprobs."""
    part = part or Part()
    logprobs = _logprobs(reply, part.rows)
    if reply.kind == "completion":
        return {"index": reply.index, "text": part.text or "", "logprobs": logprobs, "finish_reason": finish}
    delta: dict = {"role": "assistant", "content": ""} if role else {}
    if part.text is not None:
        delta["content"] = part.text
    if part.reasoning:
        delta["reasoning_content"] = part.reasoning
    if part.tool_calls:
        legacy = reply.shape.tools is not None and reply.shape.tools.legacy
        calls = [_tool_call(c, legacy, index=True) for c in part.tool_calls]
        delta.update({"function_call": calls[0]} if legacy else {"tool_calls": calls})
    return {"index": reply.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def chunk(reply: Reply, choices: list, **extra: Any) -> dict:
    kind = "chat.completion.chunk" if reply.kind == "chat" else "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": choices, **extra}


def _message(reply: Reply, whole: Part, called: bool) -> dict:
    message: dict = {"role": "assistant", "content": (whole.text or None) if called else whole.text}
    if whole.reasoning:
        message["reasoning_content"] = whole.reasoning
    if called:
        legacy = reply.shape.tools.legacy
        calls = [_tool_call(c, legacy, index=False) for c in whole.tool_calls]
        message.update({"function_call": calls[0]} if legacy else {"tool_calls": calls})
    return message


def assembled_json(reply: Reply, parts: list[Part], f: Finished, finish_reason: Optional[str] = None) -> dict:
    """The non-streaming response body: the parts merged into one choice."""
    whole = merge(parts)
    finish = finish_reason or f.finish_reason
    logprobs = _logprobs(reply, whole.rows, whole=True)
    if reply.kind == "chat":
        message = _message(reply, whole, bool(whole.tool_calls))
        choice = {"index": reply.index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        kind = "chat.completion"
    else:
        choice = {"index": reply.index, "text": whole.text, "logprobs": logprobs, "finish_reason": finish}
        kind = "text_completion"
    return {"id": reply.id, "object": kind, "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": [choice], "usage": usage_json(f, reply.shape.hide_output),
            "timings": timings_json(f)}


def role_frame(reply: Reply) -> list[str]:
    """A chat stream opens with the assistant's role; a completions stream has no such frame."""
    return [sse(chunk(reply, [_choice(reply, None, None, role=True)]))] if reply.kind == "chat" else []


def event_frames(reply: Reply, event: Any, assembler: Optional[Assembler] = None) -> list[str]:
    """The SSE frames of one engine event (none for progress unless asked, or an empty delta)."""
    assembler = assembler or Assembler(reply.shape)
    frames = []
    if isinstance(event, PromptProgress) and reply.return_progress:
        progress = {"total": event.total, "cache": event.cache, "processed": event.processed,
                    "time_ms": event.time_ms}
        frames.append(sse(chunk(reply, [_choice(reply, None, None)], prompt_progress=progress)))
    frames += [sse(chunk(reply, [_choice(reply, part, None)])) for part in assembler.feed(event)]
    if not isinstance(event, Finished):
        return frames
    if event.finish_reason not in ("stop", "length"):
        return frames + ended_frames(reply, event.finish_reason, failure(event))
    finish = assembler.finish_reason(event.finish_reason)
    last = [chunk(reply, [_choice(reply, None, finish)])]
    if reply.include_usage:
        last.append(chunk(reply, [], usage=usage_json(event, reply.shape.hide_output)))
    last[-1]["timings"] = timings_json(event)  # on the last chunk, as llama-server does
    return frames + [sse(c) for c in last]


def ended_frames(reply: Reply, finish_reason: str, error: APIError) -> list[str]:
    """A stream the server ended: a final chunk saying so, then OpenAI's error object."""
    return [sse(chunk(reply, [_choice(reply, None, finish_reason)])), sse(error.body())]


def bug_frames() -> list[str]:
    return [sse(error_body(500, "internal server error (see the server log)"))]


class OpenAIFramer:
    """The frames of an OpenAI stream (a `Framer`, generation/stream.py): the chat role first, a
    chunk per piece of the reply, the final chunk with usage; it always ends with [DONE]."""

    def __init__(self, reply: Reply):
        self.reply, self.assembler = reply, Assembler(reply.shape)

    def opening(self) -> list[str]:
        return role_frame(self.reply)

    def frames(self, event: Any) -> list[str]:
        return event_frames(self.reply, event, self.assembler)

    def cut(self, error: APIError) -> list[str]:
        return ended_frames(self.reply, CUT_REASON, error)

    def bug(self) -> list[str]:
        return bug_frames()

    def closing(self) -> list[str]:
        return [DONE]
