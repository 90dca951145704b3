"""A reasoning model's thinking kept apart from its answer (`--reasoning-format deepseek|auto`):
the markers found at load, and a stream splitter that sends the text between them to
`reasoning_content` and the rest to the answer (and to the tool-call parser).

The thinking may open in the prompt (DeepSeek-R1's template ends its generation prompt with
`<think>`), else it must open the output; only one block, at the start, is thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# Templates that think with <think>...</think> although their text never says so.
_THINKING_BUILTINS = ("qwen3", "bailing-think")
_DEFAULT_MARKERS = ("<think>", "</think>")


@dataclass(frozen=True, slots=True)
class ReasoningMarkers:
    """Where thinking starts and ends in the model's output."""

    start: str
    end: str


@dataclass(frozen=True, slots=True)
class ReasoningStart:
    """A reply's split: the markers, and whether the prompt already opened the thinking."""

    markers: ReasoningMarkers
    open: bool = False


def reasoning_markers(tokenizer: Any, template_text: str, builtin: Optional[str], fmt: str
                      ) -> Optional[ReasoningMarkers]:
    """The thinking markers of this model with this template, or None (no split): the
    vocabulary's (as mlx-lm finds them), else <think>, when the template opens them."""
    if fmt == "none":
        return None
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    if not (isinstance(start, str) and isinstance(end, str)):
        start, end = _DEFAULT_MARKERS
    if builtin in _THINKING_BUILTINS and start == "<think>":
        return ReasoningMarkers(start, end)
    return ReasoningMarkers(start, end) if start in template_text and end in template_text else None


def opens_thinking(prompt_tail: str, markers: ReasoningMarkers) -> bool:
    """Whether the prompt's end (decoded) leaves a thinking block open for the model."""
    text = prompt_tail.rstrip()
    return text.endswith(markers.start)


def _held(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker` (held back until known)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplit:
    """Feed the output text in order; get (reasoning, answer) text as it becomes certain.

    Whitespace around the thinking is dropped, so a stream's pieces join to what the whole
    reply carries."""

    def __init__(self, start: ReasoningStart):
        self.markers = start.markers
        self.state = "think" if start.open else "start"  # start -> think -> after -> answer
        self.buf = ""
        self._began = False  # some thinking text has been sent

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = answer = ""
        if self.state == "start":
            self._open()
        if self.state == "think":
            reasoning = self._think()
        if self.state == "after":  # the whitespace after the end marker is dropped
            self.buf = self.buf.lstrip()
            self.state = "answer" if self.buf else "after"
        if self.state == "answer":
            answer, self.buf = self.buf, ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """The rest at the end of the reply: unterminated thinking stays thinking."""
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return self._thought(rest.rstrip()), ""
        return "", rest if self.state == "start" else ""

    def _open(self) -> None:
        head = self.buf.lstrip()
        if head.startswith(self.markers.start):
            self.buf, self.state = head[len(self.markers.start):], "think"
        elif not self.markers.start.startswith(head):  # it cannot become the marker: all answer
            self.state = "answer"

    def _think(self) -> str:
        at = self.buf.find(self.markers.end)
        if at >= 0:
            thought, self.buf = self.buf[:at], self.buf[at + len(self.markers.end):]
            self.state = "after"
            return self._thought(thought.rstrip())
        keep = _held(self.buf, self.markers.end)
        ready, pending = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        sure = ready.rstrip()  # trailing whitespace waits: it may precede the end marker
        self.buf = ready[len(sure):] + pending
        return self._thought(sure)

    def _thought(self, text: str) -> str:
        if not self._began:
            text = text.lstrip()
            self._began = bool(text)
        return text


def reply_reasoning(markers: Optional[ReasoningMarkers], tokenizer: Any, ids: tuple[int, ...]
                    ) -> Optional[ReasoningStart]:
    """How a reply to the prompt `ids` splits (None: no split): the markers, and whether the
    prompt's end already opened the thinking."""
    if markers is None:
        return None
    return ReasoningStart(markers, opens_thinking(tokenizer.decode(list(ids[-8:])), markers))


def split_whole(start: Optional[ReasoningStart], text: str) -> tuple[str, str]:
    """A whole reply's (reasoning, answer)."""
    if start is None:
        return "", text
    split = ReasoningSplit(start)
    reasoning, answer = split.feed(text)
    rest = split.finish()
    return reasoning + rest[0], answer + rest[1]
