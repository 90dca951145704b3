"""llama-server's native response shapes: /completion's reply and stream frames, and the
generation settings /completion and /props report (llama.cpp 0c1e570, server-task.cpp).

Pure functions of a `NativeReply` and engine events. The settings report the request's samplers as
llama-server does, and for a request off llama.cpp's chain the plain path's order (fields.SAMPLERS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ...engine import MAX_TOKENS_LIMIT, Finished, PromptProgress, SamplingParams, TokenDelta
from ...engine.core.chain_params import DEFAULT_ORDER as SERVER_ORDER
from ..generation.stream import sse
from ..generation.submit import failure
from ..generation.usage import timings_json
from ..http.errors import APIError
from .fields import SAMPLERS
from .probs import ProbsMaker

RANDOM_SEED = 4294967295  # llama-server's LLAMA_DEFAULT_SEED: "a random seed"


def generation_settings(p: SamplingParams, stream: bool = False, n_keep: int = 0, n_discard: int = 0,
                        adapters: tuple = ()) -> dict:
    """llama-server's `generation_settings` for these sampling parameters (and context-shift fields);
    `adapters`: (LoRA adapter, the scale the request runs it at) pairs."""
    n_predict = -1 if p.max_tokens >= MAX_TOKENS_LIMIT else p.max_tokens
    c = p.chain
    return {
        "seed": RANDOM_SEED if p.seed is None else p.seed, "temperature": p.temperature,
        "dynatemp_range": c.dynatemp_range, "dynatemp_exponent": c.dynatemp_exponent, "top_k": p.top_k,
        "top_p": p.top_p, "min_p": p.min_p, "top_n_sigma": c.top_n_sigma, "xtc_probability": c.xtc_probability,
        "xtc_threshold": c.xtc_threshold, "typical_p": c.typical_p,
        "repeat_last_n": p.repetition_context,
        "repeat_penalty": p.repetition_penalty, "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty, "dry_multiplier": c.dry_multiplier, "dry_base": c.dry_base,
        "dry_allowed_length": c.dry_allowed_length, "dry_penalty_last_n": c.dry_last_n or c.dry_penalty_last_n,
        "dry_sequence_breakers": list(c.dry_sequence_breakers),
        "mirostat": c.mirostat, "mirostat_tau": c.mirostat_tau, "mirostat_eta": c.mirostat_eta, "stop": list(p.stop),
        "max_tokens": n_predict, "n_predict": n_predict, "n_keep": n_keep, "n_discard": n_discard,
        "ignore_eos": p.ignore_eos, "stream": stream, "logit_bias": logit_bias_json(p),
        "n_probs": p.top_logprobs if p.logprobs else 0, "min_keep": c.min_keep,
        "grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
        "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
        "generation_prompt": "", "samplers": list(c.order or SERVER_ORDER) if c.active else list(SAMPLERS),
        "speculative.types": "none",
        "timings_per_token": False, "post_sampling_probs": p.post_sampling_probs, "backend_sampling": False,
        "lora": [{"id": a.id, "scale": scale} for a, scale in adapters],
        "adaptive_target": -1.0, "adaptive_decay": 0.9,
    }


def logit_bias_json(p: SamplingParams) -> list[dict]:
    """llama-server's [{"bias", "token"}]; a ban (-inf) is null, as nlohmann::json writes it."""
    return [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in p.logit_bias]


# What /props leaves out of its default settings (llama-server's "only_metrics" form).
NOT_IN_PROPS = ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                "preserved_tokens")


def default_settings(p: SamplingParams, adapters: tuple = ()) -> dict:
    """/props' `default_generation_settings.params`."""
    settings = generation_settings(p, adapters=adapters)
    return {k: v for k, v in settings.items() if k not in NOT_IN_PROPS}


@dataclass(frozen=True, slots=True)
class NativeReply:
    """What a /completion reply is labelled with."""

    model: str
    prompt: str  # the prompt as text
    prompt_tokens: int
    slot_context: int
    settings: dict
    return_tokens: bool = False
    return_progress: bool = False
    response_fields: Optional[tuple[str, ...]] = None
    probs: Optional[ProbsMaker] = None  # n_probs > 0: completion_probabilities
    stop_tokens: tuple[tuple[str, int], ...] = ()  # each stop string's token count (with n_probs)
    index: int = 0  # its place among a request's prompts x n_cmpl


def stop_type(f: Finished) -> str:
    if f.finish_reason == "length":
        return "limit"
    return "word" if f.stop_word is not None else "eos"


