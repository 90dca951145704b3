"""Plain records shared by the engine, its worker bridge and the front ends.

Nothing here imports MLX: requests go in, events come out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

FinishReason = Literal["stop", "length", "abort", "error"]

# Absurdly large values are refused rather than silently clamped.
MAX_TOP_K = 1_000_000
MAX_TOKENS_LIMIT = 1_000_000
MAX_LOGIT_BIAS = 1024  # entries in one request's logit_bias
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_CONSTRAINT_CHARS = 1 << 20
# What a ConstraintSpec's text holds, by kind (engine/constraints.py compiles them).
CONSTRAINT_KINDS = ("json_schema", "json_object", "gbnf", "regex", "tool_call")


class EngineError(ValueError):
    """A request the engine cannot take; the message is for the user."""

    code = "invalid_request_error"


class PromptTooLongError(EngineError):
    """The prompt (plus room for one generated token) does not fit a slot's context."""

    code = "context_length_exceeded"


class QueueFullError(EngineError):
    """The waiting queue is full; the client should retry later."""

    code = "server_busy"


class EngineStoppedError(EngineError):
    """The engine is shutting down or has stopped."""

    code = "server_shutting_down"


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """Constrained decoding as plain data: a grammar kind and its text, compiled in the runner.

    json_schema: a JSON schema (text); json_object: any JSON object (text ""); gbnf: a
    llama.cpp GBNF grammar; regex: a regular expression; tool_call: JSON text built by
    `mlxcel_py.tool_calls` ({"start", "end", "schema", "parallel"})."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        _check(self.kind in CONSTRAINT_KINDS, f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)} "
               f"(got {self.kind!r})")
        _check(isinstance(self.text, str), f"the {self.kind} constraint text must be a string")
        _check(len(self.text) <= MAX_CONSTRAINT_CHARS,
               f"the {self.kind} constraint is too long ({len(self.text)} characters, at most {MAX_CONSTRAINT_CHARS})")
        if self.kind == "json_object":
            _check(not self.text, "the json_object constraint takes no text (use json_schema for a schema)")
        else:
            _check(bool(self.text.strip()), f"the {self.kind} constraint is empty")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. Validated on construction; errors name the field."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int = 64
    seed: Optional[int] = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # OpenAI semantics: added to the logits before sampling; -100 bans a token.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI semantics over generated tokens only: logit -= presence * (count > 0) + frequency * count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: Optional[ConstraintSpec] = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            _check(
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"{name} must be a finite number (got {value!r})",
            )
        _check(0.0 <= self.temperature <= 100.0, f"temperature must be between 0 and 100 (got {self.temperature})")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1] (got {self.top_p})")
        _check(0.0 <= self.min_p <= 1.0, f"min_p must be between 0 and 1 (got {self.min_p})")
        _check(
            0.0 < self.repetition_penalty <= 10.0,
            f"repetition_penalty must be in (0, 10] (got {self.repetition_penalty})",
        )
        for name, low, high in (
            ("top_k", 0, MAX_TOP_K),
            ("max_tokens", 1, MAX_TOKENS_LIMIT),
            ("repetition_context", 1, 1 << 20),
        ):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer (got {value!r})")
            _check(low <= value <= high, f"{name} must be between {low} and {high} (got {value})")
        if self.seed is not None:
            _check(
                isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**63,
                f"seed must be a non-negative integer (got {self.seed!r})",
            )
        _check(len(self.stop) <= 16, f"at most 16 stop strings are allowed (got {len(self.stop)})")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_number(value), f"{name} must be a finite number (got {value!r})")
            _check(-2.0 <= value <= 2.0, f"{name} must be between -2 and 2 (got {value})")
        _check(isinstance(self.logit_bias, tuple), "logit_bias must be a tuple of (token id, bias) pairs")
        _check(len(self.logit_bias) <= MAX_LOGIT_BIAS,
               f"logit_bias has {len(self.logit_bias)} entries (at most {MAX_LOGIT_BIAS})")
        seen: set[int] = set()
        for pair in self.logit_bias:
            _check(isinstance(pair, tuple) and len(pair) == 2,
                   f"logit_bias entries must be (token id, bias) pairs (got {pair!r})")
            token, bias = pair
            _check(isinstance(token, int) and not isinstance(token, bool) and token >= 0,
                   f"logit_bias token ids must be non-negative integers (got {token!r})")
            _check(_number(bias) and -100.0 <= bias <= 100.0,
                   f"logit_bias values must be numbers between -100 and 100 (got {bias!r} for token {token})")
            _check(token not in seen, f"logit_bias has token {token} twice")
            seen.add(token)
        _check(isinstance(self.logprobs, bool), f"logprobs must be true or false (got {self.logprobs!r})")
        _check(isinstance(self.top_logprobs, int) and not isinstance(self.top_logprobs, bool)
               and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               f"top_logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS} (got {self.top_logprobs!r})")
        _check(self.top_logprobs == 0 or self.logprobs, "top_logprobs needs logprobs to be true")
        _check(self.constraint is None or isinstance(self.constraint, ConstraintSpec),
               f"constraint must be a ConstraintSpec (got {type(self.constraint).__name__})")
        # A grammar ends the output with EOS; ignoring it would run past a finished grammar.
        _check(self.constraint is None or not self.ignore_eos, "ignore_eos cannot be combined with a constraint")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's log-probability and the top alternatives (token id, logprob), best first.

    Computed from the processed logits (after repetition/presence/frequency penalties,
    logit_bias and the grammar mask, before temperature and top-k/top-p/min-p)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request, already tokenized.

    `history_boundary` is the token length of the chat prompt rendered without its
    generation prompt: the prompt cache snapshots there so the next turn adopts it.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    history_boundary: Optional[int] = None
    cache_prompt: bool = True

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise EngineError("the prompt is empty")


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """One prefill piece done; the shape of llama-server's `prompt_progress`."""

    request_id: str
    total: int
    cache: int
    processed: int
    time_ms: float
    chunk: int  # the prefill chunk in force when this piece was planned


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """One generated token and the text it released (may be empty while a stop string could still match)."""

    request_id: str
    token_id: int
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    queue_ms: float
    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    prompt_tps: float
    decode_tps: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every request."""

    request_id: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    text: str = ""  # the tail released at the end (held-back text that never became a stop)
    error: Optional[str] = None


Event = Union[PromptProgress, TokenDelta, Finished]
