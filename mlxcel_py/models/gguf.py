"""Build an mlx-lm model from a GGUF file, in memory (architectures in `gguf_arch`)."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf.constants import LlamaFileType

from .gguf_tensors import GROUP_SIZE, check_supported, native, quantized_or_none
from .gguf_tensors import dense as dense_tensor
from .gguf_blocks import fuse_layers, install, is_block_type, release, repack_block_layers, unpermute_block_rows
from .cpu.quant.blocks import QuantWeight, make
from .gguf_arch import SIDE_TENSORS, Arch, Meta, arch_for
from .gguf_file import GGUFFile, TensorInfo, read_gguf
from .ranking import HEAD_TENSORS, RankHead, rank_head
from .tokenizer import TokenizerInfo, gguf_tokenizer
from ..errors import ModelLoadError

log = logging.getLogger("mlxcel_py.models")


@dataclass(frozen=True, slots=True)
class GGUFModel:
    model: Any
    tokenizer: TokenizerInfo
    context_length: int
    description: str  # "llama 135M, gguf Q4_1"
    weights: str
    pooling: Optional[str] = None  # `{arch}.pooling_type`, when the file says (an embedding model)
    rank_head: Optional[RankHead] = None  # a reranker's classifier (pooling_type rank)


def unpermute_rows(x: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation for RoPE (pairs interleaved -> halves).

    Rows are output features; quantization groups run along columns, so permuting the
    rows of weight, scales and biases alike is exact for quantized tensors too."""
    rows = x.shape[0]
    return x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def model_args(gguf: GGUFFile, arch: Arch):
    """The mlx-lm ModelArgs for this file (the config dict mlx-lm would read from config.json)."""
    config = arch.config(Meta(gguf.metadata, arch.name, gguf.path.name, gguf.tensors))
    module = importlib.import_module(arch.module or f"mlx_lm.models.{arch.model_type}")
    return module, module.ModelArgs.from_dict({"model_type": arch.model_type, **config})


def _tensor(info: TensorInfo, key: str, dense: bool, arch: Arch, args) -> dict[str, mx.array]:
    """One GGUF tensor as MLX arrays under `key` (.weight, or .weight/.scales/.biases)."""
    quant = None if dense else quantized_or_none(info)
    if quant is None:
        out = {key: dense_tensor(info) if dense else native(info)}
    else:
        base = key.rsplit(".", 1)[0]
        out = {key: quant.weight, f"{base}.scales": quant.scales, f"{base}.biases": quant.biases}
    if arch.permuted_qk and (".q_proj." in key or ".k_proj." in key):
        heads = args.num_attention_heads if ".q_proj." in key else args.num_key_value_heads
        out = {k: unpermute_rows(v, heads) for k, v in out.items()}
    if arch.norm_offset and key.endswith("norm.weight"):
        out[key] = out[key] - arch.norm_offset
    return out


def _convert(gguf: GGUFFile, arch: Arch, args, dense: bool, blocks: bool = False) -> tuple[dict, dict, dict]:
    """Every weight tensor renamed and converted; returns (weights, bits per quantized module, and, when
    `blocks`, the 2-D block-type tensors left as they are, by mlx-lm name)."""
    source = gguf.path.name
    weights: dict[str, mx.array] = {}
    bits: dict[str, int] = {}
    held: dict[str, TensorInfo] = {}
    for name, info in gguf.tensors.items():
        if name in SIDE_TENSORS:
            continue
        check_supported(info, source)
        key = arch.mlx_name(name, source)
        if blocks and is_block_type(info.qtype) and len(info.shape) == 2 and key.endswith(".weight"):
            held[key] = info
            continue
        converted = _tensor(info, key, dense, arch, args)
        if len(converted) == 3:
            base = key.rsplit(".", 1)[0]
            bits[base] = converted[key].shape[-1] * 32 // (converted[f"{base}.scales"].shape[-1] * GROUP_SIZE)
        weights.update(converted)
        mx.eval(list(converted.values()))  # free each numpy intermediate as we go
    return weights, bits, held


def _block_weight(info: TensorInfo, key: str, arch: Arch, args) -> QuantWeight:
    """The tensor's blocks (a view of the mapped file; Q/K rows unpermuted into a copy, whose source pages
    then leave the mapping)."""
    raw = np.asarray(info.data).reshape(info.shape[0], -1)
    if arch.permuted_qk and (".q_proj." in key or ".k_proj." in key):
        raw = unpermute_block_rows(raw, args.num_attention_heads if ".q_proj." in key else args.num_key_value_heads)
        release(info.data)
    return make(info.qtype, info.shape, raw, key)


