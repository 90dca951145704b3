"""The CPU decode step over a GGUF file's own quantized blocks (`--cpu-weights native`).

Same step as `decoder.CpuDecoder` (its KV writer, RoPE table and numba norm/attention kernels),
but the products (fused q/k/v, o, fused gate/up, down, the LM head) multiply `QuantWeight` records
through `quant.products.linear` instead of float32 views. Over a model loaded with block layers
(gguf_blocks.py, the default) the records are the layers' own (fused q/k/v, gate/up as they fused);
over a float32 model (tests) the file is read again and a matrix whose type has no fast kernel keeps
the model's float32 weight."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .decoder import CpuDecoder, supported
from .arch import GELU_TANH, Norms, layer_norms, projection_keys, projections
from .arch_kernels import activation, attention_part, residual, warm_up as warm_up_arch
from ..gguf_arch import SIDE_TENSORS
from ..gguf_blocks import BlockEmbedding, BlockLinear, has_blocks, unpermute_block_rows
from .decode_kernels import attend, linear as f32_linear, rms_norm, rope, silu_mul, warm_up, write_kv
from .quant import products, r8_layers, vector
from .quant.blocks import QuantWeight, make

log = logging.getLogger("mlxcel_py.models")

Part = Union[QuantWeight, np.ndarray]  # a block weight, or the float32 fallback


def _fast(info) -> bool:
    return int(info.qtype) in vector.VECTOR_TYPES


@dataclass(frozen=True, slots=True)
class Product:
    """y = x @ W.T over parts whose outputs are concatenated (one part when the types allowed fusing)."""

    parts: tuple[Part, ...]

    def __call__(self, x: np.ndarray, threads: int) -> np.ndarray:
        outs = [products.linear(x, p, threads=threads) if isinstance(p, QuantWeight) else
                r8_layers.linear(x, p, threads=threads) if isinstance(p, r8_layers.R8Weight) else f32_linear(x, p)
                for p in self.parts]
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)

    @property
    def quantized(self) -> int:
        return sum(isinstance(p, (QuantWeight, r8_layers.R8Weight)) for p in self.parts)


@dataclass(frozen=True, slots=True)
class _Layer:
    norm1: np.ndarray
    qkv: Product
    o: Product
    norm2: np.ndarray
    gate_up: Product
    down: Product
    norms: Optional[Norms] = None  # as decoder._Layer: the parts beyond llama's; None: a llama layer
    window: int = 0
    rope: int = 0


class _Blocks:
    """The GGUF tensors by mlx-lm name, made into Products (fused where the types match)."""

    def __init__(self, gguf, arch, args):
        source = gguf.path.name
        self._infos = {arch.mlx_name(n, source): i for n, i in gguf.tensors.items()
                       if n.endswith(".weight") and n not in SIDE_TENSORS}
        self._permuted, self._args = arch.permuted_qk, args

    def _raw(self, key: str) -> np.ndarray:
        info = self._infos[key]
        raw = np.asarray(info.data).reshape(info.shape[0], -1)
        if self._permuted and (".q_proj." in key or ".k_proj." in key):
            heads = self._args.num_attention_heads if ".q_proj." in key else self._args.num_key_value_heads
            raw = unpermute_block_rows(raw, heads)
        return raw

    def product(self, modules: Sequence, keys: Sequence[str]) -> Product:
        """One Product for `keys` (mlx-lm weight names); `modules` give the float32 fallback."""
        infos = [self._infos.get(k) for k in keys]
        if all(i is not None and _fast(i) for i in infos) and len({i.qtype for i in infos}) == 1:
            raw = np.concatenate([self._raw(k) for k in keys]) if len(keys) > 1 else self._raw(keys[0])
            return Product((make(infos[0].qtype, (raw.shape[0], infos[0].shape[-1]), raw, keys[0]),))
        parts = []
        for m, k, i in zip(modules, keys, infos):
            ok = i is not None and _fast(i)
            parts.append(make(i.qtype, i.shape, self._raw(k), k) if ok else np.asarray(m.weight))
        return Product(tuple(parts))


class _ModuleBlocks:
    """The model's own block layers (loaded with gguf_blocks: no file read again), made into Products;
    a fused q/k/v or gate/up multiplies as the one array its layers slice."""

    @staticmethod
    def product(modules: Sequence, keys: Sequence[str]) -> Product:
        whole = getattr(modules[0], "fused", None)
        if len(modules) > 1 and whole is not None and all(getattr(m, "fused", None) is whole for m in modules) \
                and sum(m.blocks.shape[0] for m in modules) == whole.shape[0]:
            return Product((whole,))
        return Product(tuple((m.r8 or m.blocks) if isinstance(m, BlockLinear) else
                             m.blocks if isinstance(m, BlockEmbedding) else np.asarray(m.weight) for m in modules))


class NativeDecoder(CpuDecoder):
    """CpuDecoder whose products read the GGUF file's blocks (see the module docstring)."""

    def __init__(self, model, blocks: Union[_Blocks, _ModuleBlocks], threads: int = 1):
        self._blocks = blocks
        super().__init__(model, threads)
        head_key = "model.embed_tokens.weight" if model.args.tie_word_embeddings else "lm_head.weight"
        head_module = model.model.embed_tokens if model.args.tie_word_embeddings else model.lm_head
        self._head_product = blocks.product([head_module], [head_key])
        self._blocks = None  # the Products hold what they need

    def _load_embedding(self, model):
        embed = model.model.embed_tokens
        return (embed.rows, None) if isinstance(embed, BlockEmbedding) else super()._load_embedding(model)

    def _load_layers(self, model) -> list:
        out, b, spec = [], self._blocks, self.spec
        for i, layer in enumerate(model.model.layers):
            norm1, norm2, norms = layer_norms(layer, spec)
            qkv, o, gate_up, down = (b.product(m, k) for m, k in zip(projections(layer), projection_keys(layer, i)))
            out.append(_Layer(norm1, qkv, o, norm2, gate_up, down, None if spec.plain else norms,
                              spec.windows[i], spec.rope_of[i]))
        return out

    def _step(self, h, w, keys, values, idx, left_pad, cos, sin, width: int = 1) -> None:
        t, dim, n, eps = self.threads, self.head_dim, w.norms, self.eps
        qkv = w.qkv(rms_norm(h, w.norm1, eps), t)
        if n is None:  # a llama layer: today's sequence
            rope(qkv, cos, sin, self.heads + self.kv_heads, dim)
            write_kv(qkv, keys, values, idx, self.heads, width)
            h += w.o(attend(qkv, keys, values, idx + 1, left_pad, self.heads, self.scale, width), t)
            h += w.down(silu_mul(w.gate_up(rms_norm(h, w.norm2, eps), t)), t)
            return
        att = attention_part(qkv, n.qkv_bias, n.q_norm, n.k_norm, keys, values, idx, left_pad, cos, sin,
                             self.heads, self.scale, eps, width, w.window)
        residual(h, w.o(att, t), n.post_attn, eps)
        gate_up = w.gate_up(rms_norm(h, w.norm2, eps), t)
        residual(h, w.down(activation(gate_up, self.spec.activation == GELU_TANH), t), n.post_ffn, eps)

    def _lm_head(self, x: np.ndarray) -> np.ndarray:
        return self._head_product(x, self.threads)

    def counts(self) -> tuple[int, int]:
        """(products over blocks, float32 fallbacks), the LM head included."""
        prods = [p for l in self._layers for p in (l.qkv, l.o, l.gate_up, l.down)] + [self._head_product]
        quantized = sum(p.quantized for p in prods)
        return quantized, sum(len(p.parts) for p in prods) - quantized


