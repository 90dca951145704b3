"""What comes out of the engine: one request's events, ending with `Finished`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """One prefill piece done; the shape of llama-server's `prompt_progress`."""

    request_id: str
    total: int
    cache: int
    processed: int
    time_ms: float
    chunk: int  # the prefill chunk in force when this piece was planned
    # The piece's prompt tokens' logprobs, when asked (echo); None for the prompt's first token.
    logprobs: tuple[Optional[TokenLogprobs], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's log-probability and the top alternatives (token id, logprob), best first.

    Computed from the processed logits (after repetition/presence/frequency penalties,
    logit_bias and the grammar mask, before temperature and top-k/top-p/min-p); with
    `post_sampling_probs`, from the distribution the token was drawn from, after those."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """One generated token and the text it released (may be empty while a stop string could still match)."""

    request_id: str
    token_id: int
    text: str
    logprobs: Optional[TokenLogprobs] = None  # when the request asked for them


@dataclass(frozen=True, slots=True)
class Embedding:
    """An embedding request's result, just before its `Finished`: the pooled final hidden state,
    float32, not normalised; shape (hidden,), or (prompt tokens, hidden) with pooling "none"."""

    request_id: str
    vector: Any  # a numpy float32 array, converted once on the engine thread


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
    draft_n: int = 0  # prompt-lookup draft tokens verified (llama-server's timings.draft_n)
    draft_n_accepted: int = 0
    context_shifts: int = 0  # --context-shift: times its KV was shifted (llama-server reports `truncated`)
    discarded_tokens: int = 0  # ... and the tokens those shifts dropped


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every request."""

    request_id: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    text: str = ""  # the tail released at the end (held-back text that never became a stop)
    error: Optional[str] = None
    stop_word: Optional[str] = None  # the stop string that ended it (finish_reason "stop" without EOS)
    slot: Optional[int] = None  # the slot that ran it (None if it never got one)


Event = Union[PromptProgress, TokenDelta, Embedding, Finished]


def empty_finish(request_id: str, reason: FinishReason, message: Optional[str] = None) -> Finished:
    """A `Finished` for a request that never produced anything (aborted, failed, refused)."""
    return Finished(request_id, reason, Usage(0, 0, 0), Timings(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), error=message)
