"""An Anthropic Messages body -> the engine request, through the same machinery as the OpenAI
chat route: messages in OpenAI's form (tool_use -> tool_calls, tool_result -> tool turns),
`tools`/`tool_choice` through mlxcel_py.tool_calls, the model's chat template, sampling.

Everything here blocks (templating, tokenizing, compiling a forced call's grammar) and
runs off the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import TYPE_CHECKING, Any, Optional, Union

from ...engine import Request as EngineRequest
from ...errors import FieldError
from ...models.chat import validate_messages
from ...tool_calls import ToolRequest, call_constraint, tool_messages, tool_request
from ..generation.images import chat_prompt, image_part, take_images, with_images
from ..generation.keep import keep_fields
from ..generation.prepared import Prepared, blame, refuse_unsupported
from ..generation.prompt import content_chars
from ..generation.reasoning import reply_reasoning
from ..generation.sampling import sampling_params
from ..generation.thinking import with_thinking
from ..generation.schemas import GenerationRequest
from ..http.body import parse_body
from .fields import NOT_SUPPORTED, thinking_budget, thinking_options
from .schemas import CountTokensRequest, Message, MessagesRequest, TextBlock
from .shapes import AnthropicReply

if TYPE_CHECKING:
    from ..runtime import Runtime

# Claude Code's system prompt starts with a per-request stamp (cch=xxxxx;) that would defeat the
# prompt cache; llama-server blanks it the same way (llama.cpp PR 21793).
_BILLING_STAMP = re.compile(r"^(x-anthropic-billing-header:[^\n]*?cch=)[0-9a-zA-Z]{5};")


def _text(blocks: Union[str, list[TextBlock], None]) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    return "\n".join(b.text for b in blocks)


def _result_text(text: str, is_error: Optional[bool]) -> str:
    """A tool result's text; an error's says so once ("Error: " unless it already starts with
    it, after leading whitespace, in any case)."""
    return f"Error: {text}" if is_error and not text.lstrip().lower().startswith("error:") else text


def _system(text: str) -> dict:
    return {"role": "system", "content": _BILLING_STAMP.sub(r"\g<1>fffff;", text)}


def _turns(i: int, msg: Message) -> list[dict]:
    """One Anthropic message as OpenAI turns: tool results first (they answer the previous calls)."""
    if isinstance(msg.content, str):
        return [_system(msg.content) if msg.role == "system" else {"role": msg.role, "content": msg.content}]
    allowed = {"system": ("text",), "user": ("text", "tool_result", "image"),
               "assistant": ("text", "thinking", "tool_use")}[msg.role]
    for j, block in enumerate(msg.content):
        if block.type not in allowed:
            raise FieldError(f"messages[{i}].content[{j}]: {'an' if msg.role == 'assistant' else 'a'} "
                             f"{msg.role} message cannot hold a '{block.type}' block", param="messages")
    text = "\n".join(b.text for b in msg.content if b.type == "text")
    if msg.role == "system":
        return [_system(text)]
    results = [{"role": "tool", "tool_call_id": b.tool_use_id,
                "content": _result_text(_text(b.content), b.is_error)}
               for b in msg.content if b.type == "tool_result"]
    if any(b.type == "image" for b in msg.content):  # text and images in order (generation/images.py)
        parts = [image_part(_data_url(b.source)) if b.type == "image" else {"type": "text", "text": b.text}
                 for b in msg.content if b.type in ("text", "image")]
        return results + [{"role": "user", "content": parts}]
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in msg.content if b.type == "tool_use"]
    # Thinking sent back is the turn's reasoning_content, for templates that render it.
    thought = "\n".join(b.thinking for b in msg.content if b.type == "thinking")
    reasoning = {"reasoning_content": thought} if thought else {}
    if calls:
        return results + [{"role": "assistant", "content": text or None, "tool_calls": calls, **reasoning}]
    return results + ([{"role": msg.role, "content": text, **reasoning}] if text or reasoning or not results else [])


def _data_url(source: Any) -> str:
    """An image block's source as a data: URL (a url source as given: the image checks refuse it)."""
    if source.type == "url":
        return source.url or ""
    return f"data:{source.media_type or 'image/png'};base64,{source.data or ''}"


