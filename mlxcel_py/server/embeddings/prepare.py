"""An embedding body -> engine requests: each input tokenized (or its token ids checked) and
fitted to a slot, one prefill-only engine request per input. Blocking: runs off the event loop."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ...engine import Request as EngineRequest
from ...engine import SamplingParams
from ...errors import FieldError
from ...models import encode_text
from ..generation.prompt import check_token_ids
from ..generation.submit import no_generation

if TYPE_CHECKING:
    from ..runtime import Runtime

MAX_INPUTS = 2048  # OpenAI's limit per request
DEFAULT_POOLING = "last"  # a decoder model without a GGUF pooling_type (llama-server would say "none")


@dataclass(frozen=True, slots=True)
class EmbedPlan:
    """The engine requests of one embedding body, one per input, in order."""

    jobs: tuple[EngineRequest, ...]
    pooling: str

    @property
    def prompt_tokens(self) -> int:
        return sum(len(job.prompt_ids) for job in self.jobs)


def pooling_of(rt: "Runtime") -> str:
    """--pooling, else the model's (a GGUF's `{arch}.pooling_type`), else last-token pooling; a
    reranker has no embeddings (a 501)."""
    if rt.loaded.rank_head is not None:
        raise no_generation(rt, "embeddings")
    chosen = rt.config.server.pooling if rt.config.server is not None else None
    return chosen or getattr(rt.loaded, "pooling", None) or DEFAULT_POOLING


def _items(value: Any) -> list:
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(v, int) for v in value):  # one prompt's token ids
        return [value]
    return list(value)


def input_ids(value: Any, rt: "Runtime", param: str, truncate: bool = False) -> list[tuple[int, ...]]:
    """Each input's token ids; a 400 naming `param` for an empty one or one longer than a slot
    (with `truncate`, Ollama's default, its first tokens that fit instead)."""
    items = _items(value)
    if not items:
        raise FieldError(f"{param} must not be empty", param=param)
    if len(items) > MAX_INPUTS:
        raise FieldError(f"{param} has {len(items)} inputs; at most {MAX_INPUTS} per request", param=param)
    fits = rt.prompt_limit.slot_context - 1  # what the engine admits
    out = []
    for i, item in enumerate(items):
        label = param if len(items) == 1 else f"{param}[{i}]"
        if isinstance(item, str):
            if not item:
                raise FieldError(f"{label} must not be empty", param=param)
            if not truncate:
                rt.prompt_limit.check_chars(len(item), param)
            ids = encode_text(rt.loaded.tokenizer, item)
        else:
            if not item:
                raise FieldError(f"{label} must not be empty", param=param)
            check_token_ids(item, rt.vocab_size, param)
            ids = tuple(item)
        if len(ids) > fits and truncate:
            ids = ids[:fits]
        elif len(ids) > fits:
            raise FieldError(f"{label} has {len(ids)} tokens, but a slot's context holds {fits} for an embedding; "
                             "shorten it or raise --ctx-size", param=param)
        out.append(ids)
    return out


def plan(rt: "Runtime", ids: list[tuple[int, ...]], pooling: Optional[str] = None) -> EmbedPlan:
    """One prefill-only engine request per input (no prompt cache: every position is pooled)."""
    pooling = pooling or pooling_of(rt)
    base = f"embd-{uuid.uuid4().hex[:24]}"
    jobs = tuple(EngineRequest(f"{base}-{i}", prompt, SamplingParams(max_tokens=1), cache_prompt=False,
                               pooling=pooling, whole_prompt=not rt.loaded.causal) for i, prompt in enumerate(ids))
    return EmbedPlan(jobs, pooling)
