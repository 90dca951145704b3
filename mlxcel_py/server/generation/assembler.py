"""One request's engine events -> the parts of its reply: text, tool calls, logprobs, echo.

Stateful per request (a tool-call parser, character offsets, logprobs waiting for text), and
shared by streams (one chunk per part) and whole responses (the parts merged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ...engine import Finished, PromptProgress, TokenDelta
from ...tool_calls import ToolCallStream, ToolFormat
from .logprobs import RowMaker, TokenPieces, TokenRow
from .reasoning import ReasoningSplit, ReasoningStart


@dataclass(frozen=True, slots=True)
class ToolParsing:
    """How to find tool calls in the output: the model's format and the request's tools."""

    format: ToolFormat
    tools: tuple[dict, ...]
    parallel: bool
    legacy: bool = False  # the deprecated functions API: `function_call` instead of `tool_calls`


@dataclass(frozen=True, slots=True)
class Shape:
    """What the reply carries beyond plain text."""

    logprobs: Optional[int] = None  # alternatives per token, when logprobs were asked
    echo: Optional[str] = None  # completions' echo: the prompt text, returned first
    echo_first_token: int = 0  # the prompt's first token (the engine scores it as None)
    hide_output: bool = False  # echo with max_tokens 0: the one generated token is not returned
    tools: Optional[ToolParsing] = None
    pieces: Optional[TokenPieces] = None  # token bytes, when logprobs were asked
    reasoning: Optional[ReasoningStart] = None  # thinking goes to `reasoning` (--reasoning-format)


@dataclass(slots=True)
class Part:
    """One piece of a reply: a stream sends each as a chunk."""

    text: Optional[str] = None
    tool_calls: list[dict] = field(default_factory=list)  # whole calls, OpenAI delta shape (with index)
    rows: list[TokenRow] = field(default_factory=list)
    reasoning: Optional[str] = None  # the model's thinking, apart from the answer
    partial: bool = False  # its (last) tool call was cut short: arguments as far as they were written


class Assembler:
    """Feed a request's events in order; get the parts they release."""

    def __init__(self, shape: Shape):
        self.shape = shape
        tools = shape.tools
        self.calls = ToolCallStream(tools.format, list(tools.tools), tools.parallel) if tools else None
        self.split = ReasoningSplit(shape.reasoning) if shape.reasoning else None
        self.reasoning_tokens = 0  # generated tokens of the thinking, its markers included
        self._rows: list[TokenRow] = []  # generated tokens' rows not yet sent
        self._prompt_rows: list[TokenRow] = []
        self._echo_pending = shape.echo is not None
        echoed = len(shape.echo) if shape.echo is not None else 0
        pieces = shape.pieces
        self._prompt = RowMaker(pieces) if pieces else None
        self._generated = RowMaker(pieces, echoed) if pieces else None

    @property
    def called(self) -> bool:
        return self.calls is not None and self.calls.called

    def finish_reason(self, reason: str) -> str:
        """The engine's finish reason, or OpenAI's for a reply that made tool calls."""
        if reason == "stop" and self.called:
            return "function_call" if self.shape.tools.legacy else "tool_calls"
        return reason

    def feed(self, event: Any) -> list[Part]:
        if isinstance(event, PromptProgress):
            if self._echo_pending and self._prompt is not None:
                first = self.shape.echo_first_token
                self._prompt_rows += [self._prompt.row(lp, first) for lp in event.logprobs]
            return []
        parts = self._echo()
        if isinstance(event, TokenDelta):
            if self.shape.hide_output:
                return parts
            if self._generated is not None and event.logprobs is not None:
                self._rows.append(self._generated.row(event.logprobs))
            thinking = self.split is not None and self.split.state == "think"
            parts += self._text(event.text)
            self.reasoning_tokens += thinking or (self.split is not None and self.split.state == "think")
            return parts
        return parts + self._end(event)

    def _end(self, event: Finished) -> list[Part]:
        if self.shape.hide_output:
            return []
        parts = self._text(event.text)
        if self.split is not None:
            parts += self._answer(*self.split.finish())
        if self.calls is not None:  # a cut drops a held half-written marker (markup, not text)
            parts += self._deltas(self.calls.finish(cut=event.finish_reason != "stop"))
        if self._rows:  # tokens whose text never came out (held, or a stop string's)
            parts.append(Part(text="", rows=self._take()))
        return parts

    def _echo(self) -> list[Part]:
        if not self._echo_pending:
            return []
        self._echo_pending = False
        return [Part(text=self.shape.echo, rows=self._prompt_rows)]

    def _take(self) -> list[TokenRow]:
        rows, self._rows = self._rows, []
        return rows

    def _text(self, text: str) -> list[Part]:
        if not text:
            return []
        if self.split is not None:  # thinking first: the tool-call parser sees only the answer
            return self._answer(*self.split.feed(text))
        return self._content(text)

    def _answer(self, reasoning: str, answer: str) -> list[Part]:
        parts = [Part(rows=self._take(), reasoning=reasoning)] if reasoning else []
        return parts + self._content(answer)

    def _content(self, text: str) -> list[Part]:
        if not text:
            return []
        if self.calls is None:
            return [Part(text=text, rows=self._take())]
        return self._deltas(self.calls.feed(text))

    def _deltas(self, deltas: list[dict]) -> list[Part]:
        return [Part(text=d.get("content"), tool_calls=d.get("tool_calls", []), rows=self._take(),
                     partial=d.get("partial", False)) for d in deltas]


def merge(parts: list[Part]) -> Part:
    """A whole reply as one part (a cut call is always the last one)."""
    return Part("".join(p.text or "" for p in parts), [c for p in parts for c in p.tool_calls],
                [r for p in parts for r in p.rows], "".join(p.reasoning or "" for p in parts) or None,
                any(p.partial for p in parts))
