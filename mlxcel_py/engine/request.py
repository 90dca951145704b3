"""What goes into the engine: a tokenized request and its sampling parameters.

Plain records, no MLX; validated on construction, and a bad value is a `RequestError`
that names its field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ..errors import RequestError

# Absurdly large values are refused rather than silently clamped.
MAX_TOP_K = 1_000_000
MAX_TOKENS_LIMIT = 1_000_000


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise RequestError(message, param=param)


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
                f"{name} must be a finite number (got {value!r})", name,
            )
        _check(0.0 <= self.temperature <= 100.0, f"temperature must be between 0 and 100 (got {self.temperature})",
               "temperature")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1] (got {self.top_p})", "top_p")
        _check(0.0 <= self.min_p <= 1.0, f"min_p must be between 0 and 1 (got {self.min_p})", "min_p")
        _check(
            0.0 < self.repetition_penalty <= 10.0,
            f"repetition_penalty must be in (0, 10] (got {self.repetition_penalty})", "repetition_penalty",
        )
        for name, low, high in (
            ("top_k", 0, MAX_TOP_K),
            ("max_tokens", 1, MAX_TOKENS_LIMIT),
            ("repetition_context", 1, 1 << 20),
        ):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer (got {value!r})", name)
            _check(low <= value <= high, f"{name} must be between {low} and {high} (got {value})", name)
        if self.seed is not None:
            _check(
                isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**63,
                f"seed must be a non-negative integer (got {self.seed!r})", "seed",
            )
        _check(len(self.stop) <= 16, f"at most 16 stop strings are allowed (got {len(self.stop)})", "stop")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings", "stop")

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
            raise RequestError("the prompt is empty")
