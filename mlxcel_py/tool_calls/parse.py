"""The model's output -> OpenAI content and `tool_calls`, streamed as OpenAI-shaped deltas.

Text between the format's start and end markers is handed to mlx-lm's tool parser; text
outside is content. Whitespace next to a call is dropped. A call that does not parse is
returned as content rather than lost."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .render import ToolFormat

log = logging.getLogger(__name__)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_openai(self, index: Optional[int] = None) -> dict:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolCallStream:
    """Feed generated text; get OpenAI chat deltas ({"content"} or {"tool_calls": [...]}).

    With parallel_tool_calls false only the first call is returned."""

    def __init__(self, fmt: ToolFormat, tools: Optional[list] = None, parallel: bool = True,
                 new_id: Callable[[], str] = new_call_id):
        self.fmt, self.tools, self.parallel, self.new_id = fmt, tools, parallel, new_id
        self.calls: list[ToolCall] = []
        self._buffer = ""  # text not yet released
        self._in_call = False
        self._after_call = False  # drop whitespace right after a call

    @property
    def called(self) -> bool:
        """At least one call was made: finish_reason is "tool_calls"."""
        return bool(self.calls)

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        while True:
            marker = self.fmt.end if self._in_call else self.fmt.start
            at = self._buffer.find(marker)
            if at < 0:
                break
            before, self._buffer = self._buffer[:at], self._buffer[at + len(marker) :]
            if self._in_call:
                deltas += self._call(before)
            else:
                deltas += self._content(before.rstrip())
            self._in_call = not self._in_call
        if not self._in_call:
            keep = _held_prefix(self._buffer, self.fmt.start)
            ready = self._buffer[: len(self._buffer) - keep]
            body = ready.rstrip()  # trailing whitespace waits: a call may follow it
            deltas += self._content(body)
            self._buffer = ready[len(body) :] + self._buffer[len(ready) :]
        return deltas

    def finish(self) -> list[dict]:
        """Release what is held at the end of generation (an unterminated call is parsed if it can be)."""
        rest, self._buffer = self._buffer, ""
        if self._in_call:
            self._in_call = False
            return self._call(rest, closed=False)
        return self._content(rest)

    def _content(self, text: str) -> list[dict]:
        if self._after_call:
            text = text.lstrip()
        if not text:
            return []
        self._after_call = False
        return [{"content": text}]

    def _call(self, body: str, closed: bool = True) -> list[dict]:
        self._after_call = True
        try:
            parsed = self.fmt.parse(body.strip(), self.tools)
            items = [_as_call(item) for item in (parsed if isinstance(parsed, list) else [parsed])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("tool call did not parse (%s); returned as content", exc)
            self._after_call = False
            return [{"content": f"{self.fmt.start}{body}{self.fmt.end if closed else ''}"}]
        deltas = []
        for call_id, name, arguments in items:
            if self.calls and not self.parallel:
                break
            call = ToolCall(call_id or self.new_id(), name, arguments)
            deltas.append({"tool_calls": [call.to_openai(index=len(self.calls))]})
            self.calls.append(call)
        return deltas


def _as_call(item: dict) -> tuple[Optional[str], str, str]:
    """(id or None, name, arguments as JSON text) of one parsed call; raises on a malformed one."""
    name, args = item["name"], item.get("arguments", {})
    if not isinstance(name, str):
        raise TypeError(f"the call's name is {type(name).__name__}, not a string")
    return item.get("id"), name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
