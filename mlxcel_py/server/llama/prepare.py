"""A /completion body -> the engine requests: llama-server's prompt forms (text, token ids, both
mixed, {"prompt_string"}; several at once, each n_cmpl times), the shared sampling and
structured-output fields, each reply's labels.

Everything here blocks (tokenizing, compiling a grammar) and runs off the event loop.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from typing import TYPE_CHECKING, Any, Optional

from ...engine import Request as EngineRequest
from ...engine import check_logit_bias
from ...errors import FieldError
from ...models import encode_text
from ..generation.logprobs import TokenPieces
from ..generation.fanout import PreparedGroup, copy_of, shared_prefix
from ..generation.prepared import blame, refuse_unsupported
from ..generation.images import MEDIA_MARKER, completion_images, imaged
from ..generation.keep import keep_fields
from ..generation.prompt import check_token_ids, completion_prompt_ids
from ..generation.sampling import fixed_scales, named_adapter, sampling_params
from ..generation.structured import output_plan
from ..http.body import parse_body
from .fields import NOT_SUPPORTED
from .probs import ProbsMaker
from .schemas import NativeCompletionRequest, PromptObject
from .shapes import NativeReply, generation_settings

if TYPE_CHECKING:
    from ..runtime import Runtime

MAX_SEQUENCES = 16  # prompts x n_cmpl in one request: each is an engine request (and a queue place)


def native_prompt(prompt: Any, rt: "Runtime") -> tuple[tuple[int, ...], str, Any]:
    """A /completion `prompt` (text, token ids, both mixed, or {"prompt_string", "multimodal_data"}) ->
    (token ids, the processed prompt as text, special tokens included, as llama-server reports it, and
    its images or None)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list, PromptObject)):
        prompt = prompt[0]
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:  # llama-server's multimodal prompt: the text with a marker per image
            media = completion_images(rt, prompt.prompt_string, prompt.multimodal_data, MEDIA_MARKER)
            return media.prompt_ids, rt.loaded.tokenizer.decode(list(media.prompt_ids)), media
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        ids = completion_prompt_ids(prompt, rt)
        return ids, rt.loaded.tokenizer.decode(list(ids)), None
    if not prompt:
        raise FieldError("prompt must not be empty", param="prompt")
    if any(isinstance(piece, (list, PromptObject)) for piece in prompt) or all(isinstance(p, str) for p in prompt):
        raise FieldError("a prompt in a list of prompts is text, token ids (mixed with text or not) or "
                         "{\"prompt_string\"}, not another list of prompts", param="prompt")
    rt.prompt_limit.check_chars(sum(len(p) for p in prompt if isinstance(p, str)), "prompt")
    ids: list[int] = []
    for i, piece in enumerate(prompt):
        # As llama-server: BOS (when the model wants one) only if the prompt starts with text.
        ids += [piece] if isinstance(piece, int) else encode_text(rt.loaded.tokenizer, piece, add_special_tokens=i == 0)
    check_token_ids(ids, rt.vocab_size, "prompt")
    return tuple(ids), rt.loaded.tokenizer.decode(ids), None


def native_prompts(prompt: Any, rt: "Runtime") -> list[tuple[tuple[int, ...], str, Any]]:
    """llama-server's array of prompts (a list of texts, token-id lists or {"prompt_string"}s), or one."""
    many = isinstance(prompt, list) and len(prompt) > 1 and (
        all(isinstance(p, str) for p in prompt) or any(isinstance(p, (list, PromptObject)) for p in prompt))
    return [native_prompt(p, rt) for p in prompt] if many else [native_prompt(prompt, rt)]


def copies_of(body: NativeCompletionRequest) -> int:
    """llama-server's n_cmpl (or n): completions per prompt."""
    n_cmpl, n = body.n_cmpl, body.n
    if n_cmpl is not None and n is not None and n_cmpl != n:
        raise FieldError(f"n_cmpl ({n_cmpl}) and n ({n}) ask for different counts; send one", param="n_cmpl")
    count = n_cmpl if n_cmpl is not None else n if n is not None else 1
    if not 1 <= count <= MAX_SEQUENCES:
        raise FieldError(f"{'n_cmpl' if n_cmpl is not None else 'n'} must be between 1 and {MAX_SEQUENCES} "
                         f"(got {count})", param="n_cmpl" if n_cmpl is not None else "n")
    return count


def refuse_native(body: NativeCompletionRequest) -> None:
    refuse_unsupported(body, NOT_SUPPORTED)
    if body.n_predict == 0:
        raise FieldError("n_predict 0 (evaluate the prompt only) is not supported; use -1 or a positive count",
                         param="n_predict", code="unsupported_parameter")


