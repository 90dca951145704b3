"""GGUF block weights as mlx-lm layers on the CPU (`--cpu-weights native`): no float32 copy of the model.

`BlockLinear` and `BlockEmbedding` stand where mlx-lm has nn.Linear / nn.Embedding and hold a
`quant.blocks.QuantWeight` (a view of the memory-mapped file, or of one fused copy) instead of a
float32 weight, and multiply one dequantized tile at a time with BLAS (quant/prefill.py) whatever
the row count (the native decode step of a llama, cpu_decode_native.py, reads the same blocks with
its own kernels).
q/k/v and gate/up of one type are fused once into one in-memory array whose row slices the layers
hold (the native decode step multiplies the whole, docs/CPU_DECODE.md), and the file pages they
were copied from leave our mapping (madvise), so resident memory stays about the file's size."""

from __future__ import annotations

import mmap
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .cpu.quant import prefill, products
from .cpu.quant.blocks import BLOCK_TYPES, QuantWeight

HALF_TYPES = (T.F16, T.BF16)


def _multiply(x: mx.array, w: QuantWeight, bias: Optional[mx.array]) -> mx.array:
    """x (..., K) @ W.T (+ bias) over the blocks, one dequantized tile at a time through BLAS (any row
    count: a short prefill piece then equals the f32 path's bit for bit, where the decode kernels'
    rounding changed a small model's greedy answer), as a float32 MLX array."""
    mx.eval(x)
    a = np.asarray(x if x.dtype == mx.float32 else x.astype(mx.float32))
    out = prefill.matmul(a.reshape(-1, w.shape[1]), w)
    y = mx.array(out.reshape(*a.shape[:-1], w.shape[0]))
    return y if bias is None else y + bias


def _multiply_r8(x: mx.array, w, bias: Optional[mx.array]) -> mx.array:
    """_multiply over repacked rows: int8 activations, quant/r8_layers.linear."""
    from .cpu.quant import r8_layers  # the CPU kernels load numba: not at import

    mx.eval(x)
    a = np.asarray(x if x.dtype == mx.float32 else x.astype(mx.float32))
    y = mx.array(r8_layers.linear(a.reshape(-1, w.shape[1]), w).reshape(*a.shape[:-1], w.shape[0]))
    return y if bias is None else y + bias


class BlockLinear(nn.Module):
    """nn.Linear over a QuantWeight; `fused` is the q/k/v or gate/up whole this one is a row slice of;
    `r8` its rows repacked eight at a time (quant/r8_layers.py), which its products then read."""

    def __init__(self, blocks: QuantWeight, bias: bool = False):
        super().__init__()
        self.blocks: Optional[QuantWeight] = blocks  # None once r8 replaced an in-memory copy (repack_block_layers)
        self.fused: Optional[QuantWeight] = None
        self.r8 = None  # Optional[r8_layers.R8Weight]
        if bias:
            self.bias = mx.zeros((blocks.shape[0],))

    def __call__(self, x: mx.array) -> mx.array:
        if self.r8 is not None:
            return _multiply_r8(x, self.r8, self.get("bias"))
        return _multiply(x, self.blocks, self.get("bias"))


