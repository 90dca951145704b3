"""What the fixture scripts share: a committed GGUF's metadata copied into a new writer, random weights
of a tensor's shape, and the writer's file finished."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def copy_metadata(reader, writer, skip: tuple[str, ...] = ()) -> None:
    """Every key of `reader` into `writer`, but GGUF.* (the writer's own), general.architecture and `skip`."""
    from gguf import GGUFValueType

    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", *skip):
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)


def random_weights(shape: tuple[int, ...], name: str, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Norms near one (float32), other tensors f16 with variance scale^2 / fan-in."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float16)


def numpy_shape(tensor) -> tuple[int, ...]:
    """A reader tensor's shape in numpy's order (the reader lists ggml's, fastest axis first)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def finish(writer, out: Path) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out.name} ({out.stat().st_size} bytes)")
