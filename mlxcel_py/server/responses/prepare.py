"""A Responses body -> the engine request, through the chat route's machinery: `instructions`, the
stored conversation of `previous_response_id` and `input` as OpenAI chat messages, flat function
tools through mlxcel_py.tool_calls, `text.format` through generation/structured.py, sampling.

Everything here blocks (templating, tokenizing, compiling a grammar) and runs off the event loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from ...engine import ConstraintSpec
from ...engine import Request as EngineRequest
from ...errors import FieldError, RequestError
from ...models.chat import ChatOptions, validate_messages
from ...tool_calls import ToolRequest, lazy_tool_constraint, tool_messages, tool_request
from ..generation.images import chat_prompt, take_images, with_images
from ..generation.keep import keep_fields
from ..generation.assembler import ToolParsing
from ..generation.prepared import Prepared, blame, refuse_unsupported
from ..generation.prompt import content_chars
from ..generation.reasoning import reply_reasoning
from ..generation.sampling import sampling_params
from ..generation.thinking import with_thinking
from ..generation.schemas import GenerationRequest
from ..generation.structured import OutputPlan, constrained_plan, schema_spec
from ..http.body import parse_body
from .conversation import input_messages
from .fields import NOT_SUPPORTED, reasoning_options
from .schemas import FunctionChoice, ResponsesRequest
from .shapes import ResponsesReply, new_id
from .store import MAX_RESPONSES

if TYPE_CHECKING:
    from ..runtime import Runtime


def tools_of(body: ResponsesRequest) -> Optional[ToolRequest]:
    """The flat function tools and tool_choice as the project's ToolRequest (a 400 naming the field)."""
    tools = [{"type": "function", "function": t.model_dump(include={"name", "description", "parameters"},
                                                           exclude_none=True)} for t in body.tools or ()]
    choice: Any = body.tool_choice
    if isinstance(choice, FunctionChoice):
        choice = {"type": "function", "function": {"name": choice.name}}
    return tool_request(tools or None, choice, body.parallel_tool_calls)


def _strict_specs(rt: "Runtime", body: ResponsesRequest, request: Optional[ToolRequest]
                  ) -> list[tuple[str, ConstraintSpec]]:
    """`auto` with strict tools: a lazy grammar that holds a call the model opens to its schema."""
    strict = frozenset(t.name for t in body.tools or () if t.strict)
    if request is None or request.choice != "auto" or not strict:
        return []
    if not rt.tool_format.json_calls:
        raise FieldError(f"strict: true needs a JSON tool-call format; this model writes calls as "
                         f"{rt.tool_format.parser}; send strict: false", param="tools", code="unsupported_parameter")
    return [("tools", lazy_tool_constraint(request, strict, rt.tool_format.start, rt.tool_format.end))]


def _earlier(rt: "Runtime", body: ResponsesRequest) -> tuple[dict, ...]:
    if body.previous_response_id is None:
        return ()
    found = rt.responses.get(body.previous_response_id)
    if found is None:
        raise FieldError(f"previous response '{body.previous_response_id}' is not found (this server keeps the "
                         f"{MAX_RESPONSES} most recent responses stored with store: true, in memory)",
                         param="previous_response_id", code="previous_response_not_found")
    return found.conversation


def _format_specs(body: ResponsesRequest) -> list[tuple[str, ConstraintSpec]]:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return []
    try:
        return [("text", ConstraintSpec("json_object") if fmt.type == "json_object" else schema_spec(fmt.schema_))]
    except RequestError as exc:  # e.g. longer than a constraint may be
        raise FieldError(str(exc), param="text") from None


def _sampling(rt: "Runtime", body: ResponsesRequest, plan: OutputPlan) -> Any:
    fields = GenerationRequest.model_construct(max_tokens=body.max_output_tokens, temperature=body.temperature,
                                               top_p=body.top_p)
    try:
        return sampling_params(fields, rt.config.sampling, rt.prompt_limit.slot_context, plan.constraint)
    except RequestError as exc:
        if exc.param != "max_tokens":
            raise
        raise FieldError(str(exc).replace("max_tokens", "max_output_tokens"), param="max_output_tokens") from None


def _tool_json(tool: Any) -> dict:
    return {"strict": False, **tool.model_dump(by_alias=True, exclude_none=True)}


def _echo(body: ResponsesRequest, sampling: Any) -> dict:
    """The request fields the response object reports (sampling as applied)."""
    choice = body.tool_choice
    fmt = body.text.format if body.text is not None else None
    return {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store is not False, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"},
                 "verbosity": "medium"},
        "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else (choice or "auto"),
        "tools": [_tool_json(t) for t in body.tools or ()], "top_logprobs": 0, "truncation": "disabled",
        "user": body.user, "background": False, "max_tool_calls": body.max_tool_calls, "service_tier": "default",
    }


def _prompt(rt: "Runtime", body: ResponsesRequest, request: Optional[ToolRequest], options: ChatOptions
            ) -> tuple[tuple[int, ...], Optional[int], list[dict], Any]:
    """(prompt ids, history boundary, the conversation in chat form without the instructions, its images)."""
    history = [*_earlier(rt, body), *input_messages(body.input)]
    if not history:
        raise FieldError("input is required: a string or a list of items", param="input")
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + history
    rt.prompt_limit.check_chars(content_chars(messages), "input")
    with blame("input"):
        messages, images = take_images(rt, messages, "input")
        rendered, tools = tool_messages(validate_messages(messages), request, rt.tool_format)
        prompt, media = chat_prompt(rt, rendered, tools, options, images, "input")
    return prompt.ids, prompt.history_boundary, history, media


def prepare_response(rt: "Runtime", raw: bytes) -> Prepared[ResponsesReply]:
    """POST /v1/responses: the conversation templated with its tools, sampling, the output's grammar."""
    body = parse_body(raw, ResponsesRequest)
    rt.check_model(body.model)
    refuse_unsupported(body, NOT_SUPPORTED)
    request = tools_of(body)
    options = reasoning_options(rt.thinks, body.reasoning)
    ids, boundary, history, media = _prompt(rt, body, request, options)
    plan = constrained_plan(request, _format_specs(body) + _strict_specs(rt, body, request), rt.tool_format,
                            rt.worker.compiler, candidates="text.format, strict tools and a forced tool_choice")
    sampling = with_thinking(rt, _sampling(rt, body, plan), ids)  # --reasoning-budget; formats start after it
    parsing = None
    if request is not None and request.choice != "none":  # with "none" the model was not shown the tools
        parsing = ToolParsing(rt.tool_format, request.as_openai(), request.parallel)
    reply = ResponsesReply(new_id("resp"), int(time.time()), rt.model_id, len(ids), _echo(body, sampling), parsing,
                           tuple(history), body.store is not False,
                           reply_reasoning(rt.reasoning, rt.loaded.tokenizer, ids))
    return with_images(Prepared(EngineRequest(reply.id, ids, sampling, boundary, **keep_fields(body, rt, ids)),
                                reply, bool(body.stream)), media)
