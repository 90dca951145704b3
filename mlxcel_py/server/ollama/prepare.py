"""An Ollama /api/chat or /api/generate body -> the engine request, through the machinery the
other dialects use: messages in OpenAI's form for the chat template and mlxcel_py.tool_calls,
`format` through structured output, `options` through the shared sampling fields.

Everything here blocks (templating, tokenizing, compiling a grammar) and runs off the event loop.
A body with no messages (no prompt) only asks for the model to be loaded: `None`, answered at once.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import TYPE_CHECKING, Any, Optional

from ...engine import ConstraintSpec
from ...engine import Request as EngineRequest
from ...errors import ConfigError, FieldError, PromptTooLongError, RequestError
from ...models import encode_chat, encode_text
from ...models.chat import ChatOptions, validate_messages
from ...serve_models import parse_keep_alive
from ...tool_calls import ToolRequest, tool_messages, tool_request
from ..generation.assembler import Shape, ToolParsing
from ..generation.fim import fim_prompt
from ..generation.images import base64_parts, chat_prompt, take_images, with_images
from ..generation.logprobs import TokenPieces
from ..generation.keep import keep_fields, shift_field
from ..generation.prepared import Prepared, blame, refuse_unsupported
from ..generation.prompt import check_token_ids, content_chars
from ..generation.reasoning import reply_reasoning
from ..generation.sampling import chain_params, sampling_params
from ..generation.thinking import with_thinking
from ..generation.schemas import GenerationRequest
from ..generation.structured import compile_constraint, schema_spec
from ..http.body import parse_body
from .fields import CHAT_NOT_SUPPORTED, GENERATE_NOT_SUPPORTED, OPTIONS_NOT_SUPPORTED, think_options
from .schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaMessage, OllamaOptions, OllamaRequest
from .shapes import OllamaReply

if TYPE_CHECKING:
    from ...engine import SamplingParams
    from ..runtime import Runtime


def _with_images(text: str, images: list[str], where: str) -> list[dict]:
    """Ollama's base64 images after a text, as OpenAI-form parts (generation/images.py)."""
    return [{"type": "text", "text": text}, *base64_parts(images, where)]


