"""Responses items <-> chat messages in OpenAI's form (what the chat template and the tool
machinery take): a message is a turn, consecutive function_call items are one assistant turn's
tool_calls (joined to the assistant text just before them), a function_call_output is a tool turn.
"""

from __future__ import annotations

from typing import Optional, Union

from .schemas import FunctionCallItem, FunctionCallOutputItem, Item, MessageItem, Part


def _text(content: Union[str, list[Part]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.text if p.type != "refusal" else p.refusal for p in content)


def _call(item: FunctionCallItem) -> dict:
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}


def _add_call(out: list[dict], call: dict) -> None:
    last: Optional[dict] = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def input_messages(items: Union[str, list[Item], None]) -> list[dict]:
    """The request's `input` as chat messages (developer stays developer: templates see system)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            _add_call(out, _call(item))
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
    return out


def output_messages(output: list[dict]) -> list[dict]:
    """A response's `output` items as the assistant turns a later request continues from."""
    out: list[dict] = []
    for item in output:
        if item["type"] == "message":
            out.append({"role": "assistant", "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            _add_call(out, {"id": item["call_id"], "type": "function",
                            "function": {"name": item["name"], "arguments": item["arguments"]}})
    return out
