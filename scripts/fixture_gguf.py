"""What the fixture scripts share: a committed GGUF's metadata copied into a new writer, random weights
of a tensor's shape, the writer's file finished, llama-server run on the result, and the command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

# scripts/build_llama_server.sh builds it; $LLAMA_SERVER names it.
LLAMA_SERVER = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"


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


@contextlib.contextmanager
def llama_server(server: str, gguf: Path, *flags: str) -> Iterator[tuple[int, str]]:
    """llama-server serving `gguf` with `flags` on a free loopback port: (the port, the command as a record
    states it, without the machine's paths and the port)."""
    from llama_server_tokens import _free_port, _wait_ready

    port = _free_port()
    proc = subprocess.Popen([server, "-m", str(gguf), *flags, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        yield port, " ".join(["llama-server", "-m", gguf.name, *flags])
    finally:
        proc.terminate()
        proc.wait(30)


def fixture_main(doc: str, write: Callable[[], None], record: Callable[[str], None], what: str) -> None:
    """A fixture script's command line: write the GGUF (unless --record-only), then record llama-server's
    outputs of it when the binary exists."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--server", default=LLAMA_SERVER, help="llama-server binary (skip the record if absent)")
    parser.add_argument("--record-only", action="store_true", help="keep the GGUF, only re-record")
    args = parser.parse_args()
    if not args.record_only:
        write()
    if Path(args.server).exists():
        record(args.server)
    else:
        print(f"{args.server} not found: {what} not recorded")
