"""Responses items <-> chat messages in OpenAI's form (what the chat template and the tool
machinery take): a message is a turn, consecutive function_call items are one assistant turn's
tool_calls (joined to the assistant text just before them), a function_call_output is a tool turn,
a reasoning item the reasoning_content of the assistant turn after it.
"""

from __future__ import annotations

from typing import Optional, Union

from ...errors import FieldError
from ..generation.images import image_part
from .schemas import FunctionCallItem, FunctionCallOutputItem, Item, MessageItem, Part, ReasoningItem


def _text(content: Union[str, list[Part]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.text if p.type != "refusal" else p.refusal for p in content)


def _content(content: Union[str, list[Part]], where: str) -> Union[str, list[dict]]:
    """A message's content: its text, or with input_image parts the OpenAI-form parts in order."""
    if isinstance(content, str) or not any(p.type == "input_image" for p in content):
        return _text(content)
    parts: list[dict] = []
    for j, p in enumerate(content):
        if p.type != "input_image":
            parts.append({"type": "text", "text": _text([p])})
        elif p.file_id is not None or not p.image_url:
            raise FieldError(f"{where}.content[{j}]: an input_image needs an image_url (a data: URL); this server "
                             "keeps no files", param="input")
        else:
            parts.append(image_part(p.image_url, f"{where}.content[{j}]"))
    return parts


def _call(item: FunctionCallItem) -> dict:
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}


def _add_call(out: list[dict], call: dict, thought: str = "") -> None:
    last: Optional[dict] = out[-1] if out else None
    if last is not None and last["role"] == "assistant" and not thought:
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call], **_reasoning(thought)})


def _reasoning(thought: str) -> dict:
    return {"reasoning_content": thought} if thought else {}


def _thought(item: ReasoningItem) -> str:
    return "\n".join(p.text for p in item.content or item.summary)


def input_messages(items: Union[str, list[Item], None]) -> list[dict]:
    """The request's `input` as chat messages (developer stays developer: templates see system)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    thought = ""  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            thought = _thought(item)
            continue
        if isinstance(item, MessageItem):
            mine = thought if item.role == "assistant" else ""
            out.append({"role": item.role, "content": _content(item.content, f"input[{i}]"), **_reasoning(mine)})
        elif isinstance(item, FunctionCallItem):
            _add_call(out, _call(item), thought)
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        thought = ""
    return out


def output_messages(output: list[dict]) -> list[dict]:
    """A response's `output` items as the assistant turns a later request continues from."""
    out: list[dict] = []
    thought = ""
    for item in output:
        if item["type"] == "reasoning":
            thought = "\n".join(p["text"] for p in item["content"] or ())
            continue
        if item["type"] == "message":
            out.append({"role": "assistant", "content": "".join(p["text"] for p in item["content"]),
                        **_reasoning(thought)})
        elif item["type"] == "function_call":
            _add_call(out, {"id": item["call_id"], "type": "function",
                            "function": {"name": item["name"], "arguments": item["arguments"]}}, thought)
        thought = ""
    return out
