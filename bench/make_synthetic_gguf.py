"""Write a llama GGUF of >= 1B parameters in Q4_K_M's mix of types, with random blocks (for memory
and speed, not text): bench/make_synthetic_gguf.py [OUT] [--layers 16] [--hidden 2048] [--ffn 8192].

Q4_K_M as llama.cpp writes it: Q4_K everywhere except Q6_K for the token embedding (the tied LM head)
and for attn_v / ffn_down in about half the layers. Blocks are random bytes with their float16
scales set to small normal values (random bytes could be NaN). The tokenizer (and its chat
template) is the default model's, SmolLM2's 49,152 tokens. Default OUT: /tmp/synthetic-1b-q4_k_m.gguf.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mlxcel_py.models.gguf_file import read_gguf  # noqa: E402
from mlxcel_py.models.loader import default_model_path  # noqa: E402

# Byte offsets of each super-block's float16 scales: Q4_K d, dmin first; Q6_K d last.
F16_FIELDS = {T.Q4_K: (0, 2), T.Q6_K: (208,)}


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
    writer.add_name("synthetic-q4_k_m")
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

    add("token_embd.weight", T.Q6_K, vocab, hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        six = T.Q6_K if i % 2 == 0 else T.Q4_K  # llama.cpp's "use_more_bits" layers, about half
        for name, qtype, rows, cols in (("attn_q", T.Q4_K, hidden, hidden), ("attn_k", T.Q4_K, kv, hidden),
                                        ("attn_v", six, kv, hidden), ("attn_output", T.Q4_K, hidden, hidden),
                                        ("ffn_gate", T.Q4_K, ffn, hidden), ("ffn_up", T.Q4_K, ffn, hidden),
                                        ("ffn_down", six, hidden, ffn)):
            add(f"blk.{i}.{name}.weight", qtype, rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count + hidden * (2 * layers + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", nargs="?", default="/tmp/synthetic-1b-q4_k_m.gguf")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    opts = ap.parse_args()
    out = Path(opts.out)
    params = write(out, opts.layers, opts.hidden, opts.ffn, opts.heads, opts.kv_heads)
    print(f"{out}: {params / 1e9:.2f}B parameters, {out.stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
