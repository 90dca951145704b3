"""OpenAI `tools`, `tool_choice` and `parallel_tool_calls`, validated into one record, and the
constraint that makes `required` or a named function return a valid call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..engine import ConstraintSpec
from ..errors import RequestError
from .closed import closed_parameters

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")


class ToolCallError(RequestError):
    """A tools request we cannot serve; `param` names the request field (a 400)."""

    def __init__(self, param: str, message: str):
        super().__init__(message, param=param)


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """Validated tools. `choice` is none, auto, required, or the name of the one function to call."""

    tools: tuple[dict, ...]
    choice: str
    parallel: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def forced(self) -> bool:
        """The reply must be a tool call (required, or a named function)."""
        return self.choice not in ("none", "auto")

    def as_openai(self) -> list[dict]:
        return [dict(t) for t in self.tools]


def _check_tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ToolCallError("tools", f"{where} must be {{'type': 'function', 'function': {{...}}}}")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolCallError("tools", f"{where}.function.name must be 1-64 letters, digits, _ or - (got {name!r})")
    if "description" in fn and not isinstance(fn["description"], str):
        raise ToolCallError("tools", f"{where}.function.description must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ToolCallError("tools", f"{where}.function.parameters must be a JSON schema object")
    return {"type": "function", "function": {**fn, "parameters": params}}


def _choice(tool_choice: Any, names: list[str]) -> str:
    if tool_choice in CHOICES:
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name in names:
            return name
        raise ToolCallError("tool_choice", f"tool_choice names function {name!r}, which is not in tools")
    raise ToolCallError("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                       "{'type': 'function', 'function': {'name': ...}}")


def tool_request(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> Optional[ToolRequest]:
    """Validate the three request fields; None when there are no tools. Raises ToolCallError."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolCallError("tool_choice", "tool_choice needs tools")
        return None
    if not isinstance(tools, list):
        raise ToolCallError("tools", "tools must be a list of function tools")
    if len(tools) > MAX_TOOLS:
        raise ToolCallError("tools", f"at most {MAX_TOOLS} tools are allowed (got {len(tools)})")
    checked = [_check_tool(i, t) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolCallError("tools", f"tools has function {dupes[0]!r} more than once")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolCallError("parallel_tool_calls", "parallel_tool_calls must be true or false")
    choice = "auto" if tool_choice is None else _choice(tool_choice, names)
    return ToolRequest(tuple(checked), choice, True if parallel_tool_calls is None else parallel_tool_calls)


def call_schema(tool: dict) -> dict:
    """JSON schema of one call in the Hermes format: {"name": <const>, "arguments": <parameters>}.

    The parameters are closed (tool_calls/closed.py): only the keys they list, each once, and a
    tool without parameters takes exactly `{}`. They get an `$id` of their own, so that their
    `#/$defs/...` and `#` references resolve inside them rather than at the call's root."""
    fn = tool["function"]
    return _call(fn["name"], _own_document(fn["name"], closed_parameters(fn["parameters"])))


def _call(name: str, arguments: dict) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _own_document(name: str, schema: Any) -> Any:
    """The schema as a resource of its own (JSON Schema's embedded `$id`), unless it names one."""
    if not isinstance(schema, dict) or "$id" in schema or "id" in schema:
        return schema
    return {"$id": f"urn:mlxcel:tool:{name}:parameters", **schema}


def tool_constraint(request: ToolRequest, start: str, end: str) -> Optional[ConstraintSpec]:
    """The constraint for a forced choice, or None (auto and none leave the model free).

    Several calls are allowed only for `required` with parallel_tool_calls; a named function is
    one call, and so is `required` with parallel_tool_calls false: EOS must follow the call."""
    if not request.forced:
        return None
    tools = request.tools if request.choice == "required" else [t for t in request.tools
                                                                  if t["function"]["name"] == request.choice]
    schemas = [call_schema(t) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    parallel = request.parallel and request.choice == "required"
    return ConstraintSpec("tool_call", json.dumps({"start": start, "end": end, "schema": schema, "parallel": parallel}))


def lazy_tool_constraint(request: ToolRequest, strict: frozenset[str], start: str, end: str) -> ConstraintSpec:
    """`auto` with strict tools: free text until the model opens a call (`start`), then a call
    whose arguments follow the (closed) schema of a `strict` tool, any object for the others.
    With parallel_tool_calls false, one call and then EOS."""
    schemas = [call_schema(t) if t["function"]["name"] in strict else _call(t["function"]["name"], {"type": "object"})
               for t in request.tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    text = json.dumps({"start": start, "end": end, "schema": schema, "parallel": request.parallel})
    return ConstraintSpec("tool_call", text, trigger=start)
