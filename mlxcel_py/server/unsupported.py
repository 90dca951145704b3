"""Fields that would change the output but are not implemented yet: refused, never ignored.

One row per field: the values that change nothing (accepted) and how to say so. Enabling
a field is deleting its row here plus implementing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .errors import APIError
from .schemas import GenerationRequest


@dataclass(frozen=True, slots=True)
class NotYet:
    field: str
    inert: Callable[[Any], bool]  # True for the values that change nothing
    accepted: str  # those values, for the error message


def _never(value: Any) -> bool:
    return False


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value is v or (type(value) is type(v) and value == v) for v in values)


NOT_SUPPORTED_YET: tuple[NotYet, ...] = (
    NotYet("suffix", _is(""), '""'),
    NotYet("best_of", _is(1), "1"),
    NotYet("modalities", lambda v: v == ["text"], '["text"]'),
    NotYet("audio", _never, "null"),
    NotYet("web_search_options", _never, "null"),
    NotYet("moderation", _never, "null"),
    NotYet("verbosity", _is("medium"), '"medium"'),
    NotYet("reasoning_effort", _is("medium"), '"medium"'),
    NotYet("typical_p", _is(1, 1.0), "1"),
    NotYet("mirostat", _is(0), "0"),
    NotYet("dynatemp_range", _is(0, 0.0), "0"),
    NotYet("dry_multiplier", _is(0, 0.0), "0"),
    NotYet("xtc_probability", _is(0, 0.0), "0"),
)


def refuse_unsupported(body: GenerationRequest) -> None:
    """A 400 naming the first field set to a value this server cannot honour yet."""
    for row in NOT_SUPPORTED_YET:
        value = getattr(body, row.field, None)
        if value is None or row.inert(value):
            continue
        raise APIError(
            400, f"'{row.field}' is not supported yet by this server; it accepts only {row.accepted} here",
            param=row.field, code="unsupported_parameter",
        )
