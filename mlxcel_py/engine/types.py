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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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
