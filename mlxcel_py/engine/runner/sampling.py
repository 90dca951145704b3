"""Per-sequence samplers and logits processors, built on mlx-lm's sampling functions.

A SequenceSampler holds everything one sequence's sampling needs across steps: its RNG key,
its processors, the token history they read, its grammar matcher and its place in a
reasoning reply's thinking (thinking.py: a budget's forced end marker, an answer-only grammar).
`sample_step` samples a batch, reads logprobs, and advances every sampler over its token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .constraints import ConstraintCompiler, ConstraintMatcher, ConstraintViolation
from ..core.events import TokenLogprobs
from .logits import apply_bitmask, generated_processors, repetition_processor, token_logprobs
from .logits import top_alternatives
from .dry import Dry
from .sampler_chain import SamplerChain, settings_for
from .sampling_np import numpy_sampler_ok, sample_row
from .thinking import START, THINK, ThinkingState
from ..core.request import SamplingParams

Sampler = Callable[[mx.array], mx.array]


class SequenceSampler:
    """Samples one row of log-probabilities; seeded requests own their RNG key.

    `history` is what the repetition penalty looks back over (the prompt, then generated
    tokens); `generated` feeds logit_bias and the presence/frequency penalties."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int] = (),
                 matcher: Optional[ConstraintMatcher] = None):
        if params.constraint is not None and matcher is None:
            # Sampling without the matcher would ignore the constraint silently.
            raise ValueError(f"a {params.constraint.kind} constraint needs a matcher (ConstraintCompiler.matcher)")
        self.params = params
        self._key: Optional[mx.array] = mx.random.key(params.seed) if params.seed is not None else None
        # sampling_np's draws on the CPU step's numpy logits: their own stream of the same seed
        self.np_rng = np.random.default_rng(params.seed) if params.seed is not None else None
        # llama.cpp's chain (sampler_chain.py) for a request that sets its further samplers or an order
        self.chain = SamplerChain(settings_for(params), self.np_rng or np.random.default_rng()) \
            if params.chain.active else None
        c = params.chain  # DRY: a processor over the prompt and the reply so far (dry.py)
        self.dry = Dry(c.dry_multiplier, c.dry_base, c.dry_allowed_length, c.dry_last_n, c.dry_breakers,
                       prompt_ids) if c.dry_on else None
        self.greedy = params.greedy and self.chain is None
        self._penalty = repetition_processor(params)
        self._processors = generated_processors(params)
        self.matcher = matcher
        self.history: list[int] = list(prompt_ids) if self._penalty is not None else []
        self.generated: list[int] = []
        self.thinking = ThinkingState(params.thinking) if params.thinking is not None else None
        # The grammar waits for the end of the thinking (an answer-only constraint).
        self._gated = self.thinking is not None and params.thinking.constrain_answer

    @property
    def needs_processing(self) -> bool:
        """Anything beyond an argmax over raw logits (the batch fast path skips these rows)."""
        thinking = self.thinking is not None and not self.thinking.answering  # past it, nothing is forced
        return bool(self._penalty or self._processors or self.matcher or self.params.logprobs or thinking
                    or self.chain is not None or self.dry is not None)

    @property
    def forced(self) -> Optional[int]:
        """The token that must come next (a thinking marker), or None."""
        return self.thinking.forced if self.thinking is not None else None

    @property
    def grammar_on(self) -> bool:
        """Whether the grammar's mask applies to the next token."""
        if self.matcher is None or not self.matcher.active:
            return False
        return not self._gated or self.thinking.phase != THINK

    @property
    def may_open_thinking(self) -> Optional[int]:
        """Under an answer-only grammar, before anything: the token that opens the thinking instead."""
        return self.params.thinking.start_ids[0] if self._gated and self.thinking.phase == START else None

    def process(self, logits: mx.array) -> mx.array:
        """Apply the logits processors to a (1, V) row (the grammar mask is applied per batch)."""
        logits = logits[:]  # mlx-lm's processors assign in place; keep the caller's array as it was
        if self._penalty is not None and self.history:
            logits = self._penalty(mx.array(self.history[-self.params.repetition_context :]), logits)
        if self._processors:
            tokens = mx.array(self.generated, dtype=mx.int32)
            for processor in self._processors:
                logits = processor(tokens, logits)
        if self.dry is not None and (penalties := self.dry.penalties()):
            ids = mx.array(list(penalties), dtype=mx.int32)
            logits = logits.at[:, ids].add(-mx.array(list(penalties.values()), dtype=logits.dtype))
        return logits

    def sample(self, logprobs: mx.array) -> mx.array:
        """Sample a (1, V) row of log-probabilities; returns a (1,) token array."""
        if self.greedy:
            return mx.argmax(logprobs, axis=-1)
        if self.chain is not None:
            return mx.array([self.chain.sample(_row(logprobs))], dtype=mx.uint32)
        return mx.random.categorical(self._target(logprobs), key=self._subkey())

    def sample_with_distribution(self, logprobs: mx.array) -> tuple[mx.array, mx.array]:
        """The token and the log-probabilities it was drawn from, after the filters and temperature
        (llama-server's post-sampling probs): at temperature 0, all the mass on the argmax."""
        if self.greedy:
            token = mx.argmax(logprobs, axis=-1)
            hit = mx.arange(logprobs.shape[-1])[None, :] == token[:, None]
            return token, mx.where(hit, mx.array(0.0, logprobs.dtype), mx.array(-mx.inf, logprobs.dtype))
        if self.chain is not None:
            token, dist = self.chain.sample_with_distribution(_row(logprobs))
            return mx.array([token], dtype=mx.uint32), mx.array(dist)[None]
        scaled = self._target(logprobs)
        token = mx.random.categorical(scaled, key=self._subkey())
        return token, scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)

    def choose(self, row: mx.array, draft: Optional[int]) -> tuple[int, bool]:
        """The token at one verified position of processed (1, V) logits, and whether it is `draft`.

        Sampled rows use speculative sampling for a point-mass draft: keep d with probability
        p(d), else draw from p without d (renormalized), so the token follows p exactly."""
        if self.greedy:
            token = int(mx.argmax(row, axis=-1).item())
            return token, token == draft
        if self.chain is not None:
            return self.chain.choose(_row(row), draft)
        target = self._target(row - mx.logsumexp(row, axis=-1, keepdims=True))
        if draft is None:
            return int(mx.random.categorical(target, key=self._subkey()).item()), False
        p_draft = mx.softmax(target, axis=-1)[0, draft].item()
        if mx.random.uniform(key=self._subkey()).item() < p_draft:
            return draft, True
        without = mx.where(mx.arange(target.shape[-1]) == draft, -mx.inf, target)
        return int(mx.random.categorical(without, key=self._subkey()).item()), False

    def _target(self, logprobs: mx.array) -> mx.array:
        """The filtered, temperature-scaled logits the categorical draw uses."""
        p = self.params
        if 0.0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        if 0 < p.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, p.top_k)
        return logprobs * (1.0 / p.temperature)

    def _subkey(self) -> Optional[mx.array]:
        """The next key of a seeded request's stream; None: MLX's global generator."""
        if self._key is None:
            return None
        self._key, sub = mx.random.split(self._key)
        return sub

    def extend_prompt(self, tokens: Sequence[int]) -> None:
        """A prefill piece's prompt tokens, for the repetition penalty (which reads the prompt too)."""
        if self._penalty is not None:
            self.history.extend(tokens)
        if self.dry is not None:
            self.dry.extend(tokens)

    def accept(self, token: int) -> None:
        """Record a sampled token: the processors' history, the thinking and the grammar state."""
        if self._penalty is not None:
            self.history.append(token)
        if self._processors:
            self.generated.append(token)
        if self.dry is not None:
            self.dry.accept(token)
        answer = True
        if self.thinking is not None:
            # At the start, a token the answer's grammar takes is answer even if it could open the thinking.
            taken = self._gated and self.thinking.opens(token) and self.grammar_on and self.matcher.allows(token)
            answer = self.thinking.accept(token, answer_allowed=taken)
        if self.matcher is not None and (answer or not self._gated):
            self.matcher.accept(token)


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprobs: Optional[TokenLogprobs] = None
    error: Optional[str] = None  # the grammar could not take the token: this sequence fails


