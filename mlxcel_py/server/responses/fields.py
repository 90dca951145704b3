"""What /v1/responses does with each field: honoured, refused unless inert (the table
generation/prepared.py's `refuse_unsupported` reads), or ignored (docs/API_RESPONSES.md lists them;
tests/test_server_fields.py checks the three against the schema and the docs).
"""

from __future__ import annotations

from typing import Any, Optional

from ...errors import FieldError
from ...models.chat import DEFAULT_OPTIONS, ChatOptions
from ..generation.prepared import Refused, accepts_only
from ..generation.template import without_thinking

HONOURED = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "max_output_tokens",
    "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "text", "metadata", "user",
})
# Reasoning items carry their text, never encrypted content: asking for it changes nothing.
INERT_INCLUDES = frozenset({"reasoning.encrypted_content"})
NOT_HERE = "by this server"


def _include(values: list) -> Optional[str]:
    other = [v for v in values if v not in INERT_INCLUDES]
    if not other:
        return None
    return f'value "{other[0]}" is not supported {NOT_HERE}; it accepts only [] or ["reasoning.encrypted_content"]'


def _reasoning(reasoning: Any) -> Optional[str]:
    # effort depends on the model: reasoning_options below.
    if reasoning.summary is not None or reasoning.generate_summary is not None:
        return "summary is not supported by this server (a reasoning model's thinking is returned whole, " \
               "as the reasoning item's content)"
    if reasoning.mode not in (None, "standard"):
        return f'mode "{reasoning.mode}" is not supported by this server; it accepts only "standard"'
    return None


def reasoning_options(thinks: bool, reasoning: Any) -> ChatOptions:
    """The template's options for `reasoning.effort` on a model that `thinks` (or not): "none"
    turns the template's thinking off, "medium" (OpenAI's default) keeps the model's own."""
    effort = reasoning.effort if reasoning is not None else None
    if effort is None or (effort == "medium" and thinks):
        return DEFAULT_OPTIONS
    if effort == "none":
        return without_thinking(DEFAULT_OPTIONS) if thinks else DEFAULT_OPTIONS
    if not thinks:
        problem = f'effort "{effort}" is not supported: the served model does not reason; send null or "none"'
    else:
        problem = (f'effort "{effort}" is not supported by this server (it cannot vary how long the model '
                   'thinks); it accepts null, "none" (no thinking) and "medium" (the model\'s own)')
    raise FieldError(f"'reasoning' {problem}", param="reasoning", code="unsupported_parameter")


def _verbosity(text: Any) -> Optional[str]:
    if text.verbosity in (None, "medium"):
        return None
    return f'verbosity "{text.verbosity}" is not supported {NOT_HERE}; it accepts only "medium"'


def _is(*values: Any):
    return lambda value: any(value is v or (type(value) is type(v) and value == v) for v in values)


def _empty(value: Any) -> bool:
    return not value


NOT_SUPPORTED: tuple[Refused, ...] = (
    Refused("background", accepts_only(_is(False), "false", f"{NOT_HERE} (responses run in the request)")),
    Refused("conversation", accepts_only(_empty, "null", f"{NOT_HERE} (use previous_response_id)")),
    Refused("include", _include),
    Refused("reasoning", _reasoning),
    Refused("text", _verbosity),
    Refused("top_logprobs", accepts_only(_is(0), "0", NOT_HERE)),
    Refused("prompt", accepts_only(_empty, "null", f"{NOT_HERE} (prompt templates live on OpenAI's side)")),
    Refused("truncation", accepts_only(_is("disabled"), '"disabled"', f"{NOT_HERE} (an input too long is a 400)")),
    Refused("context_management", accepts_only(_empty, "null or []", NOT_HERE)),
    Refused("moderation", accepts_only(_empty, "null", NOT_HERE)),
    Refused("image", accepts_only(_empty, "null", NOT_HERE)),
)
REFUSED = frozenset(row.field for row in NOT_SUPPORTED) - HONOURED
# Change nothing here (docs/API_RESPONSES.md lists them). max_tool_calls bounds built-in tool calls,
# which are refused; the rest are OpenAI's routing, caching and billing hints.
IGNORED = frozenset({
    "stream_options", "max_tool_calls", "background_options", "access_programs", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "safety_identifier", "service_tier",
})
