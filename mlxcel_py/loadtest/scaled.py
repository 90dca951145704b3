"""A random-weight llama GGUF sized for benchmarks: long context (an 8192-token admission fits)
and cheap enough that the whole scenario runs in minutes on a CPU.

Its vocabulary is a byte-level BPE trained on ASCII text only, so every token decodes to whole
characters and each generated token reaches the client as its own frame."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .prompts import FILLERS, random_words

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2; EOS is 2


@dataclass(frozen=True, slots=True)
class ScaledDims:
    # About 6 s for an 8192-token prefill and 4 ms per decode step on a 2-core CPU.
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    ffn: int = 384
    context: int = 16384
    vocab: int = 512


def scaled_vocab(size: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a BPE trained on random words, digits and the prompt fillers."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    text = " ".join(random_words(rng, 4000)) + "".join(FILLERS) * 50 + " 0123456789 .,;:!?'\"()-\n" * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=list(SPECIALS), show_progress=False)
    tok.train_from_iterator([text], trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, merges


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter interleaves Q/K rows for its RoPE; the loader undoes it.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def scaled_tensors(d: ScaledDims, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under GGUF tensor names (tied embeddings)."""
    rng = np.random.default_rng(seed)
    head_dim = d.hidden // d.heads
    mat = lambda rows, cols: (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)  # noqa: E731
    norm = lambda: (1.0 + 0.1 * rng.standard_normal(d.hidden)).astype(np.float32)  # noqa: E731
    out = {"token_embd.weight": mat(vocab, d.hidden), "output_norm.weight": norm()}
    for i in range(d.layers):
        p = f"blk.{i}."
        out.update({
            p + "attn_q.weight": _permute(mat(d.heads * head_dim, d.hidden), d.heads),
            p + "attn_k.weight": _permute(mat(d.kv_heads * head_dim, d.hidden), d.kv_heads),
            p + "attn_v.weight": mat(d.kv_heads * head_dim, d.hidden),
            p + "attn_output.weight": mat(d.hidden, d.heads * head_dim),
            p + "ffn_gate.weight": mat(d.ffn, d.hidden), p + "ffn_up.weight": mat(d.ffn, d.hidden),
            p + "ffn_down.weight": mat(d.hidden, d.ffn),
            p + "attn_norm.weight": norm(), p + "ffn_norm.weight": norm(),
        })
    return out


def _write(path: Path, d: ScaledDims, tokens: list[str], merges: list[str], tensors: dict[str, np.ndarray]) -> None:
    """A llama GGUF through gguf-py's writer (llama.cpp's own), metadata as its converter writes it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("bench-scaled")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(d.context)
    writer.add_embedding_length(d.hidden)
    writer.add_block_count(d.layers)
    writer.add_feed_forward_length(d.ffn)
    writer.add_head_count(d.heads)
    writer.add_head_count_kv(d.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_scaled_gguf(path: Path, dims: ScaledDims = ScaledDims(), seed: int = 0) -> Path:
    """Write the model to `path` (float32 GGUF) unless it is already there."""
    path = Path(path)
    if path.is_file():
        return path
    tokens, merges = scaled_vocab(dims.vocab, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.gguf")
    _write(tmp, dims, tokens, merges, scaled_tensors(dims, len(tokens), seed))
    tmp.replace(path)
    return path