def openai_messages(body: CountTokensRequest) -> list[dict]:
    """The conversation in OpenAI's form, for the chat template."""
    if body.messages[-1].role == "assistant":
        raise FieldError("a final assistant message (prefill) is not supported by this server; "
                         "end with a user message", param="messages")
    out = [_system(_text(body.system))] if body.system else []
    for i, msg in enumerate(body.messages):
        out += _turns(i, msg)
    return out


def tools_of(body: CountTokensRequest) -> Optional[ToolRequest]:
    """Anthropic's tools and tool_choice as the project's ToolRequest (a 400 naming the field if invalid)."""
    choice: Any = None
    parallel = None
    if body.tool_choice is not None:
        kind = body.tool_choice.type
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": body.tool_choice.name}}
        parallel = None if body.tool_choice.disable_parallel_tool_use is None \
            else not body.tool_choice.disable_parallel_tool_use
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                               **({"description": t.description} if t.description else {})}}
             for t in body.tools or ()]
    return tool_request(tools or None, choice, parallel)


def _prompt(rt: "Runtime", body: CountTokensRequest
            ) -> tuple[tuple[int, ...], Optional[int], Optional[ToolRequest], Any]:
    refuse_unsupported(body, NOT_SUPPORTED)
    options = thinking_options(rt.thinks, body.thinking)
    with blame("messages"):
        request = tools_of(body)
        messages = openai_messages(body)
        rt.prompt_limit.check_chars(content_chars(messages), "messages")
        messages, images = take_images(rt, messages)
        messages, tools = tool_messages(validate_messages(messages), request, rt.tool_format)
        prompt, media = chat_prompt(rt, messages, tools, options, images)
    return prompt.ids, prompt.history_boundary, request, media


def count_tokens(rt: "Runtime", raw: bytes) -> dict:
    """{"input_tokens": n} of the prompt the body would run."""
    body = parse_body(raw, CountTokensRequest)
    return {"input_tokens": len(_prompt(rt, body)[0])}


def prepare_messages(rt: "Runtime", raw: bytes) -> Prepared[AnthropicReply]:
    """POST /v1/messages: the conversation templated with its tools, sampling, a forced call's grammar."""
    body = parse_body(raw, MessagesRequest)
    rt.check_model(body.model)
    budget = thinking_budget(body.thinking)
    ids, boundary, request, media = _prompt(rt, body)
    fields = {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
              "top_k": body.top_k, "stop": body.stop_sequences}
    sampling = sampling_params(GenerationRequest.model_construct(**fields), rt.config.sampling,
                               rt.prompt_limit.slot_context)
    with blame("tool_choice"):
        constraint = call_constraint(request, rt.tool_format)
        if constraint is not None:
            if rt.worker.compiler is None:
                raise FieldError("a forced tool_choice needs constrained decoding, which this engine lacks",
                                 param="tool_choice")
            rt.worker.compiler.compile(constraint)  # a grammar error is a 400 now, not a failed request later
            sampling = dataclasses.replace(sampling, constraint=constraint)
    sampling = with_thinking(rt, sampling, ids, budget)  # a forced call starts after the thinking
    shown = request if request is not None and request.choice != "none" else None
    reply = AnthropicReply(f"msg_{uuid.uuid4().hex[:24]}", rt.model_id, len(ids), sampling.max_tokens, shown,
                           rt.tool_format, reply_reasoning(rt.reasoning, rt.loaded.tokenizer, ids))
    return with_images(Prepared(EngineRequest(reply.id, ids, sampling, boundary, **keep_fields(body, rt, ids)),
                                reply, bool(body.stream)), media)
