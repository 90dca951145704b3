"""Build an mlx-lm llama model from a GGUF file, in memory."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.llama import Model, ModelArgs

from .tokenizer import TokenizerInfo, gguf_tokenizer
from ..errors import ModelLoadError

log = logging.getLogger("mlxcel_py.models")

GROUP_SIZE = 32  # every GGUF quant type mx.load understands uses 32-wide blocks
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 32: "BF16"}
TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
IN_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|scales|biases)$")
TOP_RE = re.compile(r"(\w+)\.(weight|scales|biases)$")


@dataclass(frozen=True, slots=True)
class GGUFModel:
    model: Any
    tokenizer: TokenizerInfo
    context_length: int
    description: str  # "llama 135M, gguf Q4_1"
    weights: str


def _meta_num(meta: dict, key: str, source: str, default=None):
    if key in meta:
        return meta[key].item()
    if default is None:
        raise ModelLoadError(f"GGUF metadata key {key!r} missing in {source}")
    return default


def model_args(meta: dict, has_output: bool, source: str) -> ModelArgs:
    """ModelArgs from `llama.*` metadata."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r} in {source} (supported: llama)")
    num = lambda k, d=None: _meta_num(meta, f"llama.{k}", source, d)  # noqa: E731
    hidden, heads = int(num("embedding_length")), int(num("attention.head_count"))
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise ModelLoadError(f"unsupported GGUF rope scaling {scaling!r} in {source} (supported: linear)")
    rope_scaling = {"type": "linear", "factor": float(num("rope.scaling.factor"))} if scaling == "linear" else None
    vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else int(num("vocab_size"))
    return ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=int(num("block_count")),
        intermediate_size=int(num("feed_forward_length")), num_attention_heads=heads,
        num_key_value_heads=int(num("attention.head_count_kv", heads)),
        head_dim=int(num("attention.key_length", hidden // heads)),
        rms_norm_eps=float(num("attention.layer_norm_rms_epsilon")), vocab_size=vocab,
        rope_theta=float(num("rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
        max_position_embeddings=int(num("context_length", 2048)), tie_word_embeddings=not has_output,
    )


def _mlx_name(name: str, source: str) -> str:
    if match := BLOCK_RE.match(name):
        layer, part, kind = match.groups()
        if part in IN_BLOCK:
            return f"model.layers.{layer}.{IN_BLOCK[part]}.{kind}"
    elif (match := TOP_RE.match(name)) and match.group(1) in TOP_LEVEL:
        return f"{TOP_LEVEL[match.group(1)]}.{match.group(2)}"
    raise ModelLoadError(f"unsupported tensor {name!r} in {source} (not a plain llama layout)")


def unpermute_rows(x: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation for RoPE (pairs interleaved -> halves).

    Rows are output features; quantization groups run along columns, so permuting the
    rows of weight, scales and biases alike is exact for quantized tensors too."""
    rows = x.shape[0]
    return x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _bits(weight: mx.array, scales: mx.array) -> int:
    return weight.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)


def _convert(raw: dict, args: ModelArgs, dense: bool, source: str) -> tuple[dict, dict]:
    """Rename, unpermute Q/K, and (dense) dequantize to float32; returns (weights, bits)."""
    weights = {}
    for name, value in raw.items():
        key = _mlx_name(name, source)
        if ".q_proj." in key or ".k_proj." in key:
            heads = args.num_attention_heads if ".q_proj." in key else args.num_key_value_heads
            value = unpermute_rows(value, heads)
        weights[key] = value
    bits = {}
    for key in [k for k in weights if k.endswith(".scales")]:
        base = key[: -len(".scales")]
        bits[base] = _bits(weights[f"{base}.weight"], weights[key])
        if dense:
            # float32 scales make dequantize emit float32 directly (a float16 pass costs ~1.5 s).
            scales = weights.pop(key).astype(mx.float32)
            biases = weights.pop(f"{base}.biases").astype(mx.float32)
            weights[f"{base}.weight"] = mx.dequantize(
                weights[f"{base}.weight"], scales, biases, group_size=GROUP_SIZE, bits=bits[base]
            )
    if dense:
        half = (mx.float16, mx.bfloat16)
        weights = {k: v.astype(mx.float32) if v.dtype in half else v for k, v in weights.items()}
    return weights, ({} if dense else bits)


def _build(args: ModelArgs, weights: dict, bits: dict, source: str) -> nn.Module:
    model = Model(args)
    if bits:
        nn.quantize(
            model,
            class_predicate=lambda p, m: {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits else False,
        )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"GGUF tensors do not fit a llama model in {source}: {exc}") from None
    mx.eval(model.parameters())
    return model


def _read(path: Path) -> tuple[dict, dict]:
    try:
        return mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        msg = str(exc)
        if "tensor_to_f16" in msg or "unexpected type" in msg:
            raise ModelLoadError(
                f"unsupported GGUF tensor type in {path}: {msg} (supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0)"
            ) from None
        raise ModelLoadError(f"not a readable GGUF file: {path} ({msg})") from None


def _param_count(weights: dict, bits: dict) -> int:
    total = 0
    for key, value in weights.items():
        base = key.rsplit(".", 1)[0]
        if key.endswith((".scales", ".biases")):
            continue
        total += value.size * 32 // bits[base] if base in bits else value.size
    return total


def _size_label(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{round(n / 1e6)}M" if n >= 1e6 else f"{round(n / 1e3)}K"


def load_gguf(path: Path, dense: bool, on_progress: Optional[Callable[[str], None]] = None) -> GGUFModel:
    """Load a llama GGUF; `dense` dequantizes everything to float32 (the CPU fast path)."""
    progress = on_progress or (lambda _msg: None)
    source = path.name
    progress(f"reading {source}")
    raw, meta = _read(path)
    args = model_args(meta, has_output="output.weight" in raw, source=source)
    tokenizer = gguf_tokenizer(meta, source)
    progress("dequantizing to float32" if dense else "building quantized model")
    weights, bits = _convert(raw, args, dense, source)
    model = _build(args, weights, bits, source)
    file_type = FILE_TYPES.get(int(meta["general.file_type"].item()), "?") if "general.file_type" in meta else "?"
    if bits:
        kind = "quantized"
    elif dense:
        kind = "dense-float32"
    else:
        kind = str(weights["model.embed_tokens.weight"].dtype).removeprefix("mlx.core.")
    size = _size_label(_param_count(weights, bits))
    return GGUFModel(model, tokenizer, args.max_position_embeddings, f"llama {size}, gguf {file_type}", kind)
