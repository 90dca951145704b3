"""mlx-lm's affine-quantized layers as block layers on the CPU (`--cpu-weights native`): the
QuantizedLinear / QuantizedEmbedding of an mlx-community directory repacked once into blocks
(quant/affine.py) and held by gguf_blocks' BlockLinear / BlockEmbedding, so prefill multiplies
dequantized tiles and the native decode step reads the blocks, with no float32 copy."""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten

from .gguf_blocks import BlockEmbedding, BlockLinear, fuse_layers
from .cpu.quant import affine

log = logging.getLogger("mlxcel_py.models")


def _host(array: mx.array) -> np.ndarray:
    return np.asarray(array.astype(mx.float32) if array.dtype != mx.uint32 else array)


def _block_layer(module: nn.Module, name: str):
    """A BlockLinear / BlockEmbedding for a quantized layer, or None when its weights do not repack."""
    if getattr(module, "mode", "affine") != "affine":
        return None
    blocks = affine.to_blocks(_host(module.weight), _host(module.scales), _host(module.biases),
                              module.bits, module.group_size, name)
    if blocks is None:
        return None
    if isinstance(module, nn.QuantizedEmbedding):
        return BlockEmbedding(blocks)
    layer = BlockLinear(blocks, bias="bias" in module)
    if "bias" in module:
        layer.bias = module.bias.astype(mx.float32)
    return layer


def install_affine_blocks(model: nn.Module) -> tuple[int, int]:
    """Replace every affine QuantizedLinear / QuantizedEmbedding of `model` that repacks exactly by a
    block layer (one at a time, so the host copy of one layer is the peak); q/k/v and gate/up fused as
    for GGUF. Returns (layers repacked, quantized layers left as they were)."""
    repacked, left = 0, 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        layer = _block_layer(module, name)
        if layer is None:
            left += 1
            continue
        model.update_modules(tree_unflatten([(name, layer)]))
        repacked += 1
    mx.clear_cache()
    fuse_layers(model)
    log.info("mlx affine weights: %d layers as blocks, %d left to float32", repacked, left)
    return repacked, left
