"""The chat REPL on the tiny model: scripted input, exact transcripts, the prompt cache, Ctrl-C."""

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mlxcel_py.cli.chat_render import HELP, ChatRenderer, format_stats, terminal_rows
from mlxcel_py.cli.repl import ChatSession, Repl
from mlxcel_py.config import resolve
from mlxcel_py.engine import build_engine
from mlxcel_py.engine import Finished, PromptProgress, TokenDelta, Timings, Usage
from mlxcel_py.engine.core.worker import EngineWorker
from mlxcel_py.models import encode_chat
from config_helpers import flags_for
from tiny import tiny_model

MAX_TOKENS = 8
HELP_TEXT = "".join(f"{name:<14}{text}\n" for name, text in HELP)
CUT = f"(answer cut at {MAX_TOKENS} tokens; raise --max-tokens for longer ones)\n"


def start_worker(**flags):
    cfg = resolve("run", flags_for("run", **flags), env={})
    return EngineWorker(build_engine(cfg.engine, tiny_model())).start(), cfg


@pytest.fixture
def worker():
    w, _ = start_worker()
    yield w
    w.stop()


def scripted(lines):
    """A line reader over a list; an exception instance in the list is raised (Ctrl-C, Ctrl-D)."""
    items = iter(lines)

    def read(prompt):
        item = next(items, EOFError())
        if isinstance(item, BaseException):
            raise item
        return item

    return read


def console():
    return Console(file=io.StringIO(), width=100, highlight=False)


def make_repl(worker, lines, *, renderer_cls=ChatRenderer, interactive=False, max_tokens=MAX_TOKENS, system=None):
    session = ChatSession(worker, tiny_model().tokenizer, resolve("run", flags_for("run", max_tokens=max_tokens),
                                                                  env={}).sampling,
                          system=system)
    renderer = renderer_cls(console(), console(), interactive=interactive)
    return Repl(session, renderer, scripted(lines)), session


def transcript(repl):
    code = repl.run()
    return code, repl.render.out.file.getvalue(), repl.render.err.file.getvalue()


def answers(session):
    return [m["content"] for m in session.history if m["role"] == "assistant"]


def shown(answer):
    """How a piped answer appears: the text, then a newline unless it already ends with one."""
    return answer if answer.endswith("\n") else answer + "\n"


def test_help_unknown_command_and_bye(worker):
    repl, session = make_repl(worker, ["/help", "/nope", "", "/bye", "never sent"])
    assert transcript(repl) == (0, HELP_TEXT, "unknown command /nope; type /help for the commands\n")
    assert session.history == [] and session.last is None


def test_piped_messages_get_one_plain_answer_each_then_eof_exits(worker):
    repl, session = make_repl(worker, ["Hello world", "What is the capital of France?"])
    code, out, err = transcript(repl)
    first, second = answers(session)
    assert first and second
    assert (code, out, err) == (0, shown(first) + shown(second), CUT + CUT)
    assert "\x1b" not in out + err  # no control codes when piped
    assert [m["role"] for m in session.history] == ["user", "assistant", "user", "assistant"]


