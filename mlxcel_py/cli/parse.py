"""Typer parses a command's options once, into its flag record (flags.py).

`@parses(ServeFlags)` over `def serve(flags: ServeFlags)` gives Typer a function whose signature
is the record's options (each field's `Annotated` Typer option, its default, in the record's
`help_order`), and calls the command with the whole record built from what Typer parsed.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from ..flags import build, leaves

R = TypeVar("R")


def signature_of(kind: type) -> inspect.Signature:
    """The record's options as one flat signature, in `help_order` (unnamed ones after, as declared)."""
    found = leaves(kind)
    names = [name for name, _, _ in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TypeError(f"{kind.__name__}: options {repeated} appear in two groups; a command's options are one set")
    order = {name: i for i, name in enumerate(getattr(kind, "help_order", ()))}
    found.sort(key=lambda leaf: order.get(leaf[0], len(order)))  # stable: the rest keep declaration order
    return inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                                annotation=annotation) for name, annotation, default in found])


def parses(kind: type) -> Callable[[Callable[[Any], R]], Callable[..., R]]:
    """Decorate `command(flags: kind)` into the Typer callback that builds the record and calls it."""

    def wrap(command: Callable[[Any], R]) -> Callable[..., R]:
        def callback(**values: Any) -> R:
            return command(build(kind, values))

        callback.__signature__ = signature_of(kind)  # type: ignore[attr-defined]
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(callback, attr, getattr(command, attr))
        callback.record = kind  # type: ignore[attr-defined]
        callback.command = command  # type: ignore[attr-defined]
        return callback

    return wrap
