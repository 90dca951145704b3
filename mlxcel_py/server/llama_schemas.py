"""llama-server's native request bodies (/completion, /apply-template) and, per field of
/completion, what this server does with it: honoured, refused unless inert, or ignored.

Field list: llama-server's README ("POST /completion", llama.cpp 0c1e570). The table here is
this route's own (it does not follow server/unsupported.py), so a field the OpenAI routes
start honouring stays refused here until /completion renders it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from pydantic import Field

from .errors import APIError
from .schemas import ChatMessage, GenerationRequest, _Body

Piece = Union[int, str]  # a token id or text, in a mixed prompt


class PromptObject(_Body):
    """llama-server's {"prompt_string", "multimodal_data"} prompt (media are refused: no multimodal model)."""

    prompt_string: str
    multimodal_data: Optional[list[str]] = None


NativePrompt = Union[str, PromptObject, list[Piece], list[Union[str, PromptObject, list[Piece]]]]
# Our sampler chain, in the order it runs (engine/sampling.py), in llama-server's names.
SAMPLERS = ("penalties", "top_p", "min_p", "top_k", "temperature")


class NativeCompletionRequest(GenerationRequest):
    """POST /completion: GenerationRequest's fields plus llama-server's own."""

    prompt: NativePrompt
    return_tokens: Optional[bool] = None
    response_fields: Optional[list[str]] = None
    id_slot: Optional[int] = None
    n_keep: Optional[int] = None
    n_indent: Optional[int] = None
    n_cmpl: Optional[int] = None
    n_cache_reuse: Optional[int] = None
    t_max_predict_ms: Optional[int] = None
    samplers: Union[list[str], str, None] = None
    timings_per_token: Optional[bool] = None
    post_sampling_probs: Optional[bool] = None
    lora: Optional[list[dict[str, Any]]] = None
    min_keep: Optional[int] = None
    top_n_sigma: Optional[float] = None
    dynatemp_exponent: Optional[float] = None
    xtc_threshold: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None
    mirostat_tau: Optional[float] = None
    mirostat_eta: Optional[float] = None
    sse_ping_interval: Optional[float] = None
    # llama-server takes [[token, bias], ...] as well as OpenAI's {"token": bias}
    logit_bias: Union[dict[str, Union[float, bool]], list[list[Any]], None] = None  # type: ignore[assignment]


class ApplyTemplateRequest(_Body):
    """POST /apply-template: the chat messages to render (other chat fields are ignored, as there)."""

    messages: list[ChatMessage] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Refused:
    field: str
    inert: Callable[[Any], bool]  # True for the values that change nothing
    accepted: str  # those values, for the error message


def _equal(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(type(value) is type(v) and value == v for v in values) or \
        any(isinstance(v, float) and type(value) is int and value == v for v in values)


def _empty(value: Any) -> bool:
    return not value


def _at_most(limit: float) -> Callable[[Any], bool]:
    return lambda value: value <= limit


NOT_SUPPORTED: tuple[Refused, ...] = (
    Refused("n", _equal(1), "1"),
    Refused("n_cmpl", _equal(1), "1"),
    Refused("n_probs", _equal(0), "0"),  # needs llama-server's completion_probabilities shape
    Refused("typical_p", _equal(1.0), "1"),
    Refused("mirostat", _equal(0), "0"),
    Refused("dynatemp_range", _equal(0.0), "0"),
    Refused("dry_multiplier", _equal(0.0), "0"),
    Refused("xtc_probability", _equal(0.0), "0"),
    Refused("top_n_sigma", _at_most(0), "-1 (off)"),
    Refused("min_keep", _equal(0), "0"),
    Refused("n_indent", _equal(0), "0"),
    Refused("t_max_predict_ms", _equal(0), "0"),
    Refused("timings_per_token", _equal(False), "false"),
    Refused("lora", _empty, "[]"),
    Refused("samplers", lambda v: isinstance(v, list) and tuple(v) == SAMPLERS, f"{list(SAMPLERS)} (our fixed chain)"),
)
HONOURED = frozenset({
    "model", "prompt", "n_predict", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
    "stream", "ignore_eos", "repeat_penalty", "repetition_penalty", "repeat_last_n", "cache_prompt",
    "return_progress", "return_tokens", "response_fields",
    # Through the OpenAI routes' machinery (docs/SERVER.md: structured output, logit_bias and penalties).
    "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "json_schema", "response_format",
})
# Fields that change nothing here (documented in docs/SERVER.md): the rest of a sampler whose
# switch is refused above, transport hints, and what our design makes moot.
IGNORED = frozenset({
    "id_slot", "n_keep", "n_cache_reuse", "post_sampling_probs", "dynatemp_exponent", "xtc_threshold",
    "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat_tau",
    "mirostat_eta", "sse_ping_interval", "user", "stream_options",
})


def refuse_unsupported(body: NativeCompletionRequest) -> None:
    """A 400 naming the first field set to a value /completion cannot honour."""
    for row in NOT_SUPPORTED:
        value = getattr(body, row.field)
        if value is None or row.inert(value):
            continue
        raise APIError(400, f"'{row.field}' is not supported by this server's /completion; it accepts only "
                       f"{row.accepted} here", param=row.field, code="unsupported_parameter")
    if body.n_predict == 0:
        raise APIError(400, "n_predict 0 (evaluate the prompt only) is not supported; use -1 or a positive count",
                       param="n_predict", code="unsupported_parameter")
