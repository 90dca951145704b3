"""A /completion body -> the engine request: llama-server's prompt forms (text, token ids, both
mixed, {"prompt_string"}), the shared sampling and structured-output fields, the reply's labels.

Everything here blocks (tokenizing, compiling a grammar) and runs off the event loop.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

from ...engine import Request as EngineRequest
from ...engine import check_logit_bias
from ...errors import FieldError
from ...models import encode_text
from ..generation.logprobs import TokenPieces
from ..generation.prepared import Prepared, blame, refuse_unsupported
from ..generation.prompt import check_token_ids, completion_prompt_ids
from ..generation.sampling import sampling_params
from ..generation.structured import output_plan
from ..http.body import parse_body
from .fields import NOT_SUPPORTED
from .probs import ProbsMaker
from .schemas import NativeCompletionRequest, PromptObject
from .shapes import NativeReply, generation_settings

if TYPE_CHECKING:
    from ..runtime import Runtime


def native_prompt(prompt: Any, rt: "Runtime") -> tuple[tuple[int, ...], str]:
    """A /completion `prompt` (text, token ids, both mixed, or {"prompt_string"}) -> (token ids, the
    processed prompt as text, special tokens included, as llama-server reports it)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list, PromptObject)):
        prompt = prompt[0]
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:
            raise FieldError("prompt.multimodal_data is not supported: this server has no multimodal model",
                             param="prompt", code="unsupported_parameter")
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        ids = completion_prompt_ids(prompt, rt)
        return ids, rt.loaded.tokenizer.decode(list(ids))
    if not prompt:
        raise FieldError("prompt must not be empty", param="prompt")
    if any(isinstance(piece, (list, PromptObject)) for piece in prompt) or all(isinstance(p, str) for p in prompt):
        raise FieldError(f"only one prompt per request is supported (got {len(prompt)})", param="prompt")
    rt.prompt_limit.check_chars(sum(len(p) for p in prompt if isinstance(p, str)), "prompt")
    ids: list[int] = []
    for i, piece in enumerate(prompt):
        # As llama-server: BOS (when the model wants one) only if the prompt starts with text.
        ids += [piece] if isinstance(piece, int) else encode_text(rt.loaded.tokenizer, piece, add_special_tokens=i == 0)
    check_token_ids(ids, rt.vocab_size, "prompt")
    return tuple(ids), rt.loaded.tokenizer.decode(ids)


def _refuse(body: NativeCompletionRequest) -> None:
    refuse_unsupported(body, NOT_SUPPORTED)
    if body.n_predict == 0:
        raise FieldError("n_predict 0 (evaluate the prompt only) is not supported; use -1 or a positive count",
                         param="n_predict", code="unsupported_parameter")


def prepare_native(rt: "Runtime", raw: bytes) -> Prepared[NativeReply]:
    """POST /completion: the prompt's token ids, sampling and constraint, and the reply's labels."""
    body = parse_body(raw, NativeCompletionRequest)
    rt.check_model(body.model)
    _refuse(body)
    with blame("prompt"):
        ids, text = native_prompt(body.prompt, rt)
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
    reply = NativeReply(rt.model_id, text, len(ids), rt.prompt_limit.slot_context,
                        generation_settings(sampling, stream), bool(body.return_tokens), bool(body.return_progress),
                        fields, probs)
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    job = EngineRequest(f"cmpl-{uuid.uuid4().hex[:24]}", ids, sampling, None, cache_prompt)
    return Prepared(job, reply, stream)
