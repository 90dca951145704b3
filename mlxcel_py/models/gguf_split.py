"""llama.cpp's split GGUF files (`gguf-split`, or the `gguf` writer's shards): a model in parts
`PREFIX-00001-of-0000N.gguf` ... `PREFIX-0000N-of-0000N.gguf`, loaded from the first.

Every part carries `split.no` (0-based), `split.count` and `split.tensors.count`; the first
holds the model's metadata, and each part a share of the tensors. As llama.cpp's loader: the
parts are found by name next to the first, each must say its own number, and together they
hold `split.tensors.count` tensors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import ModelLoadError

if TYPE_CHECKING:
    from .gguf_file import GGUFFile

SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS = "split.count", "split.no", "split.tensors.count"
SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")


def split_count(metadata: dict) -> int:
    """How many files the model is split into (1: not split)."""
    return max(int(metadata.get(SPLIT_COUNT, 1) or 1), 1)


def part_paths(path: Path, count: int) -> list[Path]:
    """Every part's path, from any part's path named as llama.cpp names them."""
    match = SPLIT_NAME.fullmatch(path.name)
    if match is None or int(match["count"]) != count:
        raise ModelLoadError(f"{path.name} is one of {count} split GGUF parts, but is not named "
                             f"PREFIX-00001-of-{count:05d}.gguf, so its other parts cannot be found")
    return [path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def with_parts(name: str) -> list[str]:
    """A file name and, when it names a part of a split model, every part's name (the first first)."""
    match = SPLIT_NAME.fullmatch(Path(name).name)
    if match is None:
        return [name]
    return [str(p) for p in part_paths(Path(name), int(match["count"]))]


def join_parts(first: "GGUFFile", read_part: Callable[[Path], "GGUFFile"]) -> "GGUFFile":
    """The whole model from its first part: the first part's metadata, every part's tensors."""
    count = split_count(first.metadata)
    paths = part_paths(first.path, count)
    number = int(first.metadata.get(SPLIT_NO, 0))
    if number != 0:
        raise ModelLoadError(f"{first.path.name} is part {number + 1} of a {count}-part split GGUF; "
                             f"load the first part, {paths[0].name}")
    tensors = dict(first.tensors)
    for i, path in enumerate(paths[1:], start=1):
        if not path.is_file():
            raise ModelLoadError(f"split GGUF part {path.name} is missing (part {i + 1} of {count}, "
                                 f"expected next to {first.path.name})")
        part = read_part(path)
        if int(part.metadata.get(SPLIT_NO, -1)) != i:
            raise ModelLoadError(f"split GGUF part {path.name} says it is split.no "
                                 f"{part.metadata.get(SPLIT_NO)}, expected {i}")
        again = sorted(tensors.keys() & part.tensors.keys())
        if again:
            raise ModelLoadError(f"split GGUF part {path.name} repeats tensor {again[0]!r}")
        tensors.update(part.tensors)
    expected = first.metadata.get(SPLIT_TENSORS)
    if expected is not None and int(expected) != len(tensors):
        raise ModelLoadError(f"corrupted split GGUF {first.path.name}: {expected} tensors expected over its "
                             f"{count} parts, {len(tensors)} found")
    return type(first)(first.path, first.metadata, tensors)