def _turn(i: int, msg: OllamaMessage, pending: list[tuple[str, str]]) -> dict:
    """One Ollama message in OpenAI's form; `pending`: the (id, name) of calls not yet answered."""
    if msg.images:
        return {"role": msg.role, "content": _with_images(msg.content or "", msg.images, f"messages[{i}].images")}
    if msg.role == "assistant" and msg.tool_calls:
        calls = [{"id": c.id or f"call_{i}_{j}", "type": "function",
                  "function": {"name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                 for j, c in enumerate(msg.tool_calls)]
        pending[:] = [(c["id"], c["function"]["name"]) for c in calls]
        return {"role": "assistant", "content": msg.content or None, "tool_calls": calls, **_thought(msg)}
    if msg.role == "tool":  # Ollama names the tool; OpenAI's form names the call it answers
        named = [p for p in pending if msg.tool_name in (None, p[1])]
        call_id = msg.tool_call_id or (named[0][0] if named else f"call_{i}")
        pending[:] = [p for p in pending if p[0] != call_id]
        return {"role": "tool", "tool_call_id": call_id, "content": msg.content or ""}
    return {"role": msg.role, "content": msg.content or "", **(_thought(msg) if msg.role == "assistant" else {})}


def _thought(msg: OllamaMessage) -> dict:
    """An earlier turn's thinking, as the template's reasoning_content."""
    return {"reasoning_content": msg.thinking} if msg.thinking else {}


def openai_messages(body: OllamaChatRequest) -> list[dict]:
    """The conversation in OpenAI's form, for the chat template."""
    pending: list[tuple[str, str]] = []
    return [_turn(i, msg, pending) for i, msg in enumerate(body.messages)]


def _constraint(rt: "Runtime", body: OllamaRequest) -> Optional[ConstraintSpec]:
    """`format`: "json" is any JSON object, an object is a JSON schema (closed objects, as Ollama's
    llama.cpp grammar has them); compiled now (a 400 if it cannot be)."""
    fmt = body.format
    if fmt is None or fmt == "":
        return None
    try:
        spec = ConstraintSpec("json_object") if fmt == "json" else schema_spec(fmt)
    except RequestError as exc:
        raise FieldError(str(exc), param="format") from None
    compile_constraint(rt.worker.compiler, spec, "format")
    return spec


def _max_tokens(options: OllamaOptions) -> Optional[int]:
    """num_predict: -1 (no limit) and -2 (fill the context) leave the server's default."""
    n = options.num_predict
    if n is not None and (n == 0 or n < -2):
        raise FieldError(f"options.num_predict must be positive, -1 or -2 (got {n})", param="options")
    return None if n is None or n < 0 else n


def _refuse_options(options: OllamaOptions) -> None:
    try:
        refuse_unsupported(options, OPTIONS_NOT_SUPPORTED)
    except FieldError as exc:
        raise FieldError(f"'options.{str(exc)[1:]}", param="options", code=exc.code) from None


def _sampling(rt: "Runtime", body: OllamaRequest, num_prompt: int,
              constraint: Optional[ConstraintSpec]) -> "SamplingParams":
    """`options` over the server's defaults; num_ctx caps prompt + reply (beyond a slot it is the slot)."""
    options = body.options or OllamaOptions()
    _refuse_options(options)
    fields = {name: getattr(options, name) for name in (
        "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
        "presence_penalty", "frequency_penalty")}
    req = GenerationRequest.model_construct(max_tokens=_max_tokens(options), **fields)
    sampling = sampling_params(req, rt.config.sampling, rt.prompt_limit.slot_context, constraint)
    try:  # typical_p and mirostat (with its tau and eta): llama.cpp's chain, as Ollama's runner
        sampling = dataclasses.replace(sampling, chain=chain_params(options, sampling.chain))
    except RequestError as exc:
        raise FieldError(f"options.{exc}", param="options") from None
    window = options.num_ctx
    if window is None or window >= rt.prompt_limit.slot_context:
        return sampling
    if num_prompt >= window:
        raise PromptTooLongError(f"the prompt has {num_prompt} tokens, but options.num_ctx is {window}; raise "
                                 "num_ctx or shorten the prompt", n_prompt_tokens=num_prompt, n_ctx=window,
                                 param="options")
    return dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, window - num_prompt))


def _logprobs(body: OllamaRequest, sampling: "SamplingParams") -> "SamplingParams":
    if not body.logprobs:
        if body.top_logprobs:
            raise FieldError("top_logprobs needs logprobs: true", param="top_logprobs")
        return sampling
    try:
        return dataclasses.replace(sampling, logprobs=True, top_logprobs=body.top_logprobs or 0)
    except RequestError as exc:
        raise FieldError(str(exc), param="top_logprobs") from None


def request_keep_alive(value: object) -> float:
    """A request's keep_alive in seconds (-1: never unload); a 400 naming it when it is not a duration."""
    try:
        return parse_keep_alive(value, "keep_alive")
    except ConfigError as exc:
        raise FieldError(str(exc), param="keep_alive") from None


def _check(rt: "Runtime", body: OllamaRequest, table: tuple, empty: bool) -> None:
    rt.check_model(body.model)
    refuse_unsupported(body, table)
    if rt.routed:  # one of several models: keep_alive is how long it stays resident after this request
        rt.keep_alive = None if body.keep_alive is None else request_keep_alive(body.keep_alive)
    elif empty and body.keep_alive in (0, 0.0, "0", "0s", "0m"):
        raise FieldError("keep_alive 0 asks to unload the model; this server keeps its one model loaded "
                         "for its lifetime (stop the server to free it)", param="keep_alive")


def _reply(rt: "Runtime", body: OllamaRequest, kind: str, ids: tuple[int, ...], arrived: float,
           tools: Optional[ToolRequest] = None) -> OllamaReply:
    parsing = ToolParsing(rt.tool_format, tools.as_openai(), tools.parallel) if tools is not None else None
    reasoning = reply_reasoning(rt.reasoning, rt.loaded.tokenizer, ids)
    if not body.logprobs:
        return OllamaReply(kind, rt.model_id, arrived, ids, Shape(tools=parsing, reasoning=reasoning))
    # Token bytes from llguidance's tables: built here, off the event loop, on first use.
    pieces = TokenPieces(rt.loaded.tokenizer, rt.worker.compiler)
    return OllamaReply(kind, rt.model_id, arrived, ids,
                       Shape(body.top_logprobs or 0, tools=parsing, pieces=pieces, reasoning=reasoning))


def _prepared(rt: "Runtime", body: OllamaRequest, reply: OllamaReply, boundary: Optional[int]) -> Prepared[OllamaReply]:
    sampling = _logprobs(body, _sampling(rt, body, len(reply.prompt_ids), _constraint(rt, body)))
    sampling = with_thinking(rt, sampling, reply.prompt_ids)  # --reasoning-budget; `format` starts after it
    job = EngineRequest(f"ollama-{uuid.uuid4().hex[:24]}", reply.prompt_ids, sampling, boundary,
                        **keep_fields(body, rt, reply.prompt_ids), **shift_field(body.shift, rt))  # num_keep: ignored
    return Prepared(job, reply, body.stream is not False)


def prepare_chat(rt: "Runtime", raw: bytes, arrived: float) -> Optional[Prepared[OllamaReply]]:
    """POST /api/chat: the messages templated with the request's tools; None for a load-only body."""
    body = parse_body(raw, OllamaChatRequest)
    _check(rt, body, CHAT_NOT_SUPPORTED, not body.messages)
    if not body.messages:
        return None
    with blame("messages"):
        request = tool_request([t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None)
        messages = openai_messages(body)
        rt.prompt_limit.check_chars(content_chars(messages), "messages")
        messages, images = take_images(rt, messages, name=body.model)
        messages, tools = tool_messages(validate_messages(messages), request, rt.tool_format)
        prompt, media = chat_prompt(rt, messages, tools, _think(rt, body), images)
    return with_images(_prepared(rt, body, _reply(rt, body, "chat", prompt.ids, arrived, request),
                                 prompt.history_boundary), media)


def _think(rt: "Runtime", body: OllamaRequest) -> ChatOptions:
    return think_options(rt.thinks, body.think, body.model or rt.model_id)


def _generate_ids(rt: "Runtime", body: OllamaGenerateRequest) -> tuple[tuple[int, ...], Any]:
    """The prompt's ids: as written with `raw`, else one user turn (after `system`) in the chat template;
    and the prompt's images (`images`, after the text: templated only, without an earlier `context`)."""
    rt.prompt_limit.check_chars(len(body.prompt) + len(body.system or ""), "prompt")
    options = _think(rt, body)  # think: true on a model without thinking is a 400, raw or not
    if body.suffix:  # fill-in-the-middle: the code before the insertion and after it, in the model's FIM form
        for field in ("system", "images", "context"):
            if getattr(body, field):
                raise FieldError(f"{field} cannot be used with suffix (an insertion's prompt is the code before "
                                 "and after it)", param=field)
        return tuple(fim_prompt(rt, body.prompt, body.suffix, param="suffix")), None
    if body.images:
        if body.raw or body.context:
            raise FieldError("images go into the model's template: not with raw: true or an earlier context "
                             "(send the conversation to /api/chat)", param="images")
        turns = ([{"role": "system", "content": body.system}] if body.system else []) + \
            [{"role": "user", "content": _with_images(body.prompt, body.images, "images")}]
        turns, images = take_images(rt, turns, "images", name=body.model)
        prompt, media = chat_prompt(rt, validate_messages(turns), None, options, images)
        return prompt.ids, media
    if body.raw:
        if body.system:
            raise FieldError("system has no effect with raw: true (the prompt is sent as written); put it "
                             "in the prompt", param="system")
        if body.think is False and rt.thinks:
            raise FieldError("think: false has no effect with raw: true (the prompt is sent as written, "
                             "no template turns the thinking off)", param="think")
        ids = encode_text(rt.loaded.tokenizer, body.prompt)
    else:
        turns = ([{"role": "system", "content": body.system}] if body.system else []) + \
            [{"role": "user", "content": body.prompt}]
        ids = encode_chat(rt.loaded.tokenizer, turns, template=rt.chat_template, options=options).ids
    if body.context:  # an earlier reply's `context`: that conversation, then this prompt
        check_token_ids(body.context, rt.vocab_size, "context")
        ids = tuple(body.context) + ids
    return ids, None


def prepare_generate(rt: "Runtime", raw: bytes, arrived: float) -> Optional[Prepared[OllamaReply]]:
    """POST /api/generate: the prompt (templated unless `raw`); None for a load-only body."""
    body = parse_body(raw, OllamaGenerateRequest)
    _check(rt, body, GENERATE_NOT_SUPPORTED, not body.prompt)
    if not body.prompt:
        return None
    with blame("prompt"):
        ids, media = _generate_ids(rt, body)
    return with_images(_prepared(rt, body, _reply(rt, body, "generate", ids, arrived), None), media)