def _row(logits: mx.array) -> np.ndarray:
    """A (1, V) row as float32 numpy, for the chain."""
    return np.asarray(logits[0].astype(mx.float32))


def _set_bit(row: np.ndarray, token: int) -> None:
    row.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))


def mask_constrained(logits: mx.array, samplers: Sequence[SequenceSampler],
                     compiler: Optional[ConstraintCompiler]) -> mx.array:
    """Apply every constrained row's mask to the (B, V) logits in one op: its grammar's, or
    the one token a thinking marker forces."""
    grammar = [(s.matcher, i) for i, s in enumerate(samplers) if s.forced is None and s.grammar_on]
    forced = [(i, s.forced) for i, s in enumerate(samplers) if s.forced is not None]
    if not grammar and not forced:
        return logits
    bitmask = np.full((len(samplers), (logits.shape[-1] + 31) // 32), -1, dtype=np.int32)  # others allow all
    if compiler is not None and grammar:
        compiler.fill_bitmasks(grammar, bitmask)
    else:
        for matcher, i in grammar:
            matcher.fill(bitmask[i])
    for _, i in grammar:
        opener = samplers[i].may_open_thinking
        if opener is not None:
            _set_bit(bitmask[i], opener)
    for i, token in forced:
        bitmask[i] = 0
        _set_bit(bitmask[i], token)
    return apply_bitmask(logits, bitmask)


def _rows(logits: mx.array, samplers: Sequence[SequenceSampler], compiler) -> tuple[list, list]:
    logits = mask_constrained(logits, samplers, compiler)
    tokens, normalized = [], []
    for i, sampler in enumerate(samplers):
        row = sampler.process(logits[i : i + 1])
        if not sampler.greedy or sampler.params.logprobs:
            # An argmax needs no log-softmax, which costs ~0.7 ms a row on the CPU (49k vocab).
            row = row - mx.logsumexp(row, axis=-1, keepdims=True)
        if sampler.forced is not None:  # a thinking marker: taken even where a logit_bias of -inf hit it
            token = mx.array([sampler.forced], dtype=mx.uint32)
        elif sampler.params.post_sampling_probs:  # logprobs read from the distribution drawn from
            token, row = sampler.sample_with_distribution(row)
        else:
            token = sampler.sample(row)
        tokens.append(token)
        normalized.append(row)
    return tokens, normalized


def sample_step(logits: mx.array | np.ndarray, samplers: list[SequenceSampler],
                compiler: Optional[ConstraintCompiler] = None) -> list[SampledToken]:
    """Sample a (B, V) batch (an mx.array, or the CPU decode step's numpy logits), read logprobs where
    asked, and advance every sampler over its token. On the CPU device the rows sampling_np takes are
    sampled there whatever array they came in, so a row's path never depends on its batchmates."""
    if mx.default_device() == mx.cpu:
        rows = logits if isinstance(logits, np.ndarray) else np.asarray(logits.astype(mx.float32))
        return _sample_numpy(rows, samplers, compiler)
    return _sample_mlx(mx.array(logits) if isinstance(logits, np.ndarray) else logits, samplers, compiler)


def _sample_mlx(logits: mx.array, samplers: list[SequenceSampler],
                compiler: Optional[ConstraintCompiler]) -> list[SampledToken]:
    if all(s.greedy and not s.needs_processing for s in samplers):
        ids = mx.argmax(logits, axis=-1).tolist()
        return [SampledToken(t) for t in ids]
    tokens, normalized = _rows(logits, samplers, compiler)
    batch = mx.concatenate(tokens, axis=0)
    wanted = {i: top_alternatives(normalized[i], s.params.top_logprobs)
              for i, s in enumerate(samplers) if s.params.top_logprobs > 0}
    chosen = {i: mx.take_along_axis(normalized[i], tokens[i][:, None], axis=-1)
              for i, s in enumerate(samplers) if s.params.logprobs}
    mx.eval(batch, wanted, chosen)
    out = []
    for i, (token, sampler) in enumerate(zip(batch.tolist(), samplers)):
        record = None
        if i in chosen:
            ids, values = wanted.get(i, (None, None))
            record = token_logprobs(token, chosen[i].item(), None if ids is None else ids[0].tolist(),
                                    None if values is None else values[0].tolist())
        out.append(SampledToken(token, record, _accept(sampler, token)))
    return out


def _sample_numpy(logits: np.ndarray, samplers: list[SequenceSampler],
                  compiler: Optional[ConstraintCompiler]) -> list[SampledToken]:
    """(B, V) numpy logits: the rows sampling_np takes are sampled there, the others through MLX as one batch."""
    here = [numpy_sampler_ok(s) for s in samplers]
    rest = [i for i, ok in enumerate(here) if not ok]
    out: list[Optional[SampledToken]] = [None] * len(samplers)
    if rest:
        for i, record in zip(rest, _sample_mlx(mx.array(logits[rest]), [samplers[i] for i in rest], compiler)):
            out[i] = record
    for i, sampler in enumerate(samplers):
        if here[i]:
            token = sample_row(logits[i], sampler)
            out[i] = SampledToken(token, None, _accept(sampler, token))
    return out


def _accept(sampler: SequenceSampler, token: int) -> Optional[str]:
    """Advance a sampler; the error when its grammar fails (e.g. a pathological grammar hits one
    of llguidance's limits mid-generation): that request fails, not the batch."""
    try:
        sampler.accept(token)
    except ConstraintViolation as exc:
        return f"the grammar failed during generation: {exc}"
    return None


__all__ = ["SampledToken", "SequenceSampler", "mask_constrained", "sample_step"]
