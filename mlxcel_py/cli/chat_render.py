"""Rich output of the chat REPL: streamed answers, the prefill progress line, /help and /stats.

On a terminal the answer streams raw, token by token; when it is done, contains Markdown and
still fits on the screen, it is redrawn as rendered Markdown. Piped, everything is plain text.
"""

from __future__ import annotations

import re
from typing import Optional

from rich.console import Console
from rich.markdown import Markdown
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..engine import Event, Finished, PromptProgress, TokenDelta

HELP = (
    ("/help", "show this help"),
    ("/clear", "forget the conversation (the system prompt stays)"),
    ("/system TEXT", "set the system prompt; /system alone shows it"),
    ("/stats", "speed and cache use of the last answer"),
    ("/bye, /exit", "leave (so do Ctrl-D and Ctrl-C at the prompt)"),
    ('"""', "start and end a multi-line message"),
)
# A prefill shorter than this finishes before a progress bar would be worth drawing.
PROGRESS_MIN_TOKENS = 512
_MARKDOWN = re.compile(r"(^|\n)\s*(#{1,6} |[-*+] |\d+\. |> |```)|\*\*|`[^`\n]+`|\[[^\]\n]+\]\(")


def looks_like_markdown(text: str) -> bool:
    """Headings, lists, quotes, fences, bold, inline code or links: worth rendering."""
    return bool(_MARKDOWN.search(text))


def terminal_rows(text: str, width: int) -> int:
    """Rows that `text`, written raw from column 0, occupies on a terminal `width` cells wide."""
    from rich.cells import cell_len

    return sum(max(1, -(-cell_len(line) // width)) for line in text.split("\n"))


def format_stats(done: Optional[Finished]) -> list[str]:
    """The /stats lines for the last answer."""
    if done is None:
        return ["no answer yet"]
    u, t = done.usage, done.timings
    prefilled = u.prompt_tokens - u.cached_tokens
    return [
        f"prompt: {u.prompt_tokens} tokens ({u.cached_tokens} cached, {prefilled} prefilled), "
        f"{t.prompt_tps:.1f} tokens-per-sec",
        f"generation: {u.completion_tokens} tokens, {t.decode_tps:.1f} tokens-per-sec",
        f"time to first token: {t.ttft_ms:.1f} ms",
        f"finish reason: {done.finish_reason}",
    ]


class ChatRenderer:
    """Everything the REPL shows. `interactive` means a person at a terminal: banners and hints.

    Notices (errors, hints) go to `err`; answers and command output go to `out`.
    """

    def __init__(self, out: Console, err: Console, *, interactive: bool, markdown: bool = True):
        self.out, self.err = out, err
        self.interactive = interactive
        self.markdown = markdown and interactive and out.is_terminal
        self._text = ""
        self._progress: Optional[Progress] = None

    # -- answers -----------------------------------------------------------------------
    def start_answer(self) -> None:
        self._text = ""

    def on_event(self, event: Event) -> None:
        """Show one engine event: a progress update or a piece of the answer."""
        if isinstance(event, PromptProgress):
            self._show_progress(event)
        elif isinstance(event, TokenDelta):
            self._write(event.text)
        elif isinstance(event, Finished):
            self._write(event.text)

    def end_answer(self, interrupted: bool = False, reason: str = "stop", max_tokens: int = 0) -> None:
        """Close the answer: newline(s), the Markdown redraw, and a note when it was cut short."""
        self._stop_progress()
        text, self._text = self._text, ""
        redrawn = not interrupted and self.markdown and self._redraw_markdown(text)
        if not redrawn and text and not text.endswith("\n"):
            self._raw("\n")
        if interrupted:
            kept = "; the partial answer stays in the conversation" if text else ""
            self.notice(f"(answer interrupted{kept})")
        elif reason == "length":
            self.notice(f"(answer cut at {max_tokens} tokens; raise --max-tokens for longer ones)")
        if self.interactive:
            self._raw("\n")

    def _write(self, text: str) -> None:
        if not text:
            return
        self._stop_progress()
        self._text += text
        self._raw(text)

    def _raw(self, text: str) -> None:
        # Model text is written as is: no markup, no highlighting, no wrapping by rich.
        self.out.file.write(text)
        self.out.file.flush()

    def _redraw_markdown(self, text: str) -> bool:
        """Replace the raw answer on screen with rendered Markdown, when it is all still visible."""
        if not looks_like_markdown(text) or any(c in text for c in "\t\r\x1b"):
            return False
        rows = terminal_rows(text, self.out.width)
        if rows >= self.out.height:  # part of it scrolled away: the raw text stays
            return False
        up = f"\x1b[{rows - 1}A" if rows > 1 else ""
        self._raw(f"\r{up}\x1b[J")
        self.out.print(Markdown(text))
        return True

    # -- prefill progress (terminal only) ------------------------------------------------
    def _show_progress(self, event: PromptProgress) -> None:
        if not (self.interactive and self.out.is_terminal):
            return
        if self._progress is None:
            if event.processed >= event.total or event.total - event.cache < PROGRESS_MIN_TOKENS:
                return
            self._progress = Progress(
                SpinnerColumn(), TextColumn("prefill"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.completed}/{task.total} tokens"), TimeElapsedColumn(),
                console=self.out, transient=True,
            )
            self._progress.add_task("prefill", total=event.total, completed=event.cache)
            self._progress.start()
        self._progress.update(self._progress.task_ids[0], completed=event.processed)

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # -- everything else -----------------------------------------------------------------
    def banner(self, model_name: str) -> None:
        if self.interactive:
            self.out.print(
                Text.assemble(("mlxcel-py run", "bold"), f" - {model_name}. ", ("/help", "cyan"),
                              " for commands, ", ("/bye", "cyan"), " or Ctrl-D to leave.")
            )

    def help(self) -> None:
        for name, text in HELP:
            self.out.print(Text.assemble((f"{name:<14}", "cyan"), text))

    def stats(self, done: Optional[Finished]) -> None:
        for line in format_stats(done):
            self.out.print(line, markup=False, highlight=False, soft_wrap=True)

    def system(self, text: Optional[str]) -> None:
        shown = text if text is not None else "(none: the model's default)"
        self.out.print(f"system prompt: {shown}", markup=False, highlight=False, soft_wrap=True)

    def notice(self, message: str) -> None:
        """A one-line remark: dim on a terminal, plain on stderr when piped."""
        style = "dim" if self.interactive else None
        self.err.print(message, markup=False, highlight=False, soft_wrap=True, style=style)

    def error(self, message: str) -> None:
        style = "red" if self.interactive else None
        self.err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True, style=style)
