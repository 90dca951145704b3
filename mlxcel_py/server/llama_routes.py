"""llama-server's native routes: POST /completion (and /completions, which llama-server routes
there too, not to /v1/completions), GET /props, POST /apply-template.

Bodies are parsed, templated and tokenized off the event loop, as on the OpenAI routes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .. import __version__
from ..engine import Request as EngineRequest
from ..engine import check_logit_bias
from ..errors import RequestError
from ..models.vocab import hf_tokenizer
from .runtime import runtime
from .body import parse_body, read_body
from .errors import APIError, from_error
from .framed_stream import FramedStream, gather, start
from .llama_schemas import ApplyTemplateRequest, NativeCompletionRequest, PromptObject, refuse_unsupported
from .llama_shapes import NativeFramer, NativeReply, default_settings, final_json, generation_settings
from .prompts import check_token_ids, completion_prompt_ids, sampling_params
from .structured import output_plan
from .streaming import CLIENT_CLOSED

if TYPE_CHECKING:
    from .runtime import Runtime

@dataclass(frozen=True, slots=True)
class NativePrepared:
    job: EngineRequest
    reply: NativeReply
    stream: bool


def native_prompt(prompt: Any, rt: "Runtime") -> tuple[tuple[int, ...], str]:
    """A /completion `prompt` (text, token ids, both mixed, or {"prompt_string"}) -> (token ids, the
    processed prompt as text, special tokens included, as llama-server reports it)."""
    from ..models import encode_text

    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list, PromptObject)):
        prompt = prompt[0]
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:
            raise APIError(400, "prompt.multimodal_data is not supported: this server has no multimodal model",
                           param="prompt", code="unsupported_parameter")
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        ids = completion_prompt_ids(prompt, rt)
        return ids, rt.loaded.tokenizer.decode(list(ids))
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if any(isinstance(piece, (list, PromptObject)) for piece in prompt) or all(isinstance(p, str) for p in prompt):
        raise APIError(400, f"only one prompt per request is supported (got {len(prompt)})", param="prompt")
    rt.prompt_limit.check_chars(sum(len(p) for p in prompt if isinstance(p, str)), "prompt")
    ids: list[int] = []
    for i, piece in enumerate(prompt):
        # As llama-server: BOS (when the model wants one) only if the prompt starts with text.
        ids += [piece] if isinstance(piece, int) else encode_text(rt.loaded.tokenizer, piece, add_special_tokens=i == 0)
    check_token_ids(ids, rt.vocab_size, "prompt")
    return tuple(ids), rt.loaded.tokenizer.decode(ids)


def prepare_native(rt: "Runtime", raw: bytes) -> NativePrepared:
    body = parse_body(raw, NativeCompletionRequest)
    rt.check_model(body.model)
    refuse_unsupported(body)
    try:
        ids, text = native_prompt(body.prompt, rt)
    except RequestError as exc:
        raise from_error(exc, "prompt") from None
    plan = output_plan(body, None, rt.worker.compiler)  # grammar, json_schema, response_format: compiled here
    sampling = sampling_params(body, rt.config.sampling, rt.prompt_limit.slot_context, plan.constraint)
    try:
        check_logit_bias(sampling, rt.vocab_size)
    except RequestError as exc:
        raise from_error(exc) from None
    stream = bool(body.stream)
    fields = tuple(body.response_fields) if body.response_fields is not None else None
    reply = NativeReply(rt.model_id, text, len(ids), rt.prompt_limit.slot_context,
                        generation_settings(sampling, stream), bool(body.return_tokens), bool(body.return_progress),
                        fields)
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    job = EngineRequest(f"cmpl-{uuid.uuid4().hex[:24]}", ids, sampling, None, cache_prompt)
    return NativePrepared(job, reply, stream)


async def completion(request: Request) -> Response:
    """llama-server's native completion: `content`, `tokens`, `timings`, ...; streamed as {"content", "stop"} frames."""
    prepared, gen = await start(request, prepare_native, "prompt")
    if gen is None:
        return Response(status_code=CLIENT_CLOSED)
    if prepared.stream:
        return FramedStream(NativeFramer(prepared.reply), gen, prepared.job.request_id)
    got = await gather(request.receive, gen)
    if got is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(final_json(prepared.reply, got.text, got.token_ids, got.finished))


def _default_path(rt: "Runtime") -> str:
    from ..models import ModelLoadError, default_model_path

    try:
        return default_model_path()  # the embedded model's file
    except ModelLoadError:
        return rt.loaded.name


def _token_text(tokenizer: Any, name: str) -> str:
    value = getattr(hf_tokenizer(tokenizer), name, None)
    return value if isinstance(value, str) else ""


async def props(request: Request) -> dict:
    """llama-server's server properties (read-only, as llama-server without --props)."""
    rt = runtime(request)
    stats = rt.worker.stats()
    template = getattr(rt.loaded.tokenizer, "chat_template", None)
    return {
        "default_generation_settings": {"params": default_settings(rt.config.sampling),
                                        "n_ctx": stats.slot_context},
        "total_slots": len(stats.slots),
        "model_alias": rt.model_id,
        "model_path": rt.config.model.path or _default_path(rt),
        "modalities": {"vision": False, "video": False, "audio": False},
        "chat_template": template if isinstance(template, str) else "",
        "bos_token": _token_text(rt.loaded.tokenizer, "bos_token"),
        "eos_token": _token_text(rt.loaded.tokenizer, "eos_token"),
        "build_info": f"mlxcel-py {__version__}",
        "is_sleeping": False, "ui": False, "cors_proxy_enabled": False,
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
    }


def _apply_template(rt: "Runtime", raw: bytes) -> dict:
    from ..models import render_chat
    from ..models.chat import validate_messages
    from ..tool_calls.render import tool_messages

    body = parse_body(raw, ApplyTemplateRequest)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        messages, _ = tool_messages(validate_messages(messages), None, rt.tool_format)
        return {"prompt": render_chat(rt.loaded.tokenizer, messages)}
    except RequestError as exc:
        raise from_error(exc, "messages") from None


async def apply_template(request: Request) -> dict:
    """The prompt text the chat messages render to, as /v1/chat/completions would feed the model."""
    rt = runtime(request)
    return await rt.off_loop(_apply_template, rt, await read_body(request, rt.max_body_bytes))