class BlockEmbedding(nn.Module):
    """nn.Embedding over a QuantWeight: looked-up rows dequantized on the fly; `as_linear` is a tied head."""

    def __init__(self, blocks: QuantWeight):
        super().__init__()
        self.blocks: QuantWeight = blocks

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 (len(ids), dims): the embedding rows of `ids` (a 1-D integer array)."""
        out = np.empty((ids.shape[0], self.blocks.shape[1]), np.float32)
        products.dequantize_serial(self.blocks.blocks[ids], self.blocks.qtype, out)
        return out

    def __call__(self, ids: mx.array) -> mx.array:
        mx.eval(ids)
        idx = np.asarray(ids).astype(np.int64)
        return mx.array(self.rows(idx.reshape(-1)).reshape(*idx.shape, -1))

    def as_linear(self, x: mx.array) -> mx.array:
        return _multiply(x, self.blocks, None)


def is_block_type(qtype) -> bool:
    """A type held as its blocks under `--cpu-weights native`: the quantized ones, and F16/BF16 (half the
    bytes of a float32 copy; quant/float_ir.py widens them in registers)."""
    return qtype in BLOCK_TYPES or qtype in HALF_TYPES


def unpermute_block_rows(raw: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation undone on rows of blocks (gguf.unpermute_rows; exact: blocks run
    along a row). A copy."""
    rows = raw.shape[0]
    return raw.reshape(heads, rows // heads // 2, 2, raw.shape[1]).swapaxes(1, 2).reshape(raw.shape)


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    *parts, last = path.split(".")
    node = model
    for part in parts:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node, last


def install(model: nn.Module, path: str, blocks: QuantWeight) -> bool:
    """Put a block layer at `path` (a module path) in place of its Linear/Embedding; False when it is neither."""
    parent, name = _parent(model, path)
    old = getattr(parent, name, None)
    if type(old) is nn.Linear and tuple(old.weight.shape) == blocks.shape:
        setattr(parent, name, BlockLinear(blocks, bias="bias" in old))
    elif type(old) is nn.Embedding and tuple(old.weight.shape) == blocks.shape:
        setattr(parent, name, BlockEmbedding(blocks))
    else:
        return False
    return True


def _mapped_root(view: np.ndarray) -> Optional[np.ndarray]:
    """The np.memmap-like array whose base is the mmap under `view`, or None for a copy."""
    root = view
    while root is not None and not isinstance(root.base, mmap.mmap):
        root = root.base if isinstance(root.base, np.ndarray) else None
    return root


def mapped(view: np.ndarray) -> bool:
    """Whether `view` lies in a mapped file whose pages `release` can drop (not an in-memory copy)."""
    return _mapped_root(view) is not None and hasattr(mmap, "MADV_DONTNEED")


def release(view: np.ndarray) -> None:
    """Drop the whole pages under `view` (a view of a read-only np.memmap) from this process's mapping:
    a tensor copied elsewhere (fused, unpermuted, repacked) would otherwise count twice in resident
    memory. A copy (no mapping underneath) is left alone."""
    root = _mapped_root(view)
    if root is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    mapped = root.ctypes.data - getattr(root, "offset", 0) % mmap.ALLOCATIONGRANULARITY  # the mmap's first byte
    start, page = view.ctypes.data - mapped, mmap.PAGESIZE
    first, end = -(-start // page) * page, (start + view.nbytes) // page * page
    if end > first:
        root.base.madvise(mmap.MADV_DONTNEED, first, end - first)


GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def fuse_layers(model: nn.Module, keep: tuple = ()) -> int:
    """Fuse q/k/v and gate/up of each layer where all are BlockLinear of one type, not one of `keep`
    (types the fused decode step repacks from the file's own pages: a fused copy would stay resident
    beside the repacked rows); returns how many groups."""
    fused = 0
    for layer in getattr(getattr(model, "model", None), "layers", []):
        for owner, names in GROUPS:
            parent = getattr(layer, owner, None)
            mods = [getattr(parent, n, None) for n in names]
            if not all(isinstance(m, BlockLinear) for m in mods) or len({m.blocks.qtype for m in mods}) != 1 \
                    or mods[0].blocks.qtype in keep:
                continue
            whole = np.concatenate([m.blocks.blocks for m in mods])
            for m in mods:
                release(m.blocks.blocks)
            group = QuantWeight(mods[0].blocks.qtype, (whole.shape[0], mods[0].blocks.shape[1]), whole)  # any block type
            start = 0
            for m in mods:
                rows = m.blocks.shape[0]
                m.blocks = QuantWeight(group.qtype, m.blocks.shape, group.blocks[start : start + rows])
                m.fused, start = group, start + rows
            fused += 1
    return fused


def repack_block_layers(model: nn.Module, copies: bool = False) -> int:
    """Give each BlockLinear of `model` in one of kquant_r8.R8_TYPES (Q4_K, Q6_K, Q5_0, Q8_0) that is a view
    of the mapped file its rows repacked eight at a time (`BlockLinear.r8`, quant/r8_layers.py) and drop
    the file's pages; returns how many. `copies`: instead the q_proj and k_proj layers whose blocks are an
    in-memory copy (llama's Q/K rows unpermuted, which the fused step would otherwise multiply in the file's
    layout), dropping the copy: every product of a layer with `r8` reads it (its forward, native.Product,
    the fused step's plan)."""
    from .cpu.quant.r8_layers import repacked  # the CPU kernels load numba: not at import

    count = 0
    for name, module in model.named_modules():
        if copies and not name.endswith((".q_proj", ".k_proj")):
            continue
        if isinstance(module, BlockLinear) and module.fused is None and mapped(module.blocks.blocks) != copies:
            r8 = repacked(module.blocks)
            if r8 is not None:
                module.r8 = r8
                if copies:
                    module.blocks = None
                else:
                    release(module.blocks.blocks)
                count += 1
    return count


def has_blocks(model: nn.Module) -> bool:
    """True when some layer of `model` is a block layer (loaded with `--cpu-weights native`)."""
    return any(isinstance(m, (BlockLinear, BlockEmbedding)) for _, m in model.named_modules())
