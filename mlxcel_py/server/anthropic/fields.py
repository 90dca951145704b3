"""What /v1/messages does with each field: honoured, refused unless inert (the table
generation/prepared.py's `refuse_unsupported` reads), or ignored (docs/SERVER.md lists them).
"""

from __future__ import annotations

from typing import Any, Optional

from ..generation.prepared import Refused

HONOURED = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice",
})
# Refused unless inert (NOT_SUPPORTED below): thinking other than disabled, output_config's
# format or an effort other than the default "high".
REFUSED = frozenset({"thinking", "output_config"})
# Change nothing here (docs/SERVER.md lists them).
IGNORED = frozenset({
    "metadata", "cache_control", "service_tier", "container", "diagnostics", "inference_geo", "speed",
    "user_profile_id", "workspace_id",
})


def _thinking(thinking: Any) -> Optional[str]:
    if thinking.type == "disabled":
        return None
    return f'type "{thinking.type}" is not supported by this server; it accepts only {{"type": "disabled"}}'


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
    Refused("thinking", _thinking),
    Refused("output_config", _output_format),
    Refused("output_config", _effort),
    Refused("tools", _tool_options),
)
