"""The tests' way to read a whole reply's tool calls: the server streams them (ToolCallStream)."""

from __future__ import annotations

from typing import Callable, Optional

from mlxcel_py.tool_calls import ToolCall, ToolCallStream, ToolFormat, new_call_id


def parse_tool_calls(text: str, fmt: ToolFormat, tools: Optional[list] = None, parallel: bool = True,
                     new_id: Callable[[], str] = new_call_id) -> tuple[Optional[str], list[ToolCall]]:
    """(content, calls) of a whole reply; content is None when the reply is only calls."""
    stream = ToolCallStream(fmt, tools, parallel, new_id)
    deltas = stream.feed(text) + stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    return (content or None) if stream.called else content, stream.calls
