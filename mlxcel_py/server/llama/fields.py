"""What /completion does with each of its fields: honoured, refused unless inert (the table
generation/prepared.py's `refuse_unsupported` reads), or ignored.

The table is this route's own (it does not follow openai/fields.py), so a field the OpenAI
routes start honouring stays refused here until /completion renders it too.
"""

from __future__ import annotations

from typing import Any, Callable

from ..generation.prepared import Refused, accepts_only

# The plain path's order (the engine's sampling for a request off llama.cpp's chain), in llama-server's names.
SAMPLERS = ("penalties", "top_p", "min_p", "top_k", "temperature")
HERE = "by this server's /completion"


def _equal(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(type(value) is type(v) and value == v for v in values) or \
        any(isinstance(v, float) and type(value) is int and value == v for v in values)


def _empty(value: Any) -> bool:
    return not value


def _only(field: str, inert: Callable[[Any], bool], accepted: str) -> Refused:
    return Refused(field, accepts_only(inert, accepted, HERE))


NOT_SUPPORTED: tuple[Refused, ...] = (
    _only("n_indent", _equal(0), "0"),
    _only("t_max_predict_ms", _equal(0), "0"),
    _only("timings_per_token", _equal(False), "false"),
)
HONOURED = frozenset({
    "model", "prompt", "n_predict", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
    "stream", "ignore_eos", "repeat_penalty", "repetition_penalty", "repeat_last_n", "cache_prompt",
    "return_progress", "return_tokens", "response_fields", "n_probs", "post_sampling_probs", "n", "n_cmpl",
    # Through the machinery every dialect shares (docs/API_OPENAI.md: structured output, logit_bias and penalties).
    "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "json_schema", "response_format",
    "n_keep", "n_discard",  # with --context-shift (generation/keep.py); refused without it
    # llama.cpp's sampler chain (engine/runner/sampler_chain.py)
    "typical_p", "mirostat", "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent",
    "xtc_probability", "xtc_threshold", "top_n_sigma", "min_keep", "samplers",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",  # dry.py
    "lora", "adapters",  # the request's own adapter scales (prepare.request_lora)
})
# Fields that change nothing here (documented in docs/API_NATIVE.md): the rest of a sampler whose
# switch is refused above, transport hints, and what our design makes moot.
IGNORED = frozenset({
    "id_slot", "n_cache_reuse", "sse_ping_interval", "user", "stream_options",
})
