"""What every dialect's request preparation yields, `Prepared`, and the one mechanism that
refuses fields: each dialect's fields.py holds a table of `Refused` rows, and
`refuse_unsupported` answers the first row whose field is set to a value that would change
the output (a 400 naming it, code `unsupported_parameter`); never silently ignored.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar

from ...engine import Request as EngineRequest
from ...errors import FieldError, RequestError

R = TypeVar("R")  # what a dialect's reply is labelled with (openai.shapes.Reply, ...)
# What is wrong with a field's value, after its quoted name; None when the value changes nothing.
Problem = Callable[[Any], Optional[str]]


@dataclass(frozen=True, slots=True)
class Prepared(Generic[R]):
    """A parsed, validated, tokenized request: the engine's request, its reply's labels, streamed or not."""

    job: EngineRequest
    reply: R
    stream: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """A field this server cannot honour, except at the values `problem` lets through."""

    field: str
    problem: Problem


def accepts_only(inert: Callable[[Any], bool], accepted: str, unsupported: str) -> Problem:
    """The usual problem: anything but the `inert` values (`accepted`, for the message) is `unsupported`."""
    return lambda value: None if inert(value) else f"is not supported {unsupported}; it accepts only {accepted} here"


def refuse_unsupported(body: Any, table: Sequence[Refused]) -> None:
    """A 400 naming the first field of `table` set to a value this server cannot honour."""
    for row in table:
        value = getattr(body, row.field, None)
        problem = None if value is None else row.problem(value)
        if problem is not None:
            raise FieldError(f"'{row.field}' {problem}", param=row.field, code="unsupported_parameter")


@contextmanager
def blame(param: str) -> Iterator[None]:
    """A RequestError raised inside that names no field is about `param` (e.g. the prompt's)."""
    try:
        yield
    except RequestError as exc:
        if exc.param is None:
            exc.param = param
        raise
