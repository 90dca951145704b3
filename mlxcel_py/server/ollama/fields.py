"""What /api/chat and /api/generate do with each field and option: honoured, refused unless
inert (the tables generation/prepared.py's `refuse_unsupported` reads), or ignored. Fields no
schema declares are refused by name (schemas.Closed). docs/API_NATIVE.md has the same tables;
tests/test_server_fields.py checks them against these sets.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ...errors import FieldError
from ...models.chat import DEFAULT_OPTIONS, ChatOptions
from ..generation.prepared import Refused, accepts_only
from ..generation.template import without_thinking

HERE = "by this server"

SHARED_HONOURED = frozenset({"model", "format", "options", "stream", "logprobs", "top_logprobs", "think", "shift"})
CHAT_HONOURED = SHARED_HONOURED | {"messages", "tools"}
GENERATE_HONOURED = SHARED_HONOURED | {"prompt", "suffix", "system", "context", "raw", "images"}
# Refused unless inert (the tables below).
CHAT_REFUSED = frozenset({"truncate"})
GENERATE_REFUSED = CHAT_REFUSED | {"template", "width", "height", "steps"}
# Accepted, changing nothing: the one model stays resident for the server's lifetime.
IGNORED = frozenset({"keep_alive"})

OPTIONS_HONOURED = frozenset({
    "num_predict", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "num_ctx", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta",
})
OPTIONS_REFUSED = frozenset({"tfs_z"})
# Load-time knobs: the server's flags decide them.
OPTIONS_IGNORED = frozenset({
    "penalize_newline", "num_keep", "num_batch", "num_gpu", "main_gpu",
    "num_thread", "numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
    "embedding_only",
})
MESSAGE_HONOURED = frozenset({"role", "content", "thinking", "tool_calls", "tool_name", "tool_call_id", "images"})
MESSAGE_REFUSED: frozenset[str] = frozenset()
MESSAGE_IGNORED: frozenset[str] = frozenset()


def think_options(thinks: bool, think: Any, model: str) -> ChatOptions:
    """The template's options for `think` on a model that `thinks` (or not): false turns the
    template's thinking off; true keeps it; true on a model without thinking is Ollama's 400."""
    if think is None or think is False:
        return without_thinking(DEFAULT_OPTIONS) if think is False and thinks else DEFAULT_OPTIONS
    if think is not True:  # gpt-oss's levels
        raise FieldError(f"'think' value {json.dumps(think)} is not supported {HERE} (it cannot vary how long "
                         "the model thinks); it accepts true or false", param="think", code="unsupported_parameter")
    if not thinks:
        raise FieldError(f'"{model}" does not support thinking', param="think")  # Ollama's words
    return DEFAULT_OPTIONS


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value is v or (type(value) is type(v) and value == v) for v in values)


def _empty(value: Any) -> bool:
    return value in ("", [])


def _only(field: str, inert: Callable[[Any], bool], accepted: str, why: str = HERE) -> Refused:
    return Refused(field, accepts_only(inert, accepted, why))


SHARED: tuple[Refused, ...] = (
    _only("truncate", _is(False), "false", "(a prompt that does not fit is a 400 here, never truncated)"),
)
CHAT_NOT_SUPPORTED = SHARED
GENERATE_NOT_SUPPORTED: tuple[Refused, ...] = SHARED + (
    _only("template", _empty, '""', "(the model's own chat template renders the prompt; use raw: true for "
                                    "a prompt you rendered yourself)"),
    _only("width", lambda v: False, "null", "(no image generation here)"),
    _only("height", lambda v: False, "null", "(no image generation here)"),
    _only("steps", lambda v: False, "null", "(no image generation here)"),
)
OPTIONS_NOT_SUPPORTED: tuple[Refused, ...] = (
    _only("tfs_z", _is(1, 1.0), "1"),
)