def final_json(reply: NativeReply, text: str, token_ids: tuple[int, ...], f: Finished,
               probabilities: Optional[list[dict]] = None) -> dict:
    """The whole reply (with `stream` the last frame, its content already sent, and no probabilities)."""
    u = f.usage
    eos = f.finish_reason == "stop" and f.stop_word is None  # the EOS token is not generated text
    body = {
        "index": reply.index, "content": text, "tokens": list(token_ids) if reply.return_tokens else [],
        "id_slot": -1 if f.slot is None else f.slot, "stop": True, "model": reply.model,
        "tokens_predicted": u.completion_tokens, "tokens_evaluated": u.prompt_tokens,
        "generation_settings": reply.settings, "prompt": reply.prompt, "has_new_line": "\n" in text,
        # As llama-server: the reply filled its slot, or a context shift dropped part of it.
        "truncated": (f.finish_reason == "length" and u.total_tokens >= reply.slot_context) or f.timings.context_shifts > 0,
        "stop_type": stop_type(f), "stopping_word": f.stop_word or "",
        "tokens_cached": u.total_tokens - (0 if eos else 1) - f.timings.discarded_tokens, "timings": timings_json(f),
    }
    if probabilities:
        body["completion_probabilities"] = probabilities
    return pick_fields(body, reply.response_fields) if reply.response_fields else body


def pick_fields(body: dict, paths: tuple[str, ...]) -> dict:
    """llama-server's `response_fields`: each "a/b" path's value under the key "a/b"; missing paths dropped."""
    out = {}
    for path in paths:
        node: Any = body
        for key in path.split("/"):
            if not (isinstance(node, dict) and key in node):
                break
            node = node[key]
        else:
            out[path] = node
    return out


@dataclass
class NativeFramer:
    """The frames of a /completion stream: {"content", "tokens", "stop": false, ...} per piece of
    text, then the whole reply with `stop: true` (no [DONE], as llama-server)."""

    reply: NativeReply
    predicted: int = 0
    held: list[int] = field(default_factory=list)  # token ids whose text is held back (a stop may follow)
    held_probs: list[Any] = field(default_factory=list)  # their TokenLogprobs, with n_probs
    ids: list[int] = field(default_factory=list)

    def opening(self) -> list[str]:
        return []

    def _partial(self, content: str, tokens: list[int], **extra: Any) -> str:
        return sse({"index": self.reply.index, "content": content, "tokens": tokens, "stop": False, "id_slot": -1,
                     "tokens_predicted": self.predicted, "tokens_evaluated": self.reply.prompt_tokens, **extra})

    def frames(self, event: Any) -> list[str]:
        if isinstance(event, PromptProgress):
            if not self.reply.return_progress:
                return []
            progress = {"total": event.total, "cache": event.cache, "processed": event.processed,
                        "time_ms": event.time_ms}
            return [self._partial("", [], prompt_progress=progress)]
        if isinstance(event, TokenDelta):
            self.predicted += 1
            self.held.append(event.token_id)
            self.held_probs.append(event.logprobs)
            self.ids.append(event.token_id)
            return self._release(event.text)
        frames = self._release(event.text, end=self.reply.probs is not None)
        if event.finish_reason not in ("stop", "length"):
            return frames + self.cut(failure(event))
        return frames + [sse(final_json(self.reply, "", tuple(self.ids), event))]

    def _release(self, text: str, end: bool = False) -> list[str]:
        """A frame with the text and the held tokens; at the `end` also with none (a stop string's
        tokens: llama-server streams every token's probabilities)."""
        if not text and not (end and self.held):
            return []
        tokens, self.held = self.held, []
        records, self.held_probs = self.held_probs, []
        extra = {"completion_probabilities": self.reply.probs.entries(records)} if self.reply.probs else {}
        return [self._partial(text, tokens, **extra)]

    def cut(self, error: APIError) -> list[str]:
        return [sse(error.body())]

    def bug(self) -> list[str]:
        return [sse(APIError(500, "internal server error (see the server log)").body())]

    def closing(self) -> list[str]:
        return []


class NativeGroupFramer:
    """The frames of several prompts' (or n_cmpl's) streams in one: each member's frames, with its
    `index`, as its tokens come; one error frame if the server cuts them (a `Framer` of Indexed events)."""

    def __init__(self, replies: tuple[NativeReply, ...]):
        self.framers = [NativeFramer(reply) for reply in replies]

    def opening(self) -> list[str]:
        return []

    def frames(self, item: Any) -> list[str]:
        return self.framers[item.index].frames(item.event)

    def cut(self, error: APIError) -> list[str]:
        return [sse(error.body())]

    def bug(self) -> list[str]:
        return self.framers[0].bug()

    def closing(self) -> list[str]:
        return []
