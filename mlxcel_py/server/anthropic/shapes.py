"""Anthropic's response shapes: the Message object, and its stream of named events
(message_start, ping, content_block_start/_delta/_stop, message_delta, message_stop; error).

Tool calls are read out of the text by mlxcel_py.tool_calls (the model's own format) and
become `tool_use` blocks; streamed, each call is one block whose `input` arrives as one
`input_json_delta` once the call is complete. A call cut by max_tokens is still a `tool_use`
block (stop_reason `max_tokens`): its input as far as it was written (see `_tool_use`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from ...engine import Finished, PromptProgress, TokenDelta
from ...tool_calls import ToolCall, ToolCallStream, ToolFormat, ToolRequest, arguments_object
from ..generation.reasoning import ReasoningSplit, ReasoningStart, split_whole
from ..generation.submit import failure
from ..http.errors import APIError, anthropic_error_body


@dataclass(frozen=True, slots=True)
class AnthropicReply:
    """What a Messages reply is labelled with, and how to read tool calls out of its text."""

    id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    tools: Optional[ToolRequest] = None  # None: no tool calls are parsed (none given, or choice "none")
    fmt: Optional[ToolFormat] = None
    reasoning: Optional[ReasoningStart] = None  # the thinking becomes `thinking` blocks (--reasoning-format)


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def usage_json(f: Finished) -> dict:
    """Anthropic counts prompt tokens read from the cache apart from the others."""
    u = f.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens}


def stop_reason(reply: AnthropicReply, f: Finished, called: bool) -> tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence)."""
    if f.finish_reason == "length":
        full = f.usage.completion_tokens < reply.max_tokens  # the slot's context ran out first
        return ("model_context_window_exceeded" if full else "max_tokens"), None
    if called:
        return "tool_use", None
    return ("stop_sequence", f.stop_word) if f.stop_word is not None else ("end_turn", None)


def _tool_use(call: ToolCall) -> dict:
    """`input` must be an object: a call cut short has its JSON closed as far as it was written
    (a cut string value kept, a key without its value dropped), or {} when nothing of it parses."""
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call.arguments)}


def content_blocks(reply: AnthropicReply, text: str, cut: bool = False) -> list[dict]:
    """The reply's text as content blocks, in the order the model wrote them: text, tool_use, ...
    `cut`: max_tokens ended it (a half-written call marker is dropped)."""
    tools = reply.tools
    if tools is None or reply.fmt is None:
        return [{"type": "text", "text": text}] if text else []
    stream = ToolCallStream(reply.fmt, tools.as_openai(), tools.parallel, new_tool_use_id)
    blocks: list[dict] = []
    for delta in stream.feed(text) + stream.finish(cut):
        if "content" in delta and blocks and blocks[-1]["type"] == "text":
            blocks[-1]["text"] += delta["content"]
        elif "content" in delta:
            blocks.append({"type": "text", "text": delta["content"]})
        blocks += [_tool_use(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]))
                   for c in delta.get("tool_calls", ())]
    return blocks


