"""A reply's thinking as the engine follows it, for every dialect: --reasoning-budget (or a
request's budget) and an answer-only constraint become the `ThinkingSpec` on its sampling,
with the model's thinking markers as token ids. The forcing itself is the runner's
(engine/runner/thinking.py); nothing here changes the reply's text."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from ...engine import SamplingParams, ThinkingSpec
from ...errors import FieldError
from ...models import encode_text
from .reasoning import reply_reasoning

if TYPE_CHECKING:
    from ..runtime import Runtime

# Constraints that shape the answer, after the thinking. A gbnf or regex grammar is the whole
# output as written (llama-server's `grammar` applies from the first token), thinking included.
ANSWER_KINDS = frozenset({"json_schema", "json_object", "tool_call"})


def check_budget(value: Any, param: str) -> Optional[int]:
    """A request's thinking budget: -1 (unrestricted), 0 (no thinking) or N tokens; a 400 otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise FieldError(f"{param} must be -1 (unrestricted), 0 (no thinking) or a number of tokens (got {value!r})",
                         param=param)
    return value


def server_budget(rt: "Runtime") -> int:
    return rt.config.server.reasoning_budget if rt.config.server is not None else -1


def _ids(tokenizer: Any, marker: str) -> tuple[int, ...]:
    return tuple(encode_text(tokenizer, marker, add_special_tokens=False))


def with_thinking(rt: "Runtime", sampling: SamplingParams, prompt_ids: tuple[int, ...],
                  budget: Optional[int] = None) -> SamplingParams:
    """`sampling` with the thinking spec a reply needs: a budget (the request's, else the
    server's) and an answer-only constraint; unchanged for a model that does not think, or
    when neither applies (a gbnf grammar decides the thinking itself)."""
    markers = rt.thinking_markers
    if markers is None:
        return sampling
    limit = server_budget(rt) if budget is None else budget
    constraint = sampling.constraint
    gated = constraint is not None and constraint.kind in ANSWER_KINDS
    if (constraint is not None and not gated) or (limit < 0 and not gated):
        return sampling
    tokenizer = rt.loaded.tokenizer
    start = reply_reasoning(markers, tokenizer, prompt_ids)
    spec = ThinkingSpec(_ids(tokenizer, markers.start), _ids(tokenizer, markers.end), start.open, limit, gated)
    return dataclasses.replace(sampling, thinking=spec)
