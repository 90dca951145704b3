"""OpenAI's routes' refused-field table: fields that would change the output but are not
implemented yet, refused (generation/prepared.py), never ignored.

One row per field: the values that change nothing (accepted) and how to say so. Enabling
a field is deleting its row here plus implementing it. Honoured and ignored fields are
listed in docs/SERVER.md (tests/test_server_fields.py checks the three against the schemas).
"""

from __future__ import annotations

from typing import Any, Callable

from ..generation.prepared import Refused, accepts_only

YET = "yet by this server"


def _never(value: Any) -> bool:
    return False


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value is v or (type(value) is type(v) and value == v) for v in values)


def _not_yet(field: str, inert: Callable[[Any], bool], accepted: str) -> Refused:
    return Refused(field, accepts_only(inert, accepted, YET))


NOT_SUPPORTED_YET: tuple[Refused, ...] = (
    _not_yet("best_of", _is(1), "1"),
    _not_yet("modalities", lambda v: v == ["text"], '["text"]'),
    _not_yet("audio", _never, "null"),
    _not_yet("web_search_options", _never, "null"),
    _not_yet("moderation", _never, "null"),
    _not_yet("verbosity", _is("medium"), '"medium"'),
    _not_yet("reasoning_effort", _is("medium", "none"), '"medium" or "none"'),  # none: prepare.py
    # llama-server's probs after sampling: /completion's shape; OpenAI's logprobs have no such form.
    _not_yet("post_sampling_probs", _is(False), "false"),
)
