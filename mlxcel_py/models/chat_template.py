"""The chat template prompts are rendered with: the model's own, one of llama.cpp's built-in
names, or Jinja source (`--chat-template NAME|JINJA`, `--chat-template-file`), with the
server-wide `--chat-template-kwargs` and the variables llama-server gives templates.

Jinja runs through the tokenizer's apply_chat_template, in transformers' sandboxed environment
(the one the model's own template runs in): `raise_exception`, `strftime_now`, `tojson`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Optional

from ..errors import RequestError
from .chat_builtin import BUILTIN

# Built-in names beyond llama.cpp's: Qwen3 is chatml whose generation prompt closes an empty
# <think> block when `enable_thinking` is false (what Qwen3's own template does).
EXTRA_NAMES = ("qwen3",)
BUILTIN_NAMES = tuple(sorted((*BUILTIN, *EXTRA_NAMES)))
# Variables the renderer sets itself, or transformers' own apply_chat_template arguments.
RESERVED_KWARGS = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})
# The conversation a template is tried on at startup (llama-server's check renders one user turn).
PROBE = ({"role": "user", "content": "test"},)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A built-in `name`, or Jinja `source`; neither: the model's own template."""

    name: Optional[str] = None
    source: Optional[str] = None
    defaults: Mapping[str, Any] = field(default_factory=dict)  # --chat-template-kwargs
    origin: str = "the model's chat template"  # how errors name it

    def describe(self) -> str:
        """The startup log's line."""
        what = f"built-in {self.name}" if self.name else ("jinja from " + self.origin if self.source else "the model's")
        extra = f" kwargs={dict(self.defaults)}" if self.defaults else ""
        return f"chat_template {what}{extra}"


def template_of(value: str, origin: str, defaults: Optional[Mapping[str, Any]] = None) -> ChatTemplate:
    """A known built-in name, else the text as Jinja (as llama-server takes --chat-template)."""
    name = value.strip()
    if name in BUILTIN_NAMES:
        return ChatTemplate(name=name, defaults=dict(defaults or {}), origin=origin)
    return ChatTemplate(source=value, defaults=dict(defaults or {}), origin=origin)


def check_kwargs(kwargs: Any, label: str) -> dict[str, Any]:
    """A kwargs object for templates; ValueError naming the problem (the caller says which field)."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"{label} must be a JSON object (got {type(kwargs).__name__})")
    reserved = sorted(k for k in kwargs if k in RESERVED_KWARGS)
    if reserved:
        raise ValueError(f"{label} may not set {', '.join(map(repr, reserved))}: "
                         "the server sets it (use the request field of that name where there is one)")
    return dict(kwargs)


def compile_jinja(source: str):
    """`source` compiled in a copy of transformers' chat-template environment (importing
    transformers costs a second and prints advice, so the startup check does without it)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' {% generation %} block: rendered as its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(source)


def context(template: ChatTemplate, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables beyond the messages: llama-server's date_string, then the
    server-wide kwargs, then the request's."""
    return {"date_string": datetime.now().strftime("%d %b %Y"), **template.defaults, **kwargs}


def probe(template: ChatTemplate, tokenizer: Any = None) -> None:
    """Render PROBE (with the tokenizer's special tokens when given); raises what the template raises."""
    if template.name is not None:
        render_builtin(template.name, list(PROBE), True, {})
    elif tokenizer is not None:
        render_jinja(tokenizer, template, list(PROBE), True, None, {})
    elif template.source is not None:
        compile_jinja(template.source).render(messages=list(PROBE), add_generation_prompt=True,
                                              bos_token="", eos_token="", **context(template, {}))


def one_line(exc: Exception) -> str:
    """What a template raised, on one line (with the template's line for a syntax error)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    line = getattr(exc, "lineno", None)
    return lines[0] + (f" (template line {line})" if isinstance(line, int) else "")


def render_builtin(name: str, messages: list[dict], add_generation_prompt: bool, kwargs: Mapping[str, Any]) -> str:
    """A built-in name's rendering (llama.cpp's), and Qwen3's thinking switch."""
    if name != "qwen3":
        return BUILTIN[name](messages, add_generation_prompt)
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    # Qwen3's template drops the reasoning of the turns before the last user message.
    turns = [{**m, "content": m["content"].split("</think>")[-1].lstrip("\n")}
             if m["role"] == "assistant" and i < last_user else m for i, m in enumerate(messages)]
    text = BUILTIN["chatml"](turns, add_generation_prompt)
    if add_generation_prompt and kwargs.get("enable_thinking") is False:
        text += "<think>\n\n</think>\n\n"
    return text


def render_jinja(tokenizer: Any, template: ChatTemplate, messages: list[dict], add_generation_prompt: bool,
                 tools: Optional[list], kwargs: Mapping[str, Any]) -> str:
    """The model's template (or `template.source`) through the tokenizer's apply_chat_template."""
    extra = {"tools": tools} if tools else {}  # mlxcel_py.tool_calls decides when the template gets tools
    if template.source is not None:
        extra["chat_template"] = template.source
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra, **context(template, kwargs),
    )


def continue_final(text: str, messages: list[dict]) -> str:
    """`text` cut after the final message's content, so the model continues it (transformers'
    continue_final_message rule: keep the content's own trailing spaces when the template does)."""
    final = messages[-1].get("content") or ""
    at = text.rfind(final.strip()) if final.strip() else -1
    if at < 0:
        raise RequestError("continue_final_message: the final message does not appear in the rendered prompt",
                           param="continue_final_message")
    kept = final.lstrip()
    end = at + len(kept) if text[at:at + len(kept)] == kept else at + len(final.strip())
    return text[:end]
