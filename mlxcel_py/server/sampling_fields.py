"""The request fields that reach the logits beyond the sampler's: `logit_bias`, presence and
frequency penalties, logprobs (chat's `logprobs`/`top_logprobs`, completions' `logprobs: N`,
llama-server's `n_probs`) and completions' `echo`. Each maps to SamplingParams fields;
a bad value is a 400 naming the request field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..engine import MAX_TOP_LOGPROBS
from .errors import APIError
from .schemas import GenerationRequest

BAN = -100.0  # llama-server's `false` bias: never this token (OpenAI's -100 does the same in practice)
# SamplingParams fields that other request fields carry, for error messages.
PARAM_OF = {"prompt_logprobs": "echo"}


@dataclass(frozen=True, slots=True)
class LogprobsAsk:
    """Whether logprobs were asked, with how many alternatives, and over the prompt too (echo)."""

    num: Optional[int] = None  # None: not asked
    prompt: bool = False


def _token_id(key: Any) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key  # negative ids are refused by SamplingParams
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    raise APIError(400, f"logit_bias keys must be token ids such as \"15\" (got {key!r})", param="logit_bias")


def logit_bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"id": bias} or llama-server's [[id, bias]]; a `false` bias bans the token."""
    if not value:
        return ()
    items = value.items() if isinstance(value, dict) else value
    return tuple((_token_id(key), BAN if bias is False else float(bias)) for key, bias in items)


def _check_count(value: int, param: str) -> int:
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{param} must be between 0 and {MAX_TOP_LOGPROBS} (got {value})", param=param)
    return value


def logprobs_ask(req: GenerationRequest) -> LogprobsAsk:
    """Chat: logprobs + top_logprobs; completions: logprobs N (+ echo); n_probs N for either."""
    n_probs = _check_count(req.n_probs, "n_probs") if req.n_probs else 0
    logprobs, top = getattr(req, "logprobs", None), getattr(req, "top_logprobs", None)
    if n_probs and (logprobs is not None or top is not None):
        raise APIError(400, "n_probs asks for the same as logprobs/top_logprobs; send one of them", param="n_probs")
    echo = bool(getattr(req, "echo", None))
    if n_probs:
        return LogprobsAsk(n_probs, echo)
    if isinstance(logprobs, bool) or logprobs is None:  # chat (completions' null too)
        if top is not None and top > 0 and not logprobs:
            raise APIError(400, "top_logprobs needs logprobs to be true", param="top_logprobs")
        return LogprobsAsk(_check_count(top or 0, "top_logprobs"), False) if logprobs else LogprobsAsk()
    return LogprobsAsk(_check_count(logprobs, "logprobs"), echo)  # completions' integer


def processor_fields(req: GenerationRequest) -> dict:
    """SamplingParams overrides for bias, penalties and logprobs (None where the request is silent)."""
    ask = logprobs_ask(req)
    return {
        "logit_bias": logit_bias_pairs(req.logit_bias),
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "logprobs": ask.num is not None,
        "top_logprobs": ask.num or 0,
        "prompt_logprobs": ask.prompt,
    }


def echo_only(req: GenerationRequest, max_tokens: int) -> bool:
    """`echo` with max_tokens 0: only the prompt comes back. The engine generates one token
    (it needs at least one), which the reply leaves out."""
    return bool(getattr(req, "echo", None)) and max_tokens == 0
