"""The Responses API's reply shapes: the `response` object, its `output` items (`reasoning` with
`reasoning_text` parts, `message` with `output_text` parts, `function_call`), and the item events
a stream sends as they are written.

`Output` is fed the parts an Assembler makes of engine events (text, whole tool calls) and
returns the item events; a non-streaming reply feeds the same parts and keeps only the items,
so both paths build the same output. A call cut by max_output_tokens is a `function_call` item
with `status: "incomplete"` and its arguments as far as they were written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Optional

from ...engine import Finished
from ..generation.assembler import Part, Shape, ToolParsing
from ..generation.reasoning import ReasoningStart
from .conversation import output_messages
from .store import StoredResponse


@dataclass(frozen=True, slots=True)
class ResponsesReply:
    """What a response is labelled with: its id, the request fields it reports (`echo`), how to
    read tool calls out of its text, the conversation it continues, and whether to store it."""

    id: str
    created_at: int
    model: str
    prompt_tokens: int
    echo: dict = field(default_factory=dict)
    tools: Optional[ToolParsing] = None  # None: no tool calls are parsed (none given, or choice "none")
    history: tuple[dict, ...] = ()  # earlier turns and this input, in OpenAI's chat form
    store: bool = True
    reasoning: Optional[ReasoningStart] = None  # the thinking becomes a `reasoning` item (--reasoning-format)

    @property
    def shape(self) -> Shape:
        """What the Assembler reads out of the text: the thinking, then tool calls in the answer."""
        return Shape(tools=self.tools, reasoning=self.reasoning)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(f: Finished, reasoning_tokens: int = 0) -> dict:
    u = f.usage
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def outcome(f: Finished) -> tuple[str, Optional[dict]]:
    """(status, incomplete_details) of a request that finished normally."""
    if f.finish_reason == "length":  # max_output_tokens, or the slot's context ran out first
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_json(reply: ResponsesReply, status: str, output: list[dict], *, usage: Optional[dict] = None,
                  incomplete: Optional[dict] = None, error: Optional[dict] = None,
                  completed_at: Optional[int] = None) -> dict:
    """The `response` object."""
    return {"id": reply.id, "object": "response", "created_at": reply.created_at, "status": status,
            "completed_at": completed_at, "error": error, "incomplete_details": incomplete, "model": reply.model,
            "output": output, "usage": usage, **reply.echo}


def stored(reply: ResponsesReply, body: dict) -> StoredResponse:
    """What the store keeps of a finished response: its JSON and the conversation it ends."""
    return StoredResponse(body, reply.history + tuple(output_messages(body["output"])))


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class Output:
    """A response's output items, written as parts arrive; each call returns the item events."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._index: dict[str, int] = {}  # item id -> output_index
        self._message: Optional[dict] = None  # the message item being written

    def add(self, part: Part) -> list[dict]:
        events = self._think(part.reasoning) if part.reasoning else []
        events += self._text(part.text) if part.text else []
        for i, call in enumerate(part.tool_calls):
            cut = part.partial and i == len(part.tool_calls) - 1
            events += self._close("completed") + self._call(call, "incomplete" if cut else "completed")
        return events

    def finish(self, status: str) -> list[dict]:
        """Close the open item (`status`: completed or incomplete); a reply with no answer (nothing,
        or thinking alone) ends with one empty message."""
        events = self._close(status) if self._message is not None and self._message["type"] == "reasoning" else []
        if not any(item["type"] != "reasoning" for item in self.items):
            events += self._open()
        return events + self._close(status)

    def _where(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self._index[item["id"]]}

    def _append(self, item: dict) -> int:
        self._index[item["id"]] = len(self.items)
        self.items.append(item)
        return len(self.items) - 1

    def _open(self) -> list[dict]:
        item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        added = {"type": "response.output_item.added", "output_index": self._append(item), "item": _copy(item)}
        self._message = item
        item["content"].append(_text_part(""))
        return [added, {"type": "response.content_part.added", **self._where(item), "content_index": 0,
                        "part": _text_part("")}]

    def _think(self, text: str) -> list[dict]:
        """The thinking comes first: one reasoning item, open until the answer starts."""
        events = []
        if self._message is None:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "encrypted_content": None,
                    "status": "in_progress"}
            events.append({"type": "response.output_item.added", "output_index": self._append(item),
                           "item": _copy(item)})
            self._message = item
            item["content"].append(_reasoning_part(""))
            events.append({"type": "response.content_part.added", **self._where(item), "content_index": 0,
                           "part": _reasoning_part("")})
        item = self._message
        item["content"][0]["text"] += text
        return events + [{"type": "response.reasoning_text.delta", **self._where(item), "content_index": 0,
                          "delta": text}]

    def _text(self, text: str) -> list[dict]:
        if self._message is not None and self._message["type"] == "reasoning":
            events = self._close("completed")
        else:
            events = []
        events += self._open() if self._message is None else []
        item = self._message
        item["content"][0]["text"] += text
        return events + [{"type": "response.output_text.delta", **self._where(item), "content_index": 0,
                          "delta": text, "logprobs": []}]

    def _close(self, status: str) -> list[dict]:
        item, self._message = self._message, None
        if item is None:
            return []
        item["status"] = status
        part, where = item["content"][0], self._where(item)
        done = {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"],
                "logprobs": []}
        if item["type"] == "reasoning":
            done = {"type": "response.reasoning_text.done", **where, "content_index": 0, "text": part["text"]}
        return [done,
                {"type": "response.content_part.done", **where, "content_index": 0, "part": dict(part)},
                {"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(item)}]

    def _call(self, call: dict, status: str) -> list[dict]:
        fn = call["function"]
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                "name": fn["name"], "arguments": ""}
        added = {"type": "response.output_item.added", "output_index": self._append(item), "item": dict(item)}
        item.update(arguments=fn["arguments"], status=status)
        where = self._where(item)
        return [added, {"type": "response.function_call_arguments.delta", **where, "delta": fn["arguments"]},
                {"type": "response.function_call_arguments.done", **where, "name": fn["name"],
                 "arguments": fn["arguments"]},
                {"type": "response.output_item.done", "output_index": where["output_index"], "item": dict(item)}]


def _reasoning_part(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def _copy(item: dict) -> dict:
    return {**item, "content": [dict(p) for p in item["content"]]}


def final_json(reply: ResponsesReply, output: Output, f: Finished, now: int, reasoning_tokens: int = 0) -> dict:
    """The response of a request that finished normally (its output closed)."""
    status, incomplete = outcome(f)
    return response_json(reply, status, output.items, usage=usage_json(f, reasoning_tokens), incomplete=incomplete,
                         completed_at=now)


def failed_json(reply: ResponsesReply, output: Output, message: str) -> dict:
    """The response of a request that ended badly (the server's cut, an engine failure, a bug)."""
    return response_json(reply, "failed", output.items, error={"code": "server_error", "message": message})
