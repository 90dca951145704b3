"""The model's tool-call format (mlx-lm's tool parsers, looked up by models/tool_parsers.py), and
chat messages with tools rendered for its template: natively when the template takes `tools`,
else a Hermes/Qwen system prompt."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..engine import ConstraintSpec
from ..models.tool_parsers import DEFAULT_PARSER, tool_parser_module, tool_parser_name
from ..models.vocab import hf_tokenizer
from .request import ToolCallError, ToolRequest, tool_constraint

# Qwen2.5's tool prompt (Hermes format), for templates that do not render tools themselves.
FALLBACK_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How a model writes calls: between `start` and `end`, parsed by mlx-lm's `parser` module.

    `native`: the chat template renders tools itself; else FALLBACK_PROMPT is used.
    `json_calls`: the call text is JSON {"name", "arguments"}, so a grammar can force it."""

    parser: str
    start: str
    end: str
    parse: Callable[[str, Optional[list]], Any]
    native: bool

    @property
    def json_calls(self) -> bool:
        return self.parser == "json_tools"


def tool_format(tokenizer: Any, template: Optional[str] = None) -> ToolFormat:
    """The model's tool-call format; Hermes `<tool_call>` JSON when mlx-lm knows none for it.

    `template`: the Jinja source prompts are rendered with when it is not the model's own
    ("" for a built-in name, which renders no tools)."""
    if template is None:
        template = getattr(hf_tokenizer(tokenizer), "chat_template", None) or ""
    name = tool_parser_name(tokenizer)
    native = name is not None and isinstance(template, str) and "tools" in template
    module = tool_parser_module(name or DEFAULT_PARSER)
    return ToolFormat(name or DEFAULT_PARSER, module.tool_call_start, module.tool_call_end,
                      module.parse_tool_call, native)


def _arguments(value: Any) -> Any:
    # OpenAI sends arguments as JSON text; templates (and our prompt) want the object.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _calls_text(calls: list, fmt: ToolFormat) -> str:
    out = []
    for call in calls:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        body = json.dumps({"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))}, ensure_ascii=False)
        out.append(f"{fmt.start}\n{body}\n{fmt.end}")
    return "\n".join(out)


def _with_tool_prompt(messages: list[dict], request: ToolRequest) -> list[dict]:
    """The fallback tool prompt, appended to the system message or as a new first one."""
    prompt = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in request.tools))
    if messages and messages[0].get("role") == "system":
        head = messages[0].get("content") or ""
        return [{**messages[0], "content": f"{head}\n\n{prompt}" if head else prompt}] + messages[1:]
    return [{"role": "system", "content": prompt}] + messages


def _as_text_turns(messages: list[dict], fmt: ToolFormat) -> list[dict]:
    """Calls become assistant text in the model's format; results become <tool_response> user turns."""
    out: list[dict] = []
    merging = False  # consecutive tool results share one user turn, as Qwen's template does
    for msg in messages:
        role, content = msg.get("role"), msg.get("content") or ""
        if role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if merging:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + response}
            else:
                out.append({"role": "user", "content": response})
            merging = True
            continue
        merging = False
        if role == "assistant" and msg.get("tool_calls"):
            calls = _calls_text(msg["tool_calls"], fmt)
            content = f"{content}\n{calls}" if content else calls
        thought = msg.get("reasoning_content")  # kept for templates that render the turn's thinking
        out.append({"role": role, "content": content, **({"reasoning_content": thought} if thought else {})})
    return out


def _native_messages(messages: list[dict]) -> list[dict]:
    out = []
    for msg in messages:
        msg = {**msg, "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            msg["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                for c in msg["tool_calls"]
            ]
        out.append(msg)
    return out


def tool_messages(messages: list[dict], request: Optional[ToolRequest], fmt: ToolFormat
                  ) -> tuple[list[dict], Optional[list[dict]]]:
    """(messages, `tools` for apply_chat_template), with tool calls and results renderable.

    With tool_choice none the tools are not shown to the model."""
    show = request is not None and request.choice != "none"
    if fmt.native:
        return _native_messages(messages), (request.as_openai() if show else None)
    turns = _as_text_turns(messages, fmt)
    return (_with_tool_prompt(turns, request) if show else turns), None


def call_constraint(request: Optional[ToolRequest], fmt: ToolFormat) -> Optional[ConstraintSpec]:
    """The grammar that forces a valid call for `required` or a named function; None otherwise.

    Raises ToolCallError when the model's call format is not JSON between markers."""
    if request is None or not request.forced:
        return None
    if not fmt.json_calls:
        raise ToolCallError("tool_choice", f"tool_choice {request.choice!r} needs a JSON tool-call format; "
                                           f"this model writes calls as {fmt.parser}")
    return tool_constraint(request, fmt.start, fmt.end)
