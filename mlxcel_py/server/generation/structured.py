"""What the reply must be: the grammar of `response_format`, llama-server's `json_schema` and
`grammar`, or a forced tool call, compiled before the request is queued; and the validated
`tools` (or the deprecated `functions`) to render and parse.

Blocking (compiling); runs off the event loop. Every problem is a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel

from ...engine import ConstraintSpec
from ...errors import FieldError, RequestError
from ...tool_calls import ToolFormat, ToolRequest, call_constraint, tool_request
from ...tool_calls.closed import closed_schema
from .schemas import GenerationRequest


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """The request's constraint (and the field that carried it) and its tools."""

    constraint: Optional[ConstraintSpec] = None
    field: Optional[str] = None
    tools: Optional[ToolRequest] = None
    legacy_functions: bool = False  # the reply uses the deprecated `function_call` shape


def schema_spec(schema: Any) -> ConstraintSpec:
    """The constraint of a JSON schema (a dict), its objects closed where they list their properties
    and say nothing of others: OpenAI's strict reading and llama.cpp's, in every dialect
    (docs/STRUCTURED_OUTPUT.md, "Closed objects")."""
    return ConstraintSpec("json_schema", json.dumps(closed_schema(schema)))


def _response_format(body: GenerationRequest) -> Optional[ConstraintSpec]:
    fmt = getattr(body, "response_format", None)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":  # llama-server also takes a schema here
        return ConstraintSpec("json_object") if fmt.schema_ is None else schema_spec(fmt.schema_)
    if fmt.json_schema.schema_ is None:
        raise FieldError("response_format.json_schema.schema is required for type json_schema",
                         param="response_format")
    return schema_spec(fmt.json_schema.schema_)  # `strict` changes nothing: the schema is always enforced


def _format_specs(body: GenerationRequest) -> list[tuple[str, ConstraintSpec]]:
    """(field, spec) of every field that asks for a constrained output."""
    specs = []
    builders = (
        ("response_format", lambda: _response_format(body)),
        ("json_schema", lambda: None if body.json_schema is None else schema_spec(body.json_schema)),
        ("grammar", lambda: ConstraintSpec("gbnf", body.grammar) if body.grammar else None),
    )
    for name, build in builders:
        try:
            spec = build()
        except RequestError as exc:  # e.g. longer than a constraint may be
            raise FieldError(str(exc), param=name) from None
        if spec is not None:
            specs.append((name, spec))
    return specs


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value


def _legacy_choice(function_call: Any) -> Any:
    if function_call is None or isinstance(function_call, str):
        return function_call
    return {"type": "function", "function": {"name": function_call.name}}


def _tools(body: GenerationRequest) -> tuple[Optional[ToolRequest], bool]:
    """The validated tools and whether they came as the deprecated `functions`."""
    tools, functions = getattr(body, "tools", None), getattr(body, "functions", None)
    function_call = getattr(body, "function_call", None)
    if functions:
        if tools:
            raise FieldError("send tools or the deprecated functions, not both", param="functions")
        as_tools = [{"type": "function", "function": _dump(f)} for f in functions]
        try:
            return tool_request(as_tools, _legacy_choice(function_call), False), True
        except RequestError as exc:
            param = {"tools": "functions", "tool_choice": "function_call"}.get(exc.param, exc.param)
            raise FieldError(str(exc), param=param) from None
    if function_call not in (None, "none", "auto"):
        raise FieldError("function_call names a function, but functions is empty", param="function_call")
    if tools is None:
        tool_choice = getattr(body, "tool_choice", None)
        return tool_request(None, _dump(tool_choice)), False
    return tool_request([_dump(t) for t in tools], _dump(body.tool_choice), body.parallel_tool_calls), False


def compile_constraint(compiler: Any, spec: ConstraintSpec, field: str) -> None:
    """Compile now, so a grammar the library refuses is a 400 and the runner finds it cached."""
    if compiler is None:
        raise FieldError("constrained decoding is not available on this server", param=field)
    try:
        compiler.compile(spec)
    except RequestError as exc:  # GrammarError, or a tokenizer that cannot drive a grammar
        raise FieldError(str(exc), param=field) from None


def output_plan(body: GenerationRequest, fmt: Optional[ToolFormat], compiler: Any) -> OutputPlan:
    """Validate the output fields of a request and compile its grammar; a 400 names the field."""
    try:
        tools, legacy = _tools(body)
    except RequestError as exc:  # ToolCallError names its field
        raise FieldError(str(exc), param=exc.param) from None
    return constrained_plan(tools, _format_specs(body), fmt, compiler, legacy,
                            "response_format, json_schema, grammar and a forced tool_choice")


def constrained_plan(tools: Optional[ToolRequest], specs: list[tuple[str, ConstraintSpec]],
                     fmt: Optional[ToolFormat], compiler: Any, legacy: bool = False,
                     candidates: str = "the output format and a forced tool_choice") -> OutputPlan:
    """The plan of validated `tools` and the (field, spec) pairs a request's format fields ask
    for, plus a forced call's grammar; at most one may constrain the output (`candidates` names
    them in the error). The grammar is compiled now; a 400 names the field."""
    try:
        forced = call_constraint(tools, fmt) if tools is not None and fmt is not None else None
    except RequestError as exc:  # ToolCallError names its field
        raise FieldError(str(exc), param=exc.param) from None
    if forced is not None:
        specs = [*specs, ("function_call" if legacy else "tool_choice", forced)]
    if len(specs) > 1:
        names = " and ".join(name for name, _ in specs)
        raise FieldError(f"only one of {candidates} may constrain the output (got {names})", param=specs[1][0])
    if not specs:
        return OutputPlan(tools=tools, legacy_functions=legacy)
    field, spec = specs[0]
    compile_constraint(compiler, spec, field)
    return OutputPlan(spec, field, tools, legacy)
