"""What /v1/messages does with each field: honoured, refused unless inert (the table
generation/prepared.py's `refuse_unsupported` reads), or ignored (docs/API_NATIVE.md lists them).
"""

from __future__ import annotations

from typing import Any, Optional

from ...errors import FieldError
from ...models.chat import DEFAULT_OPTIONS, ChatOptions
from ..generation.prepared import Refused
from ..generation.template import without_thinking

HONOURED = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice", "thinking",
})
# Refused unless inert (NOT_SUPPORTED below): output_config's format or an effort other than
# the default "high".
REFUSED = frozenset({"output_config"})
# Change nothing here (docs/API_NATIVE.md lists them).
IGNORED = frozenset({
    "metadata", "cache_control", "service_tier", "container", "diagnostics", "inference_geo", "speed",
    "user_profile_id", "workspace_id",
})


def thinking_options(reasons: bool, thinking: Any) -> ChatOptions:
    """The template's options for `thinking` on a model that `reasons` (or not): disabled turns
    the template's thinking off; enabled and adaptive keep it (a 400 on a model without it)."""
    if thinking is None or thinking.type == "disabled":
        return without_thinking(DEFAULT_OPTIONS) if thinking is not None and reasons else DEFAULT_OPTIONS
    if thinking.type not in ("enabled", "adaptive"):
        raise _refused(f'type "{thinking.type}" is not supported by this server; it accepts '
                       '"enabled", "adaptive" and "disabled"')
    if not reasons:
        raise _refused(f'type "{thinking.type}" needs thinking, which is off on this server (a model whose '
                       'template opens no thinking block, or --reasoning-budget 0); send {"type": "disabled"} '
                       'or omit it')
    if thinking.display not in (None, "summarized"):
        raise _refused(f'display "{thinking.display}" is not supported by this server (the thinking is '
                       'returned whole); it accepts only "summarized"')
    return DEFAULT_OPTIONS


def thinking_budget(thinking: Any) -> Optional[int]:
    """`enabled`'s budget_tokens: the thinking's end marker is forced after that many tokens
    (engine/runner/thinking.py), as llama-server does with it; None for the other types."""
    if getattr(thinking, "type", None) != "enabled" or thinking.budget_tokens is None:
        return None
    if thinking.budget_tokens < 1:
        raise _refused(f"budget_tokens must be a positive number of tokens (got {thinking.budget_tokens})")
    return thinking.budget_tokens


def _refused(problem: str) -> FieldError:
    return FieldError(f"'thinking' {problem}", param="thinking", code="unsupported_parameter")


def _output_format(config: Any) -> Optional[str]:
    return None if config.format is None else "format (structured output) is not supported yet by this server"


def _effort(config: Any) -> Optional[str]:
    if config.effort in (None, "high"):
        return None
    return f'effort "{config.effort}" is not supported by this server; it accepts only "high"'


def _tool_options(tools: list) -> Optional[str]:
    # `tools` is honoured; two of a tool's options are not.
    for i, tool in enumerate(tools):
        if tool.strict:
            return f"[{i}].strict is not supported by this server (only a forced tool_choice guarantees " \
                   "schema-valid input here)"
        if tool.input_examples:
            return f"[{i}].input_examples is not supported by this server"
    return None


NOT_SUPPORTED: tuple[Refused, ...] = (
    Refused("output_config", _output_format),
    Refused("output_config", _effort),
    Refused("tools", _tool_options),
)
