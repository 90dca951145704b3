"""Engine events -> Ollama's reply shapes: one JSON object a line while streaming (`done: false`
pieces, then the final object with `done_reason` and the statistics), or the final object alone.

/api/chat pieces carry `message` (`content`, a reasoning model's `thinking`, and `tool_calls`
with arguments as objects; a call cut by num_predict has its arguments as far as they were
written, `done_reason: "length"`), /api/generate pieces `response` (and `thinking`); generate's final
object adds `context` (the prompt's and the reply's token ids). Durations are nanoseconds from the engine's own timings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from ...engine import Finished, PromptProgress, TokenDelta
from ...tool_calls import arguments_object
from ..generation.assembler import Assembler, Part, Shape, merge
from ..generation.logprobs import TokenRow
from ..generation.submit import failure
from ..http.errors import APIError

Kind = Literal["chat", "generate"]
NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class OllamaReply:
    """What a reply is labelled with: the route, the served id, when the body arrived, the prompt."""

    kind: Kind
    model: str
    arrived: float  # time.perf_counter() when the body arrived: total_duration runs from here
    prompt_ids: tuple[int, ...] = ()
    shape: Shape = Shape()


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def stats_json(reply: OllamaReply, f: Finished) -> dict:
    """Ollama's statistics: prompt_eval counts the prompt tokens actually run (not read from the
    prompt cache), as Ollama's own runner does; load_duration is the wait for a slot (the model
    itself is resident, nothing is loaded)."""
    t, u = f.timings, f.usage
    return {
        "total_duration": int((time.perf_counter() - reply.arrived) * 1e9),
        "load_duration": int(t.queue_ms * NS_PER_MS),
        "prompt_eval_count": u.prompt_tokens - u.cached_tokens,
        "prompt_eval_duration": int(t.prefill_ms * NS_PER_MS),
        "eval_count": u.completion_tokens,
        "eval_duration": int(t.decode_ms * NS_PER_MS),
    }


def _tool_call(call: dict) -> dict:
    """An OpenAI-form call -> Ollama's, whose arguments are an object (a cut call's JSON closed as
    far as it was written, as tool_calls.arguments_object does; {} when nothing of it parses)."""
    fn = call["function"]
    return {"id": call["id"], "function": {"index": call.get("index", 0), "name": fn["name"],
                                           "arguments": arguments_object(fn["arguments"])}}


def _logprobs(rows: list[TokenRow]) -> list[dict]:
    def entry(token: str, logprob: float, raw: list[int]) -> dict:
        return {"token": token, "logprob": logprob, "bytes": raw}

    return [{**entry(r.token, r.logprob, r.bytes),
             "top_logprobs": [entry(a.token, a.logprob, a.bytes) for a in r.top or ()]} for r in rows]


def piece_json(reply: OllamaReply, part: Part, done: bool = False) -> dict:
    """A streamed piece (or, merged, the whole reply) without its final fields."""
    out: dict = {"model": reply.model, "created_at": created_at()}
    if reply.shape.logprobs is not None:
        out["logprobs"] = _logprobs(part.rows)
    if reply.kind == "chat":
        message: dict = {"role": "assistant", "content": part.text or ""}
        if part.reasoning:
            message["thinking"] = part.reasoning
        if part.tool_calls:
            message["tool_calls"] = [_tool_call(c) for c in part.tool_calls]
        out["message"] = message
    else:
        out["response"] = part.text or ""
        if part.reasoning:
            out["thinking"] = part.reasoning
    out["done"] = done
    return out


def final_json(reply: OllamaReply, part: Part, f: Finished, generated: tuple[int, ...]) -> dict:
    """The last object: `done: true`, why, the statistics, and generate's `context`."""
    out = piece_json(reply, part, done=True)
    out["done_reason"] = f.finish_reason  # "stop" or "length", as Ollama (a tool call is "stop" there too)
    if reply.kind == "generate":
        out["context"] = list(reply.prompt_ids + generated)
    return {**out, **stats_json(reply, f)}


def whole_json(reply: OllamaReply, parts: list[Part], f: Finished, generated: tuple[int, ...]) -> dict:
    """The non-streaming reply (`stream: false`)."""
    return final_json(reply, merge(parts), f, generated)


def loaded_json(kind: Kind, model: str, unload: bool = False) -> dict:
    """The answer to a body with no prompt: Ollama's "load" reply, or its "unload" one for
    `keep_alive: 0` (several models: it unloads once idle)."""
    empty = OllamaReply(kind, model, time.perf_counter())
    return {**piece_json(empty, Part(), done=True), "done_reason": "unload" if unload else "load"}


def _carries(part: Part) -> bool:
    return bool(part.text or part.reasoning or part.tool_calls or part.rows)


@dataclass
class OllamaFramer:
    """The NDJSON lines of one streamed reply (a `Framer`, generation/stream.py)."""

    reply: OllamaReply
    generated: list[int] = field(default_factory=list)
    assembler: Assembler = field(init=False)

    def __post_init__(self) -> None:
        self.assembler = Assembler(self.reply.shape)

    def opening(self) -> list[str]:
        return []

    def frames(self, event: Any) -> list[str]:
        if isinstance(event, PromptProgress):
            return []
        if isinstance(event, TokenDelta):
            self.generated.append(event.token_id)
        parts = self.assembler.feed(event)
        if not isinstance(event, Finished):
            return [line(piece_json(self.reply, p)) for p in parts if _carries(p)]
        if event.finish_reason not in ("stop", "length"):
            return [line(piece_json(self.reply, p)) for p in parts] + self.cut(failure(event))
        out = [line(piece_json(self.reply, p)) for p in parts if _carries(p)]
        return out + [line(final_json(self.reply, Part(), event, tuple(self.generated)))]

    def cut(self, error: APIError) -> list[str]:
        return [line({"error": error.message})]

    def bug(self) -> list[str]:
        return self.cut(APIError(500, "internal server error (see the server log)"))

    def closing(self) -> list[str]:
        return []
