"""Calling a numba kernel without numba's per-call argument typing.

A numba dispatcher types every argument of every call before it finds the compiled overload; for
quant/step.run_step's nested tuples and typed lists that is ~0.6 ms of Python a decode step (of
12-15 ms; AMD EPYC Zen 3, 2 cores), spent before the parallel region starts. `TypedCall` types the
arguments once per `key` and then calls that overload's compiled entry point directly. The caller
makes `key` change whenever an argument's numba type could (dtypes, dimensions, layouts): the
entry point unboxes the arguments as the types it was compiled for."""

from __future__ import annotations

from typing import Any, Callable, Hashable


class TypedCall:
    """`call(key, *args)`: the dispatcher's result; after the first call of a key, through its entry point."""

    def __init__(self, dispatcher: Any):
        self._dispatcher = dispatcher
        self._entries: dict[Hashable, Callable] = {}

    def __call__(self, key: Hashable, *args: Any) -> Any:
        entry = self._entries.get(key)
        if entry is not None:
            return entry(*args)
        out = self._dispatcher(*args)  # types, compiles or loads the overload
        compiled = self._dispatcher.overloads.get(tuple(self._dispatcher.typeof_pyval(a) for a in args))
        if compiled is not None and len(self._entries) < 64:  # else: the dispatcher's own path each call
            self._entries[key] = compiled.entry_point
        return out


def layout(*arrays: Any) -> tuple:
    """What numba's type of each array depends on: dtype, dimensions, C-contiguity, writeability."""
    return tuple((a.dtype.char, a.ndim, a.flags.c_contiguous, a.flags.writeable) for a in arrays)
