"""A body's sampling fields over the server's defaults -> `SamplingParams`, for every dialect:
the sampler's (temperature, top_p/top_k/min_p, seed, stop, max_tokens and llama-server's
n_predict, repetition), and those that reach the logits beyond it: `logit_bias`, presence and
frequency penalties, logprobs (chat's `logprobs`/`top_logprobs`, completions' `logprobs: N`,
llama-server's `n_probs`) and completions' `echo`. A bad value is a 400 naming the request field.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ...engine import MAX_TOP_LOGPROBS, ConstraintSpec, SamplingParams
from ...engine.core.chain_params import ChainParams, sampler_order
from .breakers import dry_breakers
from ...errors import FieldError, RequestError
from ...models import encode_text
from .schemas import GenerationRequest

BAN = float("-inf")  # llama-server's `false` bias: never this token
# strtol's reading of an object key, as llama-server: an integer is a token id, anything else is text.
ID_KEY = re.compile(r"\s*[+-]?\d+")
# SamplingParams fields that other request fields carry, for error messages.
PARAM_OF = {"prompt_logprobs": "echo"}


@dataclass(frozen=True, slots=True)
class LogprobsAsk:
    """Whether logprobs were asked, with how many alternatives, and over the prompt too (echo)."""

    num: Optional[int] = None  # None: not asked
    prompt: bool = False


def _bias(value: Any, where: str) -> float:
    if value is False:
        return BAN
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{where}: a bias must be a number or false (got {value!r})", param="logit_bias")
    return float(value)


def _tokens_of(key: Any, tokenizer: Any, where: str) -> Sequence[int]:
    """A key's token ids: an id (int, or a string strtol reads whole), else its text's tokens."""
    if isinstance(key, int) and not isinstance(key, bool):
        return (key,)  # negative ids are refused by SamplingParams
    if not isinstance(key, str):
        raise FieldError(f"{where}: logit_bias keys must be token ids or text (got {key!r})", param="logit_bias")
    if ID_KEY.fullmatch(key):
        return (int(key),)
    if tokenizer is None:
        raise FieldError(f"{where}: logit_bias keys must be token ids such as \"15\" here (got {key!r})",
                         param="logit_bias")
    ids = encode_text(tokenizer, key, add_special_tokens=False)
    if not ids:
        raise FieldError(f"{where}: the logit_bias text {key!r} has no tokens", param="logit_bias")
    return ids


def logit_bias_pairs(value: Any, tokenizer: Any = None) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"id": bias}, llama-server's [[id, bias]], and llama-server's text keys ({" the": -5},
    [[" the", false]]: each of the text's tokens biased; `false` bans). As llama-server, every
    entry's bias is added, so a token given twice gets both."""
    if not value:
        return ()
    items = list(value.items()) if isinstance(value, dict) else value
    total: dict[int, float] = {}
    for i, pair in enumerate(items):
        where = f"logit_bias[{pair[0]!r}]" if isinstance(value, dict) else f"logit_bias[{i}]"  # dict: (key, value)
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise FieldError(f"{where}: must be a [token id or text, bias] pair (got {pair!r})", param="logit_bias")
        key, bias = pair
        amount = _bias(bias, where)
        for token in _tokens_of(key, tokenizer, where):
            total[token] = total.get(token, 0.0) + amount
    return tuple(total.items())


def _check_count(value: int, param: str) -> int:
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise FieldError(f"{param} must be between 0 and {MAX_TOP_LOGPROBS} (got {value})", param=param)
    return value


def logprobs_ask(req: GenerationRequest) -> LogprobsAsk:
    """Chat: logprobs + top_logprobs; completions: logprobs N (+ echo); n_probs N for either."""
    n_probs = _check_count(req.n_probs, "n_probs") if req.n_probs else 0
    logprobs, top = getattr(req, "logprobs", None), getattr(req, "top_logprobs", None)
    if n_probs and (logprobs is not None or top is not None):
        raise FieldError("n_probs asks for the same as logprobs/top_logprobs; send one of them", param="n_probs")
    echo = bool(getattr(req, "echo", None))
    if n_probs:
        return LogprobsAsk(n_probs, echo)
    if isinstance(logprobs, bool) or logprobs is None:  # chat (completions' null too)
        if top is not None and top > 0 and not logprobs:
            raise FieldError("top_logprobs needs logprobs to be true", param="top_logprobs")
        return LogprobsAsk(_check_count(top or 0, "top_logprobs"), False) if logprobs else LogprobsAsk()
    return LogprobsAsk(_check_count(logprobs, "logprobs"), echo)  # completions' integer