def native_decoder_for(model, path: Path, threads: int = 1, cls: type = NativeDecoder) -> Optional[CpuDecoder]:
    """A NativeDecoder (or its subclass `cls`) over the GGUF at `path` for a supported model; the
    float32 CpuDecoder when no matrix has a block kernel (an F32/F16 file); None when unsupported
    (decode stays in mlx-lm). The loader goes through fused_step.decoder_for."""
    why = supported(model)
    if why is not None:
        log.info("decode stays in mlx-lm: %s", why)
        return None
    warm_up()
    warm_up_arch()
    decoder = cls(model, _ModuleBlocks() if has_blocks(model) else blocks_of(model, path), threads)
    quantized, fallback = decoder.counts()
    if not quantized:
        log.info("native CPU decode: no block weights in %s, decoding over float32", path.name)
        return CpuDecoder(model, threads)
    log.info("native CPU decode: %d products over GGUF blocks, %d float32", quantized, fallback)
    return decoder


def blocks_of(model, path: Path) -> _Blocks:
    """The GGUF's tensors at `path` by mlx-lm name, for NativeDecoder."""
    from ..gguf import model_args
    from ..gguf_arch import arch_for
    from ..gguf_file import read_gguf

    gguf = read_gguf(path)
    arch = arch_for(gguf.metadata, path.name)
    return _Blocks(gguf, arch, model_args(gguf, arch)[1])