def thinking_block(text: str) -> dict:
    """Our thinking carries an empty signature: nothing signs it, nothing checks it."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def message_json(reply: AnthropicReply, text: str, f: Finished) -> dict:
    """The non-streaming reply: the thinking first, then the answer's blocks."""
    thought, answer = split_whole(reply.reasoning, text)
    answer_blocks = content_blocks(reply, answer, f.finish_reason != "stop")
    blocks = ([thinking_block(thought)] if thought else []) + answer_blocks
    reason, sequence = stop_reason(reply, f, any(b["type"] == "tool_use" for b in blocks))
    return {"id": reply.id, "type": "message", "role": "assistant", "model": reply.model, "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_json(f)}


def event(kind: str, **data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


@dataclass
class AnthropicFramer:
    """The event stream of one Messages reply."""

    reply: AnthropicReply
    calls: Optional[ToolCallStream] = None
    split: Optional[ReasoningSplit] = None
    index: int = -1  # the current content block
    text_open: bool = False
    thinking_open: bool = False
    called: bool = False

    def __post_init__(self) -> None:
        if self.reply.reasoning is not None:
            self.split = ReasoningSplit(self.reply.reasoning)
        tools = self.reply.tools
        if tools is not None and self.reply.fmt is not None:
            self.calls = ToolCallStream(self.reply.fmt, tools.as_openai(), tools.parallel, new_tool_use_id)

    def opening(self) -> list[str]:
        usage = {"input_tokens": self.reply.prompt_tokens, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": self.reply.id, "type": "message", "role": "assistant", "model": self.reply.model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        return [event("message_start", message=message), event("ping")]

    def frames(self, item: Any) -> list[str]:
        if isinstance(item, PromptProgress):
            return [event("ping")]  # keeps the connection visibly alive through a long prefill
        if isinstance(item, TokenDelta):
            return self._deltas(item.text)
        out = self._deltas(item.text) if item.text else []
        if item.finish_reason not in ("stop", "length"):
            return out + self.cut(failure(item))
        if self.split is not None:
            out += self._split(*self.split.finish())
        if self.calls is not None:
            out += self._apply(self.calls.finish(cut=item.finish_reason != "stop"))
        out += self._close()
        reason, sequence = stop_reason(self.reply, item, self.called)
        return out + [event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                            usage=usage_json(item)), event("message_stop")]

    def _deltas(self, text: str) -> list[str]:
        if self.split is not None:  # thinking first: the tool-call parser sees only the answer
            return self._split(*self.split.feed(text))
        return self._answer(text)

    def _split(self, thought: str, answer: str) -> list[str]:
        out = []
        if thought:
            if not self.thinking_open:
                self.index += 1
                self.thinking_open = True
                out.append(event("content_block_start", index=self.index, content_block=thinking_block("")))
            out.append(event("content_block_delta", index=self.index,
                             delta={"type": "thinking_delta", "thinking": thought}))
        return out + (self._close_thinking() if answer else []) + self._answer(answer)

    def _close_thinking(self) -> list[str]:
        if not self.thinking_open:
            return []
        self.thinking_open = False  # Anthropic's order: the signature, then the block's stop
        return [event("content_block_delta", index=self.index, delta={"type": "signature_delta", "signature": ""}),
                event("content_block_stop", index=self.index)]

    def _answer(self, text: str) -> list[str]:
        if not text:
            return []
        return self._apply(self.calls.feed(text) if self.calls is not None else [{"content": text}])

    def _apply(self, deltas: list[dict]) -> list[str]:
        out: list[str] = []
        for delta in deltas:
            if "content" in delta:
                if not self.text_open:
                    self.index += 1
                    self.text_open = True
                    out.append(event("content_block_start", index=self.index,
                                     content_block={"type": "text", "text": ""}))
                out.append(event("content_block_delta", index=self.index,
                                 delta={"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls", ()):
                out += self._close()
                self.called = True
                self.index += 1
                fn = call["function"]
                start = {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}
                out += [event("content_block_start", index=self.index, content_block=start),
                        event("content_block_delta", index=self.index,
                              delta={"type": "input_json_delta", "partial_json": fn["arguments"]}),
                        event("content_block_stop", index=self.index)]
        return out

    def _close(self) -> list[str]:
        if self.thinking_open:  # the reply ended while thinking
            return self._close_thinking()
        if not self.text_open:
            return []
        self.text_open = False
        return [event("content_block_stop", index=self.index)]

    def cut(self, error: APIError) -> list[str]:
        return [f"event: error\ndata: {json.dumps(anthropic_error_body(error.status, error.message))}\n\n"]

    def bug(self) -> list[str]:
        return self.cut(APIError(500, "internal server error (see the server log)"))

    def closing(self) -> list[str]:
        return []

