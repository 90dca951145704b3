"""What goes into the engine: a tokenized request and its sampling parameters.

Plain records, no MLX; validated on construction, and a bad value is a `RequestError`
that names its field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ...errors import RequestError
from .chain_params import ChainParams

# Absurdly large values are refused rather than silently clamped.
MAX_TOP_K = 1_000_000
MAX_TOKENS_LIMIT = 1_000_000
MAX_LOGIT_BIAS = 1024  # entries in one request's logit_bias
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_CONSTRAINT_CHARS = 1 << 20
# How an embedding request pools the final hidden states (llama-server's --pooling; none: per token;
# rank: a reranker's classifier head over the last position, its outputs the request's vector).
POOLINGS = ("mean", "cls", "last", "none", "rank")
# What a ConstraintSpec's text holds, by kind (engine/runner/constraints.py compiles them).
CONSTRAINT_KINDS = ("json_schema", "json_object", "gbnf", "regex", "tool_call")


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise RequestError(message, param=param)


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
    # A lazy grammar: free text until the output reaches this text, whose tokens are the
    # grammar's first (a tool call's opening marker); "" constrains from the first token.
    trigger: str = ""

    def __post_init__(self) -> None:
        name = "constraint"
        _check(isinstance(self.trigger, str), "the constraint trigger must be a string", name)
        _check(self.kind in CONSTRAINT_KINDS, f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)} "
               f"(got {self.kind!r})", name)
        _check(isinstance(self.text, str), f"the {self.kind} constraint text must be a string", name)
        _check(len(self.text) <= MAX_CONSTRAINT_CHARS,
               f"the {self.kind} constraint is too long ({len(self.text)} characters, at most {MAX_CONSTRAINT_CHARS})",
               name)
        if self.kind == "json_object":
            _check(not self.text, "the json_object constraint takes no text (use json_schema for a schema)", name)
        else:
            _check(bool(self.text.strip()), f"the {self.kind} constraint is empty", name)


@dataclass(frozen=True, slots=True)
class ThinkingSpec:
    """A reasoning reply's thinking as token ids (engine/runner/thinking.py follows it): after
    `budget` thinking tokens the end marker is forced (-1: no limit), and with
    `constrain_answer` the request's constraint waits until the thinking has closed."""

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    open: bool = False  # the prompt already opened the thinking (DeepSeek-R1's template)
    budget: int = -1
    constrain_answer: bool = False

    def __post_init__(self) -> None:
        name = "thinking"
        for ids in (self.start_ids, self.end_ids):
            _check(isinstance(ids, tuple) and bool(ids) and all(isinstance(t, int) and t >= 0 for t in ids),
                   "the thinking markers must be non-empty tuples of token ids", name)
        _check(isinstance(self.budget, int) and not isinstance(self.budget, bool)
               and -1 <= self.budget <= MAX_TOKENS_LIMIT,
               f"the thinking budget must be -1 or between 0 and {MAX_TOKENS_LIMIT} (got {self.budget!r})", name)


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
    # OpenAI semantics: added to the logits before sampling; -100 bans a token in practice, -inf always.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI semantics over generated tokens only: logit -= presence * (count > 0) + frequency * count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False  # also score the prompt's tokens (completions' echo); no cache reuse
    # Logprobs of the distribution the token is drawn from (after top-p/min-p/top-k and temperature).
    post_sampling_probs: bool = False
    constraint: Optional[ConstraintSpec] = None
    thinking: Optional[ThinkingSpec] = None  # budget forcing, and an answer-only constraint
    chain: ChainParams = ChainParams()  # llama.cpp's further samplers and order (chain_params.py)

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
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_number(value), f"{name} must be a finite number (got {value!r})", name)
            _check(-2.0 <= value <= 2.0, f"{name} must be between -2 and 2 (got {value})", name)
        self._check_logit_bias()
        _check(isinstance(self.logprobs, bool), f"logprobs must be true or false (got {self.logprobs!r})", "logprobs")
        _check(isinstance(self.top_logprobs, int) and not isinstance(self.top_logprobs, bool)
               and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               f"top_logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS} (got {self.top_logprobs!r})",
               "top_logprobs")
        _check(self.top_logprobs == 0 or self.logprobs, "top_logprobs needs logprobs to be true", "top_logprobs")
        _check(isinstance(self.prompt_logprobs, bool) and (self.logprobs or not self.prompt_logprobs),
               "prompt_logprobs needs logprobs to be true", "prompt_logprobs")
        _check(isinstance(self.post_sampling_probs, bool) and (self.logprobs or not self.post_sampling_probs),
               "post_sampling_probs needs logprobs to be true", "post_sampling_probs")
        _check(self.constraint is None or isinstance(self.constraint, ConstraintSpec),
               f"constraint must be a ConstraintSpec (got {type(self.constraint).__name__})", "constraint")
        _check(isinstance(self.chain, ChainParams), "chain must be a ChainParams", "chain")
        _check(self.thinking is None or isinstance(self.thinking, ThinkingSpec),
               f"thinking must be a ThinkingSpec (got {type(self.thinking).__name__})", "thinking")
        # A grammar ends the output with EOS; ignoring it would run past a finished grammar.
        _check(self.constraint is None or not self.ignore_eos, "ignore_eos cannot be combined with a constraint",
               "ignore_eos")

    def _check_logit_bias(self) -> None:
        name = "logit_bias"
        _check(isinstance(self.logit_bias, tuple), "logit_bias must be a tuple of (token id, bias) pairs", name)
        _check(len(self.logit_bias) <= MAX_LOGIT_BIAS,
               f"logit_bias has {len(self.logit_bias)} entries (at most {MAX_LOGIT_BIAS})", name)
        seen: set[int] = set()
        for pair in self.logit_bias:
            _check(isinstance(pair, tuple) and len(pair) == 2,
                   f"logit_bias entries must be (token id, bias) pairs (got {pair!r})", name)
            token, bias = pair
            _check(isinstance(token, int) and not isinstance(token, bool) and token >= 0,
                   f"logit_bias token ids must be non-negative integers (got {token!r})", name)
            _check(bias == -math.inf or (_number(bias) and -100.0 <= bias <= 100.0),
                   f"logit_bias values must be numbers between -100 and 100, or -inf (got {bias!r} for token {token})",
                   name)
            _check(token not in seen, f"logit_bias has token {token} twice", name)
            seen.add(token)

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
    # An embedding request: prefill only, then the pooled final hidden state instead of a token.
    pooling: Optional[str] = None
    # An encoder's prompt (every position attends to every other): one prefill piece whatever the chunk.
    whole_prompt: bool = False
    # A prompt's images (models/vision.PromptImages, data only): its input embeddings are built from them.
    images: Any = None
    # What the prompt cache indexes instead of prompt_ids (same length): a prompt with images has each
    # image's tokens stand for that image (their ids say nothing of it); without one it is never cached.
    cache_key: Optional[tuple[int, ...]] = None
    # Prompt ranges [lo, hi) no prefill piece cuts: an image whose positions attend each other both ways.
    unsplit: tuple[tuple[int, int], ...] = ()
    # The LoRA adapters' scales for this request, one per loaded adapter; None: the loaded scales. A request with
    # its own neither adopts nor stores prompt-cache KV (another adapter's KV is another model's).
    lora: Optional[tuple[float, ...]] = None
    # Context shift (--context-shift): prompt tokens kept at the start (-1: the whole prompt), and the
    # tokens discarded after them per shift (0: half of the rest, as llama-server).
    n_keep: int = 0
    n_discard: int = 0
    context_shift: bool = True  # False: this reply ends at its slot's end even under --context-shift (Ollama's shift)

    @property
    def cache_ids(self) -> tuple[int, ...]:
        return self.prompt_ids if self.cache_key is None else self.cache_key

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("the prompt is empty")
        if self.cache_key is not None and len(self.cache_key) != len(self.prompt_ids):
            raise RequestError("cache_key must be as long as the prompt")
        if any(not 0 <= lo < hi <= len(self.prompt_ids) for lo, hi in self.unsplit):
            raise RequestError("unsplit ranges must lie inside the prompt")
        if self.lora is not None and not all(_number(s) for s in self.lora):
            raise RequestError("lora scales must be finite numbers", param="lora")
        for name, low in (("n_keep", -1), ("n_discard", 0)):
            value = getattr(self, name)
            _check(isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_TOKENS_LIMIT,
                   f"{name} must be an integer between {low} and {MAX_TOKENS_LIMIT} (got {value!r})", name)
        _check(self.pooling is None or self.pooling in POOLINGS,
               f"pooling must be one of {', '.join(POOLINGS)} (got {self.pooling!r})", "pooling")


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """Token ids must exist in the model's vocabulary; raises RequestError naming the field."""
    for token, _ in params.logit_bias:
        if token >= vocab_size:
            raise RequestError(f"logit_bias token id {token} is out of range (the vocabulary has {vocab_size} tokens)",
                               param="logit_bias")
