"""The model's output -> OpenAI content and `tool_calls`, streamed as OpenAI-shaped deltas.

Text between the format's start and end markers is handed to mlx-lm's tool parser; text
outside is content. Whitespace next to a call is dropped. A closed call that does not parse is
returned as content rather than lost. A call cut short (max_tokens, or the reply ending before
its end marker) is still a call, never markup: see `ToolCallStream.finish`."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .partial import cut_call
from .render import ToolFormat

log = logging.getLogger(__name__)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it; cut short when `partial`
    partial: bool = False  # cut before its arguments were complete

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
    """Feed generated text; get OpenAI chat deltas ({"content"} or {"tool_calls": [...]}, with
    `"partial": True` beside a call cut short).

    With parallel_tool_calls false only the first call is returned. A format whose end marker is
    empty (Mistral's) writes its calls up to the end of the reply."""

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
        while not (self._in_call and not self.fmt.end):
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

    def finish(self, cut: bool = False) -> list[dict]:
        """Release what is held at the end of generation; `cut`: max_tokens (or an error) ended it.

        An unterminated call is a call: parsed whole if only its end marker is missing, else read
        by `_cut`. Text held as the possible start of a call is dropped at a cut (it was markup
        being written) and released as content when the reply really ended with it."""
        rest, self._buffer = self._buffer, ""
        if self._in_call:
            self._in_call = False
            return self._unterminated(rest)
        if cut:
            rest = rest[: len(rest) - _held_prefix(rest, self.fmt.start)].rstrip()
        return self._content(rest)

    def _unterminated(self, body: str) -> list[dict]:
        if self.fmt.end:  # the end marker's first characters, written before the cut
            body = body[: len(body) - _held_prefix(body, self.fmt.end)]
        try:
            return self._calls(self._parsed(body))
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._cut(body)

    def _cut(self, body: str) -> list[dict]:
        """A call cut before its end, as far as it goes: the name and the arguments text so far.

        Only the JSON format can be read part-way. A call whose name is not complete, or not one of
        the request's tools, names no function and is dropped (logged); so is a cut call in a
        format whose parser cannot read it. Nothing of it becomes content."""
        found = cut_call(body) if self.fmt.json_calls else None
        names = {t.get("function", {}).get("name") for t in self.tools or ()}
        if found is None or (self.tools and found.name not in names):
            log.warning("a tool call cut short names no function it can be returned as; dropped: %r", body[:200])
            self._after_call = True
            return []
        return self._calls([(None, found.name, found.arguments)], partial=not found.whole)

    def _content(self, text: str) -> list[dict]:
        if self._after_call:
            text = text.lstrip()
        if not text:
            return []
        self._after_call = False
        return [{"content": text}]

    def _parsed(self, body: str) -> list[tuple[Optional[str], str, str]]:
        """The calls in a call body, by the format's parser; raises when it does not parse."""
        parsed = self.fmt.parse(body.strip(), self.tools)
        return [_as_call(item) for item in (parsed if isinstance(parsed, list) else [parsed])]

    def _call(self, body: str) -> list[dict]:
        try:
            items = self._parsed(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("tool call did not parse (%s); returned as content", exc)
            self._after_call = False
            return [{"content": f"{self.fmt.start}{body}{self.fmt.end}"}]
        return self._calls(items)

    def _calls(self, items: list[tuple[Optional[str], str, str]], partial: bool = False) -> list[dict]:
        self._after_call = True
        deltas = []
        for call_id, name, arguments in items:
            if self.calls and not self.parallel:
                break
            call = ToolCall(call_id or self.new_id(), name, arguments, partial)
            delta: dict[str, Any] = {"tool_calls": [call.to_openai(index=len(self.calls))]}
            deltas.append({**delta, "partial": True} if partial else delta)
            self.calls.append(call)
        return deltas


def _as_call(item: dict) -> tuple[Optional[str], str, str]:
    """(id or None, name, arguments as JSON text) of one parsed call; raises on a malformed one."""
    name, args = item["name"], item.get("arguments", {})
    if not isinstance(name, str):
        raise TypeError(f"the call's name is {type(name).__name__}, not a string")
    return item.get("id"), name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
