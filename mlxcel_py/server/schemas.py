"""Request bodies (OpenAI fields plus llama-server extras) and their mapping to engine records."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from ..engine import SamplingParams
from ..errors import RequestError
from .errors import APIError

MAX_BODY_BYTES = 32 << 20
ModelT = TypeVar("ModelT", bound=BaseModel)


class _Body(BaseModel):
    # Strict: JSON types must match (no "0.5" -> 0.5); unknown fields are ignored like OpenAI's.
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: Optional[bool] = None


class GenerationRequest(_Body):
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    n_predict: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    repeat_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    logprobs: Any = None
    ignore_eos: Optional[bool] = None
    cache_prompt: Optional[bool] = None
    return_progress: Optional[bool] = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(GenerationRequest):
    messages: Any  # checked by models.encode_chat, whose messages name the bad entry


class CompletionRequest(GenerationRequest):
    prompt: Any  # a string, a list of one string, or token ids


class TokenizeRequest(_Body):
    content: str
    add_special: Optional[bool] = None
    with_pieces: Optional[bool] = None


class DetokenizeRequest(_Body):
    tokens: list[int]


def _first_error(exc: ValidationError) -> APIError:
    err = exc.errors()[0]
    if err["type"] == "json_invalid":
        return APIError(400, f"malformed JSON body: {err['msg'].removeprefix('Invalid JSON: ')}")
    if err["type"] == "model_type" and not err["loc"]:
        return APIError(400, "the request body must be a JSON object")
    param = str(err["loc"][0])
    if err["type"] == "missing":
        return APIError(400, f"missing required field '{param}'", param=param)
    return APIError(400, f"invalid '{param}': {err['msg']}", param=param)


async def parse_request(request: Request, model: type[ModelT]) -> ModelT:
    """Read the body (refusing more than MAX_BODY_BYTES before buffering it all) and validate it."""
    raw = bytearray()
    async for piece in request.stream():
        raw += piece
        if len(raw) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
    return parse_body(bytes(raw), model)


def parse_body(raw: bytes, model: type[ModelT]) -> ModelT:
    """Validate a JSON body against `model`; any problem is a 400 APIError naming the field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise _first_error(exc) from None


def _max_tokens(req: GenerationRequest, default: int) -> int:
    for value in (req.max_completion_tokens, req.max_tokens):
        if value is not None:
            return value
    # llama-server's n_predict: -1 means "until the context is full", i.e. the default.
    if req.n_predict is not None and req.n_predict != -1:
        return req.n_predict
    return default


def sampling_params(req: GenerationRequest, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling fields over the server's defaults; a bad value is a 400."""
    if req.n not in (None, 1):
        raise APIError(400, f"only n=1 is supported (got {req.n})", param="n")
    if req.logprobs:
        raise APIError(400, "logprobs are not supported", param="logprobs")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    penalty = req.repetition_penalty if req.repetition_penalty is not None else req.repeat_penalty
    given = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "repetition_penalty": penalty, "seed": req.seed,
        "max_tokens": _max_tokens(req, defaults.max_tokens), "stop": stop, "ignore_eos": req.ignore_eos,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    if req.seed == -1:  # llama-server's "random seed"
        overrides["seed"] = None
    try:
        return dataclasses.replace(defaults, **overrides)
    except RequestError as exc:
        raise APIError(400, str(exc), param=exc.param) from None


def completion_prompt_ids(prompt: Any, tokenizer: Any, vocab_size: int) -> tuple[int, ...]:
    """A completions `prompt` (string, [string], token ids or [token ids]) -> token ids."""
    from ..models import encode_text

    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return encode_text(tokenizer, prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        check_token_ids(prompt, vocab_size, "prompt")
        return tuple(prompt)
    if isinstance(prompt, list) and not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, "only one prompt per request is supported", param="prompt")
    raise APIError(400, "prompt must be a string, a list of one string, or a list of token ids", param="prompt")


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise APIError(400, f"{param}[{i}] = {t} is not a token id (the vocabulary has {vocab_size})", param=param)
