"""The engine's KV rows' memory (kv_rows.RowKV's buffers): anonymous maps whose untouched pages cost
nothing, pages given back when a slot is freed, and the floor below which a sliding-window layer's
positions are given back as a sequence grows (the window, WINDOW_SLACK more, RELEASE_STEP at a time)."""

from __future__ import annotations

import mmap
from typing import Optional

import numpy as np

from ...config_values import MAX_DRAFT

# Sliding-window layers: a snapshot is adoptable at lengths down to PREFIX_REACH below its own; a row
# may be pinned up to MAX_DRAFT positions below what it holds (a verified draft past its finish), so
# its windowed layers keep WINDOW_SLACK positions beyond the window.
PREFIX_REACH = 64
WINDOW_SLACK = 2 * PREFIX_REACH + MAX_DRAFT  # twice: a row's floor may be its adopted prefix's
RELEASE_STEP = 128  # windowed positions are given back this many at a time (whole 4 KB pages)


def zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 zero buffer whose untouched pages are not resident. np.zeros (calloc) is not that
    once glibc has raised its mmap threshold past the buffer's size (after freeing one as large):
    calloc then clears reused heap pages, and every page of the capacity becomes resident. Python's
    anonymous map is shared memory (one mapping of its own, never merged with its neighbours), whose
    pages `release` gives back with MADV_REMOVE."""
    count = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(4 * count, 1)), np.float32, count).reshape(shape)


# Shared memory keeps a page (and what it holds) through MADV_DONTNEED, which only unmaps it:
# MADV_REMOVE frees it, and it reads as zeros again.
_FREE = getattr(mmap, "MADV_REMOVE", getattr(mmap, "MADV_DONTNEED", None))


def _free(mapping: mmap.mmap, start: int, length: int) -> None:
    if _FREE is not None:
        mapping.madvise(_FREE, start, length)


def _mapping(buffer: np.ndarray) -> Optional[mmap.mmap]:
    mapping = buffer.base
    while mapping is not None and not isinstance(mapping, mmap.mmap):
        mapping = getattr(mapping, "obj", None) or getattr(mapping, "base", None)
    return mapping if isinstance(mapping, mmap.mmap) and hasattr(mapping, "madvise") else None


def release(buffer: np.ndarray, slot: int) -> None:
    """Give a freed slot's pages back (they read as zeros again and are no longer resident)."""
    mapping, size = _mapping(buffer), buffer[0].nbytes
    if mapping is not None and size % mmap.PAGESIZE == 0:
        _free(mapping, slot * size, size)


def release_span(buffer: np.ndarray, slot: int, first: int, end: int) -> None:
    """Give back the whole pages of positions first..end - 1 of a slot, in every KV head."""
    mapping = _mapping(buffer)
    if mapping is None or end <= first:
        return
    _, kv_heads, capacity, dim = buffer.shape
    for kv in range(kv_heads):
        row = (slot * kv_heads + kv) * capacity
        a = -(-(row + first) * dim * 4 // mmap.PAGESIZE) * mmap.PAGESIZE
        b = (row + end) * dim * 4 // mmap.PAGESIZE * mmap.PAGESIZE
        if b > a:
            _free(mapping, a, b - a)


def windows_of(decoder) -> tuple[int, ...]:
    """Each layer's sliding window (0: full attention) of a CPU decode step (models/cpu/rows.py)."""
    return tuple(getattr(w, "window", 0) for w in getattr(decoder, "_layers", ()))


def floor_for(length: int, window: int) -> int:
    """The lowest position a windowed layer keeps for a sequence of `length` positions (0: no window)."""
    if window <= 0:
        return 0
    return max(0, (length - window - WINDOW_SLACK) // RELEASE_STEP * RELEASE_STEP)