def _split_held(model, weights: dict, held: dict, arch: Arch, args) -> dict:
    """mlx-lm's sanitize over both kinds of tensor; the held ones become block layers in `model` (or
    float32 where the module is no Linear/Embedding). Returns the tensors left to load_weights."""
    placeholder = mx.zeros((1,))
    weights = {**weights, **dict.fromkeys(held, placeholder)}
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    kept = {k: v for k, v in weights.items() if v is not placeholder}
    for key in (k for k, v in weights.items() if v is placeholder):
        if not install(model, key.rsplit(".", 1)[0], _block_weight(held[key], key, arch, args)):
            kept.update(_tensor(held[key], key, True, arch, args))
    return kept


def _build(module, args, weights: dict, bits: dict, source: str, held: Optional[dict] = None,
           arch: Optional[Arch] = None) -> nn.Module:
    model = module.Model(args)
    if held:
        weights = _split_held(model, weights, held, arch, args)
    elif hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    if bits:
        nn.quantize(
            model,
            class_predicate=lambda p, m: {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits else False,
        )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"GGUF tensors do not fit a {args.model_type} model in {source}: {exc}") from None
    if held:
        from .cpu.arch import llama_like  # the CPU kernels load numba: not at import
        from .cpu.quant.kquant_r8 import repacked_types

        fuse_layers(model, keep=repacked_types(model))
        # the fused step repacks the mapped ones itself (fused_step._repacked), not the Q/K rows' copies
        repack_block_layers(model, copies=llama_like(model))
    mx.eval(model.parameters())
    return model


def _file_type(metadata: dict) -> str:
    try:
        return LlamaFileType(int(metadata["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError):
        return "?"


def _param_count(weights: dict, bits: dict, held: dict) -> int:
    total = sum(int(np.prod(info.shape)) for info in held.values())
    for key, value in weights.items():
        base = key.rsplit(".", 1)[0]
        if key.endswith((".scales", ".biases")) and base in bits:
            continue
        total += value.size * 32 // bits[base] if base in bits and key.endswith(".weight") else value.size
    return total


def _size_label(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{round(n / 1e6)}M" if n >= 1e6 else f"{round(n / 1e3)}K"


# llama.cpp's enum llama_pooling_type (-1 unspecified; 4, rank, is a reranker's: models/ranking.py).
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def load_gguf(path: Path, dense: bool, on_progress: Optional[Callable[[str], None]] = None,
              blocks: bool = False) -> GGUFModel:
    """Load a GGUF; `dense` dequantizes everything to float32 (the CPU fast path); `blocks` (with dense)
    keeps each quantized matrix as the file's blocks instead (gguf_blocks.py: no float32 copy)."""
    from .gguf_fixups import apply_fixups

    progress = on_progress or (lambda _msg: None)
    progress(f"reading {path.name}")
    gguf = read_gguf(path)
    arch = arch_for(gguf.metadata, path.name)
    module, args = model_args(gguf, arch)
    tokenizer = gguf_tokenizer(gguf.metadata, path.name)
    progress("keeping the GGUF blocks" if blocks else "dequantizing to float32" if dense else "building quantized model")
    weights, bits, held = _convert(gguf, arch, args, dense, blocks)
    size = _size_label(_param_count(weights, bits, held))
    model = _build(module, args, weights, bits, path.name, held, arch)
    apply_fixups(model, gguf, arch, args)
    if bits:
        kind = "quantized"
    elif held:
        kind = "gguf-blocks"
    elif dense:
        kind = "dense-float32"
    else:
        kind = str(weights["model.embed_tokens.weight"].dtype).removeprefix("mlx.core.")
    description = f"{arch.name} {size}, gguf {_file_type(gguf.metadata)}"
    pooling = POOLING_TYPES.get(gguf.metadata.get(f"{arch.name}.pooling_type", -1))
    head_tensors = {name: np.array(dense_tensor(info)) for name, info in gguf.tensors.items() if name in HEAD_TENSORS}
    head = rank_head(gguf.metadata, arch.name, head_tensors, path.name)
    return GGUFModel(model, tokenizer, args.max_position_embeddings, description, kind, pooling, head)