def processor_fields(req: GenerationRequest, tokenizer: Any = None) -> dict:
    """SamplingParams overrides for bias, penalties and logprobs (None where the request is silent);
    `tokenizer` reads logit_bias's text keys."""
    ask = logprobs_ask(req)
    return {
        "logit_bias": logit_bias_pairs(req.logit_bias, tokenizer) or None,  # none given: the defaults'
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


def max_tokens_of(req: GenerationRequest, default: int) -> int:
    """max_completion_tokens, max_tokens or llama-server's n_predict (-1: until the context is full)."""
    for value in (getattr(req, "max_completion_tokens", None), req.max_tokens):
        if value is not None:
            return value
    if req.n_predict is not None and req.n_predict != -1:
        return req.n_predict
    return default


def _repetition(req: GenerationRequest, slot_context: int) -> dict:
    """repeat_penalty and llama-server's repeat_last_n (0 = off, -1 = the whole context)."""
    penalty = req.repetition_penalty if req.repetition_penalty is not None else req.repeat_penalty
    last_n = req.repeat_last_n
    if last_n is not None and last_n < -1:
        raise FieldError(f"repeat_last_n must be -1, 0 or positive (got {last_n})", param="repeat_last_n")
    if last_n == 0:
        return {"repetition_penalty": 1.0}
    context = slot_context if last_n == -1 else last_n
    return {"repetition_penalty": penalty, "repetition_context": context}


# llama.cpp's further samplers (engine/core/chain_params.py), under the request fields' own names.
CHAIN_FIELDS = ("typical_p", "min_keep", "xtc_probability", "xtc_threshold", "top_n_sigma", "dynatemp_range",
                "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base",
                "dry_allowed_length", "dry_penalty_last_n")


def chain_params(req: Any, default: ChainParams, tokenizer: Any = None, slot_context: int = 0) -> ChainParams:
    """The request's llama.cpp sampler fields and `samplers` order over the server's, DRY's history length and
    breakers resolved (with `tokenizer`); RequestError naming a field."""
    overrides = {name: value for name in CHAIN_FIELDS if (value := getattr(req, name, None)) is not None}
    samplers, breakers = getattr(req, "samplers", None), getattr(req, "dry_sequence_breakers", None)
    if samplers is not None:
        overrides["order"] = sampler_order(samplers)
    if breakers is not None:
        overrides["dry_sequence_breakers"] = tuple(breakers)
    if overrides.get("dry_base", 1.0) < 1.0:  # llama-server keeps its default for a base below 1
        overrides["dry_base"] = default.dry_base
    chain = dataclasses.replace(default, **overrides) if overrides else default
    if chain.dry_multiplier == 0.0 or chain.dry_penalty_last_n == 0:
        return dataclasses.replace(chain, dry_last_n=0, dry_breakers=()) if chain.dry_last_n else chain
    last_n = slot_context if chain.dry_penalty_last_n == -1 else chain.dry_penalty_last_n
    found = dry_breakers(tokenizer, chain.dry_sequence_breakers) if tokenizer is not None else ()
    return dataclasses.replace(chain, dry_last_n=max(last_n, 0), dry_breakers=found)


def sampling_params(req: GenerationRequest, defaults: SamplingParams, slot_context: int,
                    constraint: Optional[ConstraintSpec] = None, tokenizer: Any = None) -> SamplingParams:
    """The request's sampling fields over the server's defaults; a bad value is a 400. Without
    `tokenizer`, logit_bias takes token ids only."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    max_tokens = max_tokens_of(req, defaults.max_tokens)
    given = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "seed": req.seed, "max_tokens": 1 if echo_only(req, max_tokens) else max_tokens, "stop": stop,
        "ignore_eos": req.ignore_eos, **_repetition(req, slot_context), **processor_fields(req, tokenizer),
        "constraint": constraint,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    if req.seed == -1:  # llama-server's "random seed"
        overrides["seed"] = None
    try:
        overrides["chain"] = chain_params(req, defaults.chain, tokenizer, slot_context)
        return dataclasses.replace(defaults, **overrides)
    except RequestError as exc:  # SamplingParams names its own field; the request's may differ
        raise FieldError(str(exc), param=PARAM_OF.get(exc.param, exc.param)) from None


def fixed_scales(rt: Any, scales: tuple[float, ...], param: str) -> tuple[float, ...]:
    """`scales` when the adapters can run at them: fused ones (--lora-fuse) only at their loaded scales."""
    adapters = rt.loaded.adapters
    if adapters and adapters[0].fused and scales != rt.loaded.adapter_scales:
        raise FieldError(f"{param}: the LoRA adapters are fused into the weights (--lora-fuse): they run at their "
                         f"loaded scales {list(rt.loaded.adapter_scales)} only", param=param)
    return scales


def named_adapter(rt: Any, name: Any, param: str = "adapters") -> tuple[float, ...]:
    """mlx_lm.server's per-request `adapters`: one loaded adapter (its path, file or directory name) at its loaded
    scale, the others at 0; a 400 naming what is loaded otherwise (adapters load at start here)."""
    from pathlib import Path

    adapters = rt.loaded.adapters
    match = next((a for a in adapters if isinstance(name, str) and name in (a.path, Path(a.path).name,
                                                                              Path(a.path).stem)), None)
    if match is None:
        loaded = ", ".join(Path(a.path).name for a in adapters) or "none"
        raise FieldError(f"{param}: {name!r} is not a loaded adapter (loaded with --lora: {loaded}); adapters "
                         "are loaded when the server starts", param=param)
    return fixed_scales(rt, tuple(a.scale if a is match else 0.0 for a in adapters), param)


def model_adapter(rt: Any, model: Any) -> Optional[tuple[float, ...]]:
    """An OpenAI `model` of the form `<served id>:<adapter name>` (as /v1/models lists them): that loaded adapter
    alone; None for any other name (any name reaches the one served model)."""
    from pathlib import Path

    if not isinstance(model, str) or ":" not in model or not rt.loaded.adapters:
        return None
    suffix = model.rsplit(":", 1)[1]
    if not any(suffix in (Path(a.path).name, Path(a.path).stem) for a in rt.loaded.adapters):
        return None
    return named_adapter(rt, suffix, "model")
