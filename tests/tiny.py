"""A tiny random-weight llama GGUF, written in-process, to test loading end to end.

Not a test module. `write_tiny_gguf` writes the file the way llama.cpp's converter would
(Q/K rows permuted for its RoPE, a byte-level BPE vocabulary with merges, ChatML template);
`tiny_model` loads it once per process."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 4096
VOCAB_SIZE = 400
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello world! What is the capital of France? "
    "Paris is the capital of France. The year 2024 had 366 days; 12345 + 678 = 13023. "
    "Tokenizers split text into pieces, and models predict the next piece. "
    "user assistant system: hello, how are you today? I am fine, thank you.\n"
    "def main():\n    return 42\n"
) * 4


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token_type) of a byte-level BPE trained on TEXT; 256 byte tokens included."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return tokens, merges, types


def tiny_weights(vocab: int, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """Random float32 weights in Hugging Face / mlx-lm llama naming and layout."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
        })
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return out


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's Q/K permutation (halves -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def to_gguf_tensors(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rename to GGUF tensor names and permute Q/K rows as llama.cpp does."""
    out = {}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for name, w in weights.items():
        if name in top:
            out[top[name]] = w
            continue
        parts = name.split(".")  # model.layers.N.<module>.weight
        layer, module = parts[2], ".".join(parts[3:-1])
        if module == "self_attn.q_proj":
            w = permute_rows(w, HEADS)
        elif module == "self_attn.k_proj":
            w = permute_rows(w, KV_HEADS)
        out[f"blk.{layer}.{GGUF_NAMES[module]}.weight"] = w
    return out


def tiny_metadata(tokens: list[str], merges: list[str], types: list[int]) -> dict:
    import mlx.core as mx

    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    return {
        "general.architecture": "llama", "general.name": "tiny", "general.file_type": u32(0),
        "llama.context_length": u32(CONTEXT), "llama.embedding_length": u32(HIDDEN),
        "llama.block_count": u32(LAYERS), "llama.feed_forward_length": u32(FFN),
        "llama.attention.head_count": u32(HEADS), "llama.attention.head_count_kv": u32(KV_HEADS),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "llama.vocab_size": u32(len(tokens)),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1), "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.padding_token_id": u32(2), "tokenizer.ggml.unknown_token_id": u32(0),
        "tokenizer.ggml.add_bos_token": mx.array(False), "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def write_tiny_gguf(
    path, *, seed: int = 0, quant: Optional[str] = None, tied: bool = True, metadata: Optional[dict] = None
) -> Path:
    """Write the tiny llama GGUF to `path`; quant None (float32) or "f16".

    mx.save_gguf cannot write Q4/Q8 blocks, so quantized loading is tested on the real model.
    `metadata` overrides keys (e.g. {"general.architecture": "qwen2"}) for error tests."""
    import mlx.core as mx

    if quant not in (None, "f16"):
        raise ValueError(f"tiny GGUF quant must be None or 'f16' (got {quant!r})")
    tokens, merges, types = tiny_vocab()
    tensors = to_gguf_tensors(tiny_weights(len(tokens), seed, tied))
    dtype = mx.float16 if quant == "f16" else mx.float32
    arrays = {k: mx.array(v).astype(dtype if v.ndim == 2 else mx.float32) for k, v in tensors.items()}
    meta = tiny_metadata(tokens, merges, types)
    if quant == "f16":
        meta["general.file_type"] = mx.array(1, dtype=mx.uint32)
    meta.update(metadata or {})
    path = Path(path)
    mx.save_gguf(str(path), arrays, meta)
    return path


def reference_model(vocab: int, seed: int = 0, tied: bool = True):
    """The tiny model built straight from its HF-layout weights, bypassing GGUF."""
    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    args = ModelArgs(
        model_type="llama", hidden_size=HIDDEN, num_hidden_layers=LAYERS, intermediate_size=FFN,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5, vocab_size=vocab,
        rope_theta=10000.0, max_position_embeddings=CONTEXT, tie_word_embeddings=tied,
    )
    model = Model(args)
    model.load_weights([(k, mx.array(v)) for k, v in tiny_weights(vocab, seed, tied).items()])
    return model


@functools.lru_cache(maxsize=None)
def _tmpdir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="mlxcel-tiny-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@functools.lru_cache(maxsize=None)
def tiny_model(seed: int = 0):
    """The tiny GGUF model loaded through `load_model` (dense float32 on CPU); cached per process."""
    from mlxcel_py.models import load_model

    path = write_tiny_gguf(_tmpdir() / f"tiny-{seed}.gguf", seed=seed)
    return load_model(str(path))


def greedy_tokens(model, ids, num_tokens: int) -> list[int]:
    """Greedy decode with an mlx-lm prompt cache: the reference the engine is compared to."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([list(ids)]), cache=cache)
    out = []
    for _ in range(num_tokens):
        out.append(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[out[-1]]]), cache=cache)
    return out
