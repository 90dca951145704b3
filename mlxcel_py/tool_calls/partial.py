"""JSON cut short (a tool call stopped by max_tokens): what can be read of it.

`complete_json` closes a cut document; `arguments_object` reads a call's arguments, whole or cut,
as the object Anthropic's `input` and Ollama's `arguments` must be; `cut_call` reads the name
and the arguments text so far out of a Hermes-style `{"name": ..., "arguments": ...}` call body.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

MAX_TRIES = 16  # closings tried, from the latest safe point back: a body that is not JSON fails fast
_OPEN_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{0,3})?$")  # an escape cut before its end
_MISSING = object()


@dataclass
class _Scan:
    """One pass over cut JSON text: where it could be closed, and the top-level object's values."""

    safe: list[tuple[int, str]] = field(default_factory=list)  # (end, closers): text[:end] + closers is whole
    closers: list[str] = field(default_factory=list)  # of the containers open at the end, outermost first
    expect: list[str] = field(default_factory=list)  # per open container: "key" or "value" comes next
    string_from: Optional[int] = None  # the open string's quote, at the end
    key_string: bool = False  # the open (or last) string is an object key
    literal_from: Optional[int] = None  # a number, true, false or null being read
    key: Optional[str] = None  # the top-level key whose value comes next
    spans: dict[str, tuple[int, Optional[int]]] = field(default_factory=dict)  # top-level key -> (start, end)

    def value_start(self, at: int) -> None:
        if len(self.closers) == 1 and self.closers[0] == "}" and self.key is not None:
            self.spans[self.key] = (at, None)

    def value_end(self, at: int) -> None:
        self.safe.append((at, "".join(reversed(self.closers))))
        if len(self.closers) == 1 and self.key is not None and self.key in self.spans:
            self.spans[self.key] = (self.spans[self.key][0], at)
            self.key = None


def _scan(text: str) -> _Scan:
    s = _Scan()
    escaped = False
    for i, ch in enumerate(text):
        if s.string_from is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                _string_end(s, text, i)
            continue
        if s.literal_from is not None and (ch.isspace() or ch in ",}]:"):
            s.literal_from = None
            s.value_end(i)
        if ch == '"':
            s.string_from = i
            s.key_string = bool(s.expect) and s.expect[-1] == "key"
            if not s.key_string:
                s.value_start(i)
        elif ch in "{[":
            s.value_start(i)
            s.closers.append("}" if ch == "{" else "]")
            s.expect.append("key" if ch == "{" else "value")
            s.safe.append((i + 1, "".join(reversed(s.closers))))
        elif ch in "}]" and s.closers:
            s.closers.pop()
            s.expect.pop()
            s.value_end(i + 1)
        elif ch == ":" and s.expect:
            s.expect[-1] = "value"
        elif ch == "," and s.expect:
            s.expect[-1] = "key" if s.closers[-1] == "}" else "value"
        elif not ch.isspace() and s.literal_from is None and ch not in "}]:,":
            s.literal_from = i
            s.value_start(i)
    return s


def _string_end(s: _Scan, text: str, at: int) -> None:
    start, s.string_from = s.string_from, None
    if not s.key_string:
        s.value_end(at + 1)
    elif len(s.closers) == 1:
        try:
            s.key = json.loads(text[start : at + 1])
        except json.JSONDecodeError:
            s.key = None


def _closings(text: str, s: _Scan) -> list[str]:
    """Candidate whole documents, the most complete first."""
    closers = "".join(reversed(s.closers))
    out = []
    if s.string_from is None:
        out.append(text + closers)
    elif not s.key_string:
        out.append(_OPEN_ESCAPE.sub("", text) + '"' + closers)
    return out + [text[:end] + shut for end, shut in reversed(s.safe[-MAX_TRIES:])]


def complete_json(text: str) -> Any:
    """The value of JSON text cut short, closed as far as it can be; None when nothing parses.

    The rule: a string value cut mid-way is kept as far as it goes (a cut escape dropped); a key
    without its value, a trailing comma, and a number or literal not yet valid are dropped (with
    the key); open arrays and objects are closed. Whole JSON comes back as it is."""
    s = _scan(text)
    for candidate in _closings(text, s):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def arguments_object(text: str) -> dict:
    """A call's arguments (JSON text, whole or cut) as an object, for the dialects that send one.

    Whole JSON is parsed as is; cut JSON is closed by `complete_json` (a cut string value kept as
    far as it goes); anything that still is not an object gives {}."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = complete_json(text)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class CutCall:
    """What a call body cut short says: its name, and its arguments text as far as it was written."""

    name: str
    arguments: str
    whole: bool  # the arguments' JSON is complete (only the call's end was cut)


def cut_call(body: str) -> Optional[CutCall]:
    """The call in a Hermes-style body `{"name": ..., "arguments": ...}` cut before its end; None
    when its name is not complete (a name still being written names no function)."""
    body = body.strip()
    if not body.startswith("{"):
        return None
    s = _scan(body)
    name = _value(body, s.spans.get("name"))
    if not isinstance(name, str) or not name:
        return None
    start, end = s.spans.get("arguments", (len(body), None))
    value = _value(body, (start, end))
    if value is _MISSING:
        return CutCall(name, body[start:end].rstrip(), False)
    # Whole arguments read as a whole call's are: JSON text (given as a string by some templates).
    return CutCall(name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), True)


def _value(text: str, span: Optional[tuple[int, Optional[int]]]) -> Any:
    """The JSON value at a closed span; `_MISSING` for an open or absent one."""
    if span is None or span[1] is None:
        return _MISSING
    try:
        return json.loads(text[span[0] : span[1]])
    except json.JSONDecodeError:
        return _MISSING
