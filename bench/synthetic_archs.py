"""The non-llama architectures of bench/make_synthetic_gguf.py: each one's tensor names and metadata are taken
from its committed fixture (tests/fixtures/gguf/<arch>-f16.gguf, llama.cpp's own converter output, written by
scripts/make_gguf_fixtures.py), scaled to the preset's dimensions; its tokenizer stays the fixture's (400 tokens).

A tensor's new shape is its rule's shape at the new dimensions times the fixture's ratio to the rule at the
fixture's dimensions, so a fused tensor (phi3's attn_qkv, its gate|up ffn_up) keeps its fusion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gguf"
ARCH_PRESETS = {  # layers, hidden, ffn, heads, kv heads, head dim: real models' shapes, fewer layers
    "qwen2": (12, 896, 4864, 14, 2, 64),  # Qwen2.5-0.5B's layer
    "qwen3": (14, 1024, 3072, 16, 8, 128),  # Qwen3-0.6B's layer
    "gemma3": (18, 640, 2048, 4, 1, 256),  # Gemma 3 270M's layers (not its 262k vocabulary)
    "phi3": (12, 1024, 2816, 16, 16, 64),  # a narrower Phi-3-mini
}
SLIDING_WINDOW = 512  # gemma3 270M's; the fixture's is 8


def _dims(meta: dict, arch: str) -> dict:
    hidden, heads = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"]
    return {"H": hidden, "F": meta[f"{arch}.feed_forward_length"], "n": heads,
            "k": meta[f"{arch}.attention.head_count_kv"], "d": meta.get(f"{arch}.attention.key_length", hidden // heads),
            "V": 0}


def _rule(name: str, g: dict) -> tuple[int, ...]:
    """(rows, cols) of a tensor by its gguf name (`blk.N.` and `.weight`/`.bias` stripped), or (rows,)."""
    rows = {"attn_q": g["n"] * g["d"], "attn_k": g["k"] * g["d"], "attn_v": g["k"] * g["d"],
            "attn_qkv": (g["n"] + 2 * g["k"]) * g["d"], "attn_output": g["H"], "ffn_gate": g["F"],
            "ffn_up": g["F"], "ffn_down": g["H"], "token_embd": g["V"], "output": g["V"]}
    cols = {"attn_output": g["n"] * g["d"], "ffn_down": g["F"]}
    if name in ("attn_q_norm", "attn_k_norm"):
        return (g["d"],)
    if name not in rows:  # the per-layer and output norms
        return (g["H"],)
    return rows[name], cols.get(name, g["H"])


def _short(tensor_name: str) -> str:
    parts = tensor_name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def write_arch(out: Path, arch: str, shape: tuple[int, ...], add: Callable, writer_for: Callable) -> GGUFWriter:
    """Write `arch` at `shape` (ARCH_PRESETS' order) to `out`; `add(writer, gguf_name, short_name, layer,
    layers, rows, cols)` adds one 2-D weight, `writer_for(out, arch)` makes the writer; returns the writer with
    everything added, not yet written."""
    reader = GGUFReader(FIXTURES / f"{arch}-f16.gguf")
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    layers, hidden, ffn, heads, kv_heads, head_dim = shape
    vocab = len(meta["tokenizer.ggml.tokens"])
    old, new = _dims(meta, arch), {"H": hidden, "F": ffn, "n": heads, "k": kv_heads, "d": head_dim, "V": vocab}
    old["V"] = vocab
    writer = writer_for(out, arch)
    _copy_metadata(writer, reader, arch, {
        "embedding_length": hidden, "feed_forward_length": ffn, "block_count": layers,
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "attention.key_length": head_dim,
        "attention.value_length": head_dim, "rope.dimension_count": head_dim,
        "attention.sliding_window": SLIDING_WINDOW if meta.get(f"{arch}.attention.sliding_window") else 0})
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) != 0:
            continue  # layer 0 stands for every layer
        short = _short(t.name)
        fixture_shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # rows first
        ratio = [f // r for f, r in zip(fixture_shape, _rule(short, old))]
        dims = [a * b for a, b in zip(_rule(short, new), ratio)]
        for i in range(layers) if t.name.startswith("blk.") else [None]:
            name = t.name if i is None else t.name.replace("blk.0.", f"blk.{i}.", 1)
            if len(dims) == 1 or t.name.endswith(".bias"):
                writer.add_tensor(name, np.ones(dims[0], np.float32) if "norm" in short else
                                  np.zeros(dims[0], np.float32))
            else:
                add(writer, name, short, i or 0, layers, *dims)
    return writer


def _copy_metadata(writer: GGUFWriter, reader: GGUFReader, arch: str, overrides: dict) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        key = field.name.removeprefix(f"{arch}.")
        value = overrides.get(key, field.contents()) if key != field.name else field.contents()
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
