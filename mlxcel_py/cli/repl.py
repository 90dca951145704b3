"""The chat REPL without Typer: a `ChatSession` (conversation + engine requests) and a `Repl` loop.

Tests drive `Repl` with a scripted line reader and string consoles and assert the transcript.
"""

from __future__ import annotations

import itertools
import queue
import time
from dataclasses import dataclass
from typing import Callable, Optional, TextIO

from ..engine import Event, Finished, PromptProgress, PromptTooLongError, Request, SamplingParams, TokenDelta
from ..errors import MlxcelError
from .chat_render import ChatRenderer

ReadLine = Callable[[str], str]  # prompt -> line without its newline; EOFError at the end
PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
EXIT_COMMANDS = ("/bye", "/exit", "/quit")


class ChatError(MlxcelError):
    """A turn that could not run (too long, template error, engine error); the session goes on."""


@dataclass(frozen=True, slots=True)
class Turn:
    text: str  # the answer as shown (the partial one when interrupted)
    finished: Finished
    interrupted: bool


class ChatSession:
    """The conversation and its requests through the engine worker.

    Every turn renders the whole conversation with the chat template; the engine's prompt
    cache holds the previous turn's KV, so only the new message is prefilled.
    """

    def __init__(self, worker, tokenizer, sampling: SamplingParams, *, system: Optional[str] = None,
                 abort_timeout: float = 60.0, poll_s: float = 0.1):
        self.worker, self.tokenizer, self.sampling = worker, tokenizer, sampling
        self.system = system or None
        self.history: list[dict] = []  # user/assistant messages, the system prompt apart
        self.last: Optional[Finished] = None
        self.abort_timeout, self.poll_s = abort_timeout, poll_s
        self._ids = itertools.count(1)

    @property
    def messages(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + list(self.history)

    def clear(self) -> None:
        self.history.clear()

    def set_system(self, text: Optional[str]) -> None:
        self.system = text or None

    def ask(self, text: str, on_event: Callable[[Event], None] = lambda e: None) -> Turn:
        """Send one user message and stream the answer through `on_event`.

        Ctrl-C (KeyboardInterrupt from the wait or from `on_event`) aborts the request; the
        partial answer is kept in the conversation. Raises ChatError when the turn cannot run."""
        from ..models import encode_chat

        messages = self.messages + [{"role": "user", "content": text}]
        try:
            chat = encode_chat(self.tokenizer, messages)
            request = Request(f"run-{next(self._ids)}", chat.ids, self.sampling, chat.history_boundary)
            handle = self.worker.submit(request)
        except PromptTooLongError as exc:
            raise ChatError(f"{exc} (or /clear the conversation)") from None
        except MlxcelError as exc:
            raise ChatError(str(exc)) from None
        shown, done, interrupted = self._stream(handle, on_event, self._queued(request))
        if done.finish_reason == "error":
            raise ChatError(done.error or "generation failed")
        if shown or not interrupted:  # an answer nobody saw leaves no trace
            self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": shown}]
        self.last = done
        return Turn(shown, done, interrupted)

    def _queued(self, request: Request) -> PromptProgress:
        """A zero-progress event for the queued request, so a long prefill shows its bar at once.

        The engine reports only finished pieces; `cache` guesses the previous turn's KV is adopted."""
        n = len(request.prompt_ids)
        last = self.last.usage if self.last is not None and self.history else None
        expected = min(last.prompt_tokens + last.completion_tokens, n - 1) if last else 0
        return PromptProgress(request.request_id, n, expected, expected, 0.0, 0)

    def _stream(self, handle, on_event, queued: PromptProgress) -> tuple[str, Finished, bool]:
        parts: list[str] = []
        done: Optional[Finished] = None
        try:
            on_event(queued)
            while done is None:
                try:  # a timed wait, so Ctrl-C is seen promptly on every platform
                    event = handle.get(timeout=self.poll_s)
                except queue.Empty:
                    continue
                if isinstance(event, Finished):
                    done = event  # set first: a Ctrl-C inside on_event then needs no abort
                on_event(event)
                if isinstance(event, TokenDelta):
                    parts.append(event.text)
            return "".join(parts) + done.text, done, False
        except KeyboardInterrupt:
            if done is None:
                handle.abort()
                done = self._drain(handle)
            return "".join(parts), done, True

    def _drain(self, handle) -> Finished:
        """Wait for the aborted request's Finished; tokens already on their way are dropped."""
        deadline = time.monotonic() + self.abort_timeout
        while time.monotonic() < deadline:
            try:
                event = handle.get(timeout=self.poll_s)
            except queue.Empty:
                continue
            except KeyboardInterrupt:  # another Ctrl-C while the abort lands: keep waiting
                continue
            if isinstance(event, Finished):
                return event
        raise ChatError("the engine did not confirm the abort in time")


class Repl:
    """Read messages and commands, stream answers; `run()` returns the exit status."""

    def __init__(self, session: ChatSession, renderer: ChatRenderer, read_line: ReadLine):
        self.session, self.render, self.read_line = session, renderer, read_line
        self.interactive = renderer.interactive

    def run(self) -> int:
        while True:
            try:
                text, fenced = self._read_message()
            except (EOFError, KeyboardInterrupt):
                if self.interactive:
                    self.render.out.print()  # leave the terminal on a fresh line
                return 0
            if not text.strip():
                continue
            if not fenced and text.startswith("/"):
                if not self._command(text.strip()):
                    return 0
            else:
                self._ask(text)

    def _read_message(self) -> tuple[str, bool]:
        """One message: a line, or a \"\"\"-fenced block (EOF inside it sends what was read)."""
        line = self.read_line(PROMPT if self.interactive else "")
        if not line.startswith(FENCE):
            return line, False
        body = line[len(FENCE):]
        if len(body) >= len(FENCE) and body.endswith(FENCE):
            return body[: -len(FENCE)], True
        lines = [body] if body else []
        while True:
            try:
                line = self.read_line(MORE if self.interactive else "")
            except EOFError:
                return "\n".join(lines), True
            if line.endswith(FENCE):
                lines.append(line[: -len(FENCE)])
                return "\n".join(lines), True
            lines.append(line)

    def _command(self, line: str) -> bool:
        """Run a /command; False means leave."""
        name, _, arg = line.partition(" ")
        name, arg = name.lower(), arg.strip()
        if name in EXIT_COMMANDS:
            return False
        if name in ("/help", "/?"):
            self.render.help()
        elif name == "/clear":
            self.session.clear()
            self.render.notice("(conversation cleared)")
        elif name == "/system":
            if arg:
                self.session.set_system(arg)
                self.render.notice("(system prompt set)")
            else:
                self.render.system(self.session.system)
        elif name == "/stats":
            self.render.stats(self.session.last)
        else:
            self.render.notice(f"unknown command {name}; type /help for the commands")
        return True

    def _ask(self, text: str) -> None:
        self.render.start_answer()
        try:
            turn = self.session.ask(text, self.render.on_event)
        except KeyboardInterrupt:  # Ctrl-C before the request was queued: nothing to abort
            self.render.end_answer(interrupted=True)
            return
        except ChatError as exc:
            self.render.end_answer(interrupted=False, reason="error")
            self.render.error(str(exc))
            return
        reason = turn.finished.finish_reason
        self.render.end_answer(turn.interrupted, reason, self.session.sampling.max_tokens)


def stream_reader(stream: TextIO) -> ReadLine:
    """Lines from a text stream (piped stdin, io.StringIO); prompts are not shown."""

    def read(prompt: str) -> str:
        line = stream.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    return read


def terminal_reader() -> ReadLine:
    """input() with readline editing and history; the prompt in bold green."""
    try:
        import readline  # noqa: F401  (enables line editing for input())
    except ImportError:
        pass

    def read(prompt: str) -> str:
        # \001 and \002 tell readline the colour codes take no room on the line.
        return input(f"\001\x1b[1;32m\002{prompt}\001\x1b[0m\002")

    return read
