"""Synthetic GGUF files: llama.cpp's Q4_K_M mix of types with random blocks (for memory and speed, not text).

    python -m bench synthetic-gguf [OUT] [--arch llama|qwen2|qwen3|gemma3|phi3] [--preset 1b|smollm2-135m|...]
        [--layers N] [--hidden N] ...

Types as llama.cpp's llama_tensor_get_type chooses them for Q4_K_M (`q4_k_m_type`): Q4_K by default, Q6_K
for attn_v and ffn_down in the "use_more_bits" layers (the first and last eighth, every third between)
and for the output (here the tied token embedding); a row that is not whole 256-blocks takes the
fallback llama.cpp converts to (Q4_K -> Q5_0, Q6_K -> Q8_0; the output -> Q8_0), as on SmolLM2's 576-wide
rows. Blocks are random bytes with their float16 scales set to small normal values (random bytes could
be NaN). The tokenizer (and its chat template) is the default model's, SmolLM2's 49,152 tokens. Default
OUT: /tmp/synthetic-<preset>-q4_k_m.gguf; the 1b preset is 1.07B parameters (638 MiB), the 3b
preset (Llama 3.2 3B's shape: 28 layers of 3,072) 2.9B.

The other architectures (--arch; their presets are named after the architecture, `--arch qwen3` =
`--preset qwen3`): each one's tensor names and metadata are taken from its committed fixture
(tests/fixtures/gguf/<arch>-f16.gguf, llama.cpp's own converter output, written by
scripts/make_gguf_fixtures.py), scaled to the preset's dimensions; its tokenizer stays the fixture's (400
tokens), or with `--vocab N` grows to N with tokens no text reaches, so that the embedding, the
LM head and the sampler have a real model's size (151,936 for Qwen2.5, 262,144 for Gemma 3). A
tensor's new shape is its rule's shape at the new dimensions times the fixture's ratio to the rule at
the fixture's dimensions, so a fused tensor (phi3's attn_qkv, its gate|up ffn_up) keeps its fusion.
`write` is also what `python -m bench decode-sweep` writes its files with.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from mlxcel_py.models.gguf_file import read_gguf
from mlxcel_py.models.loader import default_model_path

# Byte offsets of each block's float16 scales: Q4_K d, dmin first; Q6_K d last; Q5_0, Q8_0 d first.
F16_FIELDS = {T.Q4_K: (0, 2), T.Q6_K: (208,), T.Q5_0: (0,), T.Q8_0: (0,)}
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}  # llama.cpp's convert for rows that are not whole 256-blocks
PRESETS = {  # layers, hidden, ffn, heads, kv heads
    "1b": (16, 2048, 8192, 32, 8),
    "3b": (28, 3072, 8192, 24, 8),  # Llama 3.2 3B's shape
    "smollm2-135m": (30, 576, 1536, 9, 3),
    "smollm2-360m": (32, 960, 2560, 15, 5),
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get Q6_K attn_v / ffn_down in Q4_K_M (about half)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, layer: int, layers: int, cols: int) -> T:
    """The type llama.cpp's Q4_K_M gives tensor `name` (gguf name without `.weight`) of `cols` columns."""
    if name in ("output", "token_embd"):  # token_embd here is the tied output
        return T.Q8_0 if cols % 256 else T.Q6_K
    qtype = T.Q6_K if name in ("attn_v", "ffn_down") and use_more_bits(layer, layers) else T.Q4_K
    return FALLBACK[qtype] if cols % 256 else qtype


def random_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, row bytes) uint8 of random blocks whose float16 scales are ~1e-3 (finite, small)."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scales = (rng.random((rows, cols // block)) * 2e-3 + 1e-4).astype(np.float16).view(np.uint8)
    for at in F16_FIELDS[qtype]:
        raw[:, :, at : at + 2] = scales.reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def _tokenizer(writer: GGUFWriter) -> int:
    meta = read_gguf(Path(default_model_path())).metadata
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta.get("tokenizer.ggml.pre", "default"))
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(int(meta["tokenizer.ggml.bos_token_id"]))
    writer.add_eos_token_id(int(meta["tokenizer.ggml.eos_token_id"]))
    if "tokenizer.chat_template" in meta:
        writer.add_chat_template(meta["tokenizer.chat_template"])
    return len(meta["tokenizer.ggml.tokens"])


