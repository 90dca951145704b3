"""llama-server's own routes: POST /completion (and /completions, which llama-server routes
there too, not to /v1/completions), GET /props, POST /apply-template, /tokenize, /detokenize.

Bodies are parsed, templated and tokenized off the event loop, as on the other dialects' routes.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ... import __version__
from ...serve_config import ServerConfig
from ...errors import FieldError, RequestError
from ...models import ModelLoadError, default_model_path, encode_text, render_chat
from ...models.chat import validate_messages
from ...models.vocab import decode_continuation, hf_tokenizer
from ...tool_calls import tool_messages
from ..generation.collect import collect
from ..generation.fanout import GenerationGroup, PreparedGroup, collect_all, start_all
from ..generation.images import MEDIA_MARKER
from ..generation.prepared import blame
from ..generation.prompt import check_token_ids
from ..generation.stream import FramedStream
from ..generation.submit import CLIENT_CLOSED
from ..generation.template import chat_options
from ..http.body import parse_body, read_body
from ..runtime import routed, runtime
from .infill import prepare_infill
from .prepare import lora_scales, prepare_native
from .schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from .shapes import NativeFramer, NativeGroupFramer, NativeReply, default_settings, final_json

if TYPE_CHECKING:
    from ..runtime import Runtime


async def completion(request: Request) -> Response:
    """llama-server's native completion: `content`, `tokens`, `timings`, ...; streamed as {"content", "stop"}
    frames. Several prompts (or n_cmpl) answer a JSON array, streamed with each frame's `index`."""
    return await _native(request, prepare_native, "prompt")


async def infill(request: Request) -> Response:
    """llama-server's /infill: a /completion of the fill-in-the-middle prompt (infill.py)."""
    return await _native(request, prepare_infill, "input_prefix")


async def _native(request: Request, prepare, param: str) -> Response:
    prepared, members = await start_all(request, prepare, param)
    if members is None:
        return Response(status_code=CLIENT_CLOSED)
    if len(members) > 1:
        return await _completions(request, prepared, GenerationGroup(members))
    gen, reply = members[0], prepared.replies[0]
    if prepared.stream:
        return FramedStream(NativeFramer(reply), gen, gen.handle.request_id)
    whole = await collect(request.receive, gen)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(final_json(reply, whole.text, whole.token_ids, whole.finished,
                                   _probabilities(reply, whole)))


async def _completions(request: Request, prepared: PreparedGroup[NativeReply], group: GenerationGroup) -> Response:
    if prepared.stream:
        return FramedStream(NativeGroupFramer(prepared.replies), group, prepared.jobs[0].request_id)
    wholes = await collect_all(request.receive, group)
    if wholes is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse([final_json(reply, w.text, w.token_ids, w.finished, _probabilities(reply, w))
                         for reply, w in zip(prepared.replies, wholes)])


def _probabilities(reply: NativeReply, whole: Any) -> Optional[list[dict]]:
    """The whole reply's completion_probabilities: as llama-server, less as many tokens as the
    stop string that ended it has."""
    if reply.probs is None:
        return None
    records = whole.logprobs
    drop = dict(reply.stop_tokens).get(whole.finished.stop_word or "", 0)
    return reply.probs.entries(records[: max(len(records) - drop, 0)])


def _default_path(rt: "Runtime") -> str:
    try:
        return default_model_path()  # the embedded model's file
    except ModelLoadError:
        return rt.loaded.name


def _token_text(tokenizer: Any, name: str) -> str:
    value = getattr(hf_tokenizer(tokenizer), name, None)
    return value if isinstance(value, str) else ""


async def props(request: Request) -> dict:
    """llama-server's server properties (read-only, as llama-server without --props); with several
    models, of the one `?model=` names (as llama-server's router)."""
    async with routed(request, name=request.query_params.get("model")) as rt:
        return _props(rt)


async def lora_adapters(request: Request) -> list:
    """llama-server's GET /lora-adapters: the adapters loaded with the model and the scales requests without
    their own `lora` run at."""
    async with routed(request, name=request.query_params.get("model")) as rt:
        return [{"id": a.id, "path": a.path, "scale": s} for a, s in zip(rt.loaded.adapters, rt.lora_scales())]


async def set_lora_adapters(request: Request) -> dict:
    """llama-server's POST /lora-adapters: [{"id", "scale"}] for the requests that follow without their own
    `lora` (an adapter left out: 0); requests already running keep theirs."""
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, name=request.query_params.get("model")) as rt:  # the body is an array
        try:
            entries = json.loads(raw)
        except ValueError:
            raise FieldError("the body must be a JSON array of {\"id\", \"scale\"}", param="body") from None
        scales = lora_scales(entries, rt, "body")
        rt.lora_override = None if scales == rt.loaded.adapter_scales else scales
        return {"success": True}


def _props(rt: "Runtime") -> dict:
    stats = rt.worker.stats()
    server = rt.config.server or ServerConfig()
    return {
        "default_generation_settings": {"params": default_settings(rt.config.sampling,
                                                                   tuple(zip(rt.loaded.adapters, rt.lora_scales()))),
                                        "n_ctx": stats.slot_context},
        "total_slots": len(stats.slots),
        "model_alias": rt.model_id,
        "model_path": rt.config.model.path or _default_path(rt),
        "modalities": {"vision": rt.loaded.vision is not None, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "chat_template": rt.template_text,
        "bos_token": _token_text(rt.loaded.tokenizer, "bos_token"),
        "eos_token": _token_text(rt.loaded.tokenizer, "eos_token"),
        "build_info": f"mlxcel-py {__version__}",
        "is_sleeping": False, "ui": server.webui, "cors_proxy_enabled": False,
        "endpoint_slots": server.endpoint_slots, "endpoint_props": False,
        "endpoint_metrics": server.endpoint_metrics,
    }


def _apply_template(rt: "Runtime", raw: bytes) -> dict:
    body = parse_body(raw, ApplyTemplateRequest)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    options = chat_options(body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs)
    with blame("messages"):
        messages, _ = tool_messages(validate_messages(messages), None, rt.tool_format)
        return {"prompt": render_chat(rt.loaded.tokenizer, messages, template=rt.chat_template, options=options)}


async def apply_template(request: Request) -> dict:
    """The prompt text the chat messages render to, as /v1/chat/completions would feed the model."""
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, name=request.query_params.get("model")) as rt:  # the body is an array
        return await rt.off_loop(_apply_template, rt, raw)


def _tokenize(rt: "Runtime", raw: bytes) -> dict:
    body = parse_body(raw, TokenizeRequest)
    try:
        ids = encode_text(rt.loaded.tokenizer, body.content, add_special_tokens=bool(body.add_special))
    except RequestError as exc:  # encode_text names its own `prompt`; this body's field is `content`
        raise FieldError(str(exc), param="content") from None
    if not body.with_pieces:
        return {"tokens": list(ids)}
    decode = rt.loaded.tokenizer.decode
    return {"tokens": [{"id": t, "piece": decode([t])} for t in ids]}


def _detokenize(rt: "Runtime", raw: bytes) -> dict:
    body = parse_body(raw, DetokenizeRequest)
    check_token_ids(body.tokens, rt.vocab_size, "tokens")
    return {"content": decode_continuation(rt.loaded.tokenizer, body.tokens)}


async def tokenize(request: Request) -> dict:
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, name=request.query_params.get("model")) as rt:  # the body is an array
        return await rt.off_loop(_tokenize, rt, raw)


async def detokenize(request: Request) -> dict:
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, name=request.query_params.get("model")) as rt:  # the body is an array
        return await rt.off_loop(_detokenize, rt, raw)