def lora_scales(entries: Any, rt: "Runtime", param: str = "lora") -> tuple[float, ...]:
    """llama-server's [{"id", "scale"}] over the loaded adapters: one scale each, an adapter left out at 0."""
    if not isinstance(entries, list):
        raise FieldError(f"{param} must be an array of {{\"id\", \"scale\"}}", param=param)
    ids = {a.id for a in rt.loaded.adapters}
    asked: dict[int, float] = {}
    for entry in entries:
        ident = entry.get("id") if isinstance(entry, dict) else None
        scale = entry.get("scale") if isinstance(entry, dict) else None
        if not isinstance(ident, int) or isinstance(ident, bool) or ident not in ids:
            raise FieldError(f"{param}: no adapter with id {ident!r} (GET /lora-adapters lists {sorted(ids)})",
                             param=param)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise FieldError(f"{param}: adapter {ident}'s scale must be a number (got {scale!r})", param=param)
        asked[ident] = float(scale)
    return fixed_scales(rt, tuple(asked.get(a.id, 0.0) for a in rt.loaded.adapters), param)


def request_lora(body: NativeCompletionRequest, rt: "Runtime") -> Optional[tuple[float, ...]]:
    """A request's own adapter scales (llama-server's per-request `lora`; an empty list: the server's), or None
    for the loaded scales (whose requests share the prompt cache)."""
    if body.adapters is not None:
        if body.lora:
            raise FieldError("lora and adapters both choose the adapters; send one", param="adapters")
        scales = named_adapter(rt, body.adapters)
    elif not body.lora:
        return None
    else:
        scales = lora_scales(body.lora, rt)
    return None if scales == rt.loaded.adapter_scales and rt.lora_override is None else scales


def prepare_native(rt: "Runtime", raw: bytes) -> PreparedGroup[NativeReply]:
    """POST /completion: each prompt's token ids (times n_cmpl), the sampling and constraint they
    share, and each reply's labels (its `index`: prompt-major)."""
    body = parse_body(raw, NativeCompletionRequest)
    rt.check_model(body.model)
    refuse_native(body)
    lora = request_lora(body, rt)
    with blame("prompt"):
        prompts = native_prompts(body.prompt, rt)
    return prepare_prompts(rt, body, prompts, lora)


def prepare_prompts(rt: "Runtime", body: NativeCompletionRequest, prompts: list[tuple[tuple[int, ...], str, Any]],
                    lora: Optional[tuple[float, ...]] = None) -> PreparedGroup[NativeReply]:
    """A /completion-shaped body's engine requests for `prompts` (ids, text, images), each n_cmpl times, with
    their own LoRA scales when `lora` (request_lora)."""
    copies = copies_of(body)
    if len(prompts) * copies > MAX_SEQUENCES:
        raise FieldError(f"{len(prompts)} prompts x {copies} completions is more than {MAX_SEQUENCES} sequences "
                         "in one request", param="prompt")
    plan = output_plan(body, None, rt.worker.compiler)  # grammar, json_schema, response_format: compiled here
    sampling = sampling_params(body, rt.config.sampling, rt.prompt_limit.slot_context, plan.constraint,
                               rt.loaded.tokenizer)
    check_logit_bias(sampling, rt.vocab_size)
    probs = None
    if sampling.logprobs:  # n_probs > 0; token bytes from llguidance's tables, built here off the loop
        sampling = dataclasses.replace(sampling, post_sampling_probs=bool(body.post_sampling_probs))
        probs = ProbsMaker(TokenPieces(rt.loaded.tokenizer, rt.worker.compiler), sampling.post_sampling_probs)
    stream = bool(body.stream)
    fields = tuple(body.response_fields) if body.response_fields is not None else None
    scales = lora or rt.lora_scales()
    settings = generation_settings(sampling, stream, body.n_keep or 0, body.n_discard or 0,
                                   tuple(zip(rt.loaded.adapters, scales)))
    stop_tokens = tuple((s, len(encode_text(rt.loaded.tokenizer, s, add_special_tokens=False)))
                        for s in sampling.stop) if probs else ()
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    jobs, replies = [], []
    for i, (ids, text, media) in enumerate(p for p in prompts for _ in range(copies)):
        replies.append(NativeReply(rt.model_id, text, len(ids), rt.prompt_limit.slot_context, settings,
                                   bool(body.return_tokens), bool(body.return_progress), fields, probs,
                                   stop_tokens, index=i))
        job = imaged(EngineRequest(f"cmpl-{uuid.uuid4().hex[:24]}", ids, sampling, None, cache_prompt,
                                   lora=lora, **keep_fields(body, rt, ids)), media)
        jobs.append(copy_of(shared_prefix(job), i % copies) if copies > 1 else job)
    return PreparedGroup(tuple(jobs), tuple(replies), stream)