def write(out: Path, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int) -> int:
    """Write the file; returns its parameter count."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(out), "llama")
    vocab = _tokenizer(writer)
    writer.add_name(out.stem)
    writer.add_file_type(15)  # LlamaFileType.MOSTLY_Q4_K_M
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    kv = hidden // heads * kv_heads
    count = 0

    def add(name: str, qtype: T, rows: int, cols: int) -> None:
        nonlocal count
        writer.add_tensor(name, random_blocks(qtype, rows, cols, rng), raw_dtype=qtype)  # shape from the bytes
        count += rows * cols

    add("token_embd.weight", q4_k_m_type("token_embd", 0, layers, hidden), vocab, hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            add(f"blk.{i}.{name}.weight", q4_k_m_type(name, i, layers, cols), rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count + hidden * (2 * layers + 1)


def add_weight(writer: GGUFWriter, name: str, short: str, layer: int, layers: int, rows: int, cols: int,
               rng: np.random.Generator) -> int:
    """One random 2-D weight in its Q4_K_M type; returns its parameter count."""
    qtype = q4_k_m_type("attn_q" if short == "attn_qkv" else short, layer, layers, cols)
    writer.add_tensor(name, random_blocks(qtype, rows, cols, rng), raw_dtype=qtype)  # shape from the bytes
    return rows * cols


def write_other(out: Path, arch: str, shape: tuple[int, ...], vocab: int = 0) -> int:
    """A non-llama architecture (write_arch; `vocab`: its token count, 0 the fixture's); returns its
    parameter count."""
    rng, count = np.random.default_rng(0), [0]

    def add(writer, *spec) -> None:
        count[0] += add_weight(writer, *spec, rng)

    def writer_for(path: Path, name: str) -> GGUFWriter:
        writer = GGUFWriter(str(path), name)
        writer.add_file_type(15)  # LlamaFileType.MOSTLY_Q4_K_M
        return writer

    writer = write_arch(out, arch, shape, add, writer_for, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count[0]


SHAPE_FLAGS = ("layers", "hidden", "ffn", "heads", "kv-heads", "head-dim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--arch", choices=["llama", *sorted(ARCH_PRESETS)], default="llama")
    ap.add_argument("--preset", choices=sorted({**PRESETS, **ARCH_PRESETS}), help="default: 1b, or the --arch's")
    for flag in SHAPE_FLAGS:
        ap.add_argument(f"--{flag}", type=int, help="overrides the preset's (head-dim: not llama)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="not llama: this many tokens, the fixture's 400 padded with unreachable ones (a real model's "
                         "head and sampler: 151936 for Qwen2.5, 262144 for Gemma 3)")
    opts = ap.parse_args()
    preset = opts.preset or ("1b" if opts.arch == "llama" else opts.arch)
    base = (ARCH_PRESETS if opts.arch != "llama" else PRESETS).get(preset)
    if base is None:
        ap.error(f"--preset {preset} is not a {opts.arch} preset")
    shape = [getattr(opts, f.replace("-", "_")) or v for f, v in zip(SHAPE_FLAGS, base)]
    out = Path(opts.out or f"/tmp/synthetic-{preset}-q4_k_m.gguf")
    if opts.vocab and opts.arch == "llama":
        ap.error("--vocab: the llama presets keep the default model's 49,152 tokens")
    params = write(out, *shape) if opts.arch == "llama" else write_other(out, opts.arch, tuple(shape), opts.vocab)
    print(f"{out}: {params / 1e9:.2f}B parameters, {out.stat().st_size / 2**20:.0f} MiB")


# The non-llama architectures: tensor names and metadata from the committed fixtures, scaled.

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gguf"
ARCH_PRESETS = {  # layers, hidden, ffn, heads, kv heads, head dim: real models' shapes, fewer layers
    "qwen2": (12, 896, 4864, 14, 2, 64),  # Qwen2.5-0.5B's layer
    "qwen3": (14, 1024, 3072, 16, 8, 128),  # Qwen3-0.6B's layer
    "gemma3": (18, 640, 2048, 4, 1, 256),  # Gemma 3 270M's layers (its 262k vocabulary: --vocab 262144)
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


def write_arch(out: Path, arch: str, shape: tuple[int, ...], add: Callable, writer_for: Callable,
               vocab: int = 0) -> GGUFWriter:
    """Write `arch` at `shape` (ARCH_PRESETS' order) to `out`; `add(writer, gguf_name, short_name, layer,
    layers, rows, cols)` adds one 2-D weight, `writer_for(out, arch)` makes the writer; `vocab` > the
    fixture's pads its tokens with unreachable ones (`_padded`); returns the writer with everything added,
    not yet written."""
    reader = GGUFReader(FIXTURES / f"{arch}-f16.gguf")
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    layers, hidden, ffn, heads, kv_heads, head_dim = shape
    fixture_vocab = len(meta["tokenizer.ggml.tokens"])
    vocab = max(vocab, fixture_vocab)
    old, new = _dims(meta, arch), {"H": hidden, "F": ffn, "n": heads, "k": kv_heads, "d": head_dim, "V": vocab}
    old["V"] = fixture_vocab
    writer = writer_for(out, arch)
    _copy_metadata(writer, reader, arch, _padded(meta, vocab), {
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


def _padded(meta: dict, vocab: int) -> dict:
    """The tokenizer arrays grown to `vocab` entries: normal tokens `synthetic_N` (type 1, score -1000,
    as most of a real vocabulary: control tokens would make every tokenizer an added-token table) that
    no merge reaches, so no text tokenizes to them; the model's random head may still pick them."""
    extra = range(len(meta["tokenizer.ggml.tokens"]), vocab)
    grown = {"tokenizer.ggml.tokens": [f"synthetic_{i}" for i in extra],
             "tokenizer.ggml.token_type": [1] * len(extra), "tokenizer.ggml.scores": [-1000.0] * len(extra)}
    return {k: list(meta[k]) + v for k, v in grown.items() if k in meta and len(extra)}


def _copy_metadata(writer: GGUFWriter, reader: GGUFReader, arch: str, arrays: dict, overrides: dict) -> None:
    """The fixture's metadata: `arrays` replaces whole fields by name, `overrides` the `arch.` keys."""
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        key = field.name.removeprefix(f"{arch}.")
        value = overrides.get(key, field.contents()) if key != field.name else arrays.get(field.name, field.contents())
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