def test_system_prompt_and_clear(worker):
    repl, session = make_repl(worker, ["/system", "/system Be brief.", "/system", "Hello world"])
    code, out, err = transcript(repl)
    (answer,) = answers(session)
    assert out == f"system prompt: (none: the model's default)\nsystem prompt: Be brief.\n{shown(answer)}"
    assert err == "(system prompt set)\n" + CUT
    sent = encode_chat(tiny_model().tokenizer, [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello world"}])
    assert session.last.usage.prompt_tokens == len(sent.ids)  # the system prompt replaced the default one
    repl = Repl(session, ChatRenderer(console(), console(), interactive=False), scripted(["/clear", "/exit"]))
    assert transcript(repl) == (0, "", "(conversation cleared)\n")
    assert session.history == [] and session.messages == [{"role": "system", "content": "Be brief."}]


def test_system_flag_sets_the_prompt(worker):
    repl, session = make_repl(worker, ["/system"], system="You are terse.")
    assert transcript(repl) == (0, "system prompt: You are terse.\n", "")


def test_multiline_input(worker):
    lines = ['"""', "line one", 'line two"""', '"""inline"""', '"""/help"""', '"""unterminated', "tail"]
    repl, session = make_repl(worker, lines)
    code, out, _ = transcript(repl)
    users = [m["content"] for m in session.history if m["role"] == "user"]
    assert users == ["line one\nline two", "inline", "/help", "unterminated\ntail"]
    assert code == 0 and out == "".join(shown(a) for a in answers(session))  # "/help" fenced is a message


@pytest.mark.parametrize("ending", [EOFError(), KeyboardInterrupt()])
def test_ctrl_d_and_ctrl_c_at_the_prompt_exit_cleanly(worker, ending):
    repl, _ = make_repl(worker, [ending, "never sent"])
    assert transcript(repl) == (0, "", "")
    repl, _ = make_repl(worker, [ending], interactive=True)
    assert transcript(repl) == (0, "\n", "")  # the terminal is left on a fresh line


def test_second_turn_adopts_the_cache_and_matches_a_cold_run(worker):
    tok = tiny_model().tokenizer
    repl, session = make_repl(worker, ["Hello world", "What is the capital of France?", "/stats"], max_tokens=12)
    code, out, _ = transcript(repl)
    first_prompt = encode_chat(tok, session.history[:1]).ids
    warm = session.last
    assert warm.usage.cached_tokens >= len(first_prompt)  # at least the whole first prompt was adopted
    assert re.search(rf"prompt: {warm.usage.prompt_tokens} tokens \({warm.usage.cached_tokens} cached, "
                     rf"{warm.usage.prompt_tokens - warm.usage.cached_tokens} prefilled\)", out)
    cold_worker, cfg = start_worker()
    try:  # a fresh engine, given the whole two-turn conversation at once
        cold = ChatSession(cold_worker, tok, resolve("run", flags_for("run", max_tokens=12), env={}).sampling)
        cold.history = list(session.history[:2])
        turn = cold.ask(session.history[2]["content"])
    finally:
        cold_worker.stop()
    assert turn.finished.usage.cached_tokens == 0
    assert turn.finished.usage.prompt_tokens == warm.usage.prompt_tokens
    assert turn.text == answers(session)[1]


class InterruptingRenderer(ChatRenderer):
    """Raises KeyboardInterrupt (Ctrl-C) from the output callback at the third token, once."""

    fired = False

    def on_event(self, event):
        if isinstance(event, TokenDelta):
            self.tokens = getattr(self, "tokens", 0) + 1
            if self.tokens == 3 and not self.fired:
                self.fired = True
                raise KeyboardInterrupt
        super().on_event(event)


INTERRUPTED = "(answer interrupted; the partial answer stays in the conversation)\n"


def test_ctrl_c_mid_answer_aborts_the_request_and_keeps_what_was_shown(worker):
    seen = []

    def interrupt_at_third_token(event):
        if isinstance(event, TokenDelta):
            if len(seen) == 2:
                raise KeyboardInterrupt
            seen.append(event.text)

    session = ChatSession(worker, tiny_model().tokenizer, resolve("run", flags_for("run", max_tokens=200),
                                                                  env={}).sampling)
    turn = session.ask("Hello world", interrupt_at_third_token)
    assert turn.interrupted and turn.finished.finish_reason == "abort"
    assert turn.text == "".join(seen) and session.history[-1] == {"role": "assistant", "content": turn.text}
    assert turn.finished.usage.completion_tokens < 200
    nxt = session.ask("What is the capital of France?")
    assert not nxt.interrupted and nxt.finished.finish_reason == "length"
    assert len(session.history) == 4 and worker.stats().num_busy_slots == 0


def test_ctrl_c_as_the_answer_finishes_needs_no_abort(worker):
    def interrupt_at_the_end(event):
        if isinstance(event, Finished):
            raise KeyboardInterrupt

    session = ChatSession(worker, tiny_model().tokenizer, resolve("run", flags_for("run", max_tokens=4),
                                                                  env={}).sampling)
    turn = session.ask("Hello world", interrupt_at_the_end)  # returns at once: nothing left to drain
    assert turn.interrupted and turn.finished.finish_reason == "length" and len(session.history) == 2


def test_ctrl_c_mid_answer_in_the_repl(worker):
    repl, session = make_repl(worker, ["Hello world", "What is the capital of France?", "/stats"],
                              renderer_cls=InterruptingRenderer, max_tokens=20)
    code, out, err = transcript(repl)
    partial, second = answers(session)
    assert err == INTERRUPTED + "(answer cut at 20 tokens; raise --max-tokens for longer ones)\n"
    assert out.startswith(shown(partial) + shown(second)) and "finish reason: length" in out


def test_prompt_too_long_keeps_the_session(worker):
    small, _ = start_worker(ctx_size=64)
    try:
        repl, session = make_repl(small, ["Hello world " * 20, "Hi"], max_tokens=4)
        code, out, err = transcript(repl)
    finally:
        small.stop()
    assert code == 0 and re.fullmatch(r"error: the prompt has \d+ tokens, .*--ctx-size \(or /clear the conversation\)\n"
                                      r"\(answer cut at 4 tokens; .*\n", err)
    assert [m["content"] for m in session.history if m["role"] == "user"] == ["Hi"]
    assert out == shown(answers(session)[0])


def test_stats_before_any_answer_and_format():
    assert format_stats(None) == ["no answer yet"]
    done = Finished("r", "stop", Usage(100, 10, 60), Timings(0.0, 12.34, 10.0, 50.0, 4000.0, 180.0))
    assert format_stats(done) == [
        "prompt: 100 tokens (60 cached, 40 prefilled), 4000.0 tokens-per-sec",
        "generation: 10 tokens, 180.0 tokens-per-sec",
        "time to first token: 12.3 ms",
        "finish reason: stop",
    ]


def test_terminal_renderer_progress_and_markdown_redraw():
    out = Console(file=io.StringIO(), width=40, height=20, force_terminal=True)
    render = ChatRenderer(out, console(), interactive=True)
    render.banner("tiny")
    render.start_answer()
    for processed in (2048, 4096, 5000):
        render.on_event(PromptProgress("r", 5000, 0, processed, 1.0, 2048))
    render.on_event(TokenDelta("r", 1, "# Title\n\nSome **bold** text"))
    render.on_event(Finished("r", "stop", Usage(5000, 3, 0), Timings(0, 0, 0, 0, 0, 0)))
    render.end_answer()
    text = out.file.getvalue()
    assert "mlxcel-py run" in text and "prefill" in text and "5000 tokens" in text
    raw = text.index("# Title\n\nSome **bold** text")
    assert text.index("\r\x1b[2A\x1b[J", raw) > raw  # the raw answer is erased, then drawn as Markdown
    assert "Title" in text[text.index("\x1b[J", raw):] and "**bold**" not in text[text.index("\x1b[J", raw):]
    assert terminal_rows("ab\n\n" + "x" * 81, 40) == 1 + 1 + 3


def test_cli_run_piped(monkeypatch):
    from mlxcel_py.cli.app import app

    monkeypatch.setattr("mlxcel_py.models.load_model", lambda path, **kw: tiny_model())
    result = CliRunner().invoke(app, ["run", "--max-tokens", "5", "--system", "Be brief."],
                                input="Hello world\n/nope\n/bye\nnever\n")
    assert result.exit_code == 0, result.output
    assert result.stdout and "\x1b" not in result.stdout and result.stdout.endswith("\n")
    assert "unknown command /nope" in result.stderr and "mlxcel-py run" not in result.stdout


def test_cli_bad_flags_are_one_line_errors(monkeypatch):
    from mlxcel_py.cli.app import app

    result = CliRunner().invoke(app, ["run", "--temp", "-1"])
    assert result.exit_code == 2 and result.stderr == "error: --temp must be between 0 and 100 (got -1.0)\n"
    result = CliRunner().invoke(app, ["run", "--model", "/nonexistent/model.gguf"], input="Hi\n")
    assert result.exit_code == 1 and result.stderr == "error: model path not found: /nonexistent/model.gguf\n"
