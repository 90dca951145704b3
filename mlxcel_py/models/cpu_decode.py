"""Batched decode steps for dense float32 llama models on the CPU, outside MLX.

A decode step runs 30 layers x 7 small products plus the LM head; through MLX each one is an
OpenBLAS GEMM that packs (copies) the whole weight, and the graph costs ~2 ms a step to build.
Here each layer is one numba call (`cpu_decode_kernels.layer_step`) over numpy views of the
model's own weights (q/k/v and gate/up fused once at install, no copies kept), streaming each
weight once, and writing the new keys/values in place into the runner's mlx-lm
`BatchKVCache`, whose bookkeeping (offsets, left padding) is advanced exactly as
`update_and_fetch` advances it. Prefill, and every other device or model, is mlx-lm's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numba
import numpy as np
from mlx_lm.models.cache import BatchKVCache

from .cpu_decode_kernels import layer_step, linear, rms_norm, warm_up

log = logging.getLogger("mlxcel_py.models")

KV_STEP = 256  # KV capacity grows in these steps, as BatchKVCache.step


@dataclass(frozen=True, slots=True)
class _Layer:
    norm1: np.ndarray
    qkv: np.ndarray  # (q + k + v rows, hidden): one product for all three
    o: np.ndarray
    norm2: np.ndarray
    gate_up: np.ndarray  # (2 * ffn, hidden)
    down: np.ndarray


def supported(model) -> Optional[str]:
    """None when `model` can decode here, else why not (it then decodes through mlx-lm)."""
    from mlx_lm.models import llama

    if type(model) is not llama.Model:
        return f"model class {type(model).__module__}.{type(model).__name__}"
    args = model.args
    if args.attention_bias or args.mlp_bias:
        return "biases"
    if any(t != "full_attention" for t in args.layer_types):
        return "sliding-window layers"
    attn = model.model.layers[0].self_attn
    # FactorRoPE: the GGUF loader's llama3 rope (rope_freqs), rotate-half like the others
    if type(attn.rope).__name__ not in ("RoPE", "Llama3RoPE", "FactorRoPE") or getattr(attn.rope, "traditional", False):
        return f"rope {type(attn.rope).__name__}"
    if getattr(attn.rope, "dims", None) != attn.head_dim:
        return "partial rope"
    for _, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and type(module) not in (nn.Linear, nn.Embedding):
            return f"{type(module).__name__} layers"
        weight = getattr(module, "weight", None)
        if isinstance(weight, mx.array) and weight.dtype != mx.float32:
            return f"{weight.dtype} weights"
    return None


def _fuse(modules: Sequence[nn.Linear]) -> np.ndarray:
    """One (sum of rows, K) weight; each module's weight becomes a row slice of it (no copy kept)."""
    fused = mx.concatenate([m.weight for m in modules], axis=0)
    mx.eval(fused)
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = fused[start : start + rows]
        start += rows
    mx.eval([m.weight for m in modules])
    return np.asarray(fused)


class _Rope:
    """cos/sin by position, taken from the model's own rope module (so they match it bit for bit)."""

    def __init__(self, rope: Callable, head_dim: int):
        self._rope, self._half, self._len = rope, head_dim // 2, 0
        self.cos = self.sin = np.zeros((0, self._half), np.float32)

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, head_dim / 2) cos and sin for one position per row."""
        need = int(positions.max()) + 1
        if need > self._len:
            self._grow(max(need, 2 * self._len, 512))
        return self.cos[positions], self.sin[positions]

    def _grow(self, length: int) -> None:
        unit = mx.concatenate([mx.ones((self._half,)), mx.zeros((self._half,))])
        table = np.array(self._rope(mx.broadcast_to(unit, (1, 1, length, 2 * self._half)), offset=0)[0, 0])
        self.cos, self.sin, self._len = table[:, : self._half].copy(), table[:, self._half :].copy(), length


class CpuDecoder:
    """`decoder(tokens, caches)` -> (B, vocab) float32 logits, caches advanced by one position."""

    def __init__(self, model, threads: int = 1):
        # numba's pool holds NUMBA_NUM_THREADS (every core by default); the count is per calling thread.
        self.threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
        args, inner = model.args, model.model
        attn = inner.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
        self.scale, self.eps = float(attn.scale), float(args.rms_norm_eps)
        self._rope = _Rope(attn.rope, self.head_dim)
        self._embed_rows, self._head = self._load_embedding(model)
        self._norm = np.asarray(inner.norm.weight)
        self._layers = self._load_layers(model)
        self._kv = _KvWriter()

    def _load_embedding(self, model) -> tuple[Callable[[np.ndarray], np.ndarray], Optional[np.ndarray]]:
        """(token ids -> embedding rows, the LM head's float32 weight)."""
        embed = np.asarray(model.model.embed_tokens.weight)
        return embed.__getitem__, embed if model.args.tie_word_embeddings else np.asarray(model.lm_head.weight)

    def _load_layers(self, model) -> list:
        return [self._layer(layer) for layer in model.model.layers]

    def _step(self, h, w, keys, values, idx, left_pad, cos, sin, width: int = 1) -> None:
        layer_step(h, w.norm1, w.qkv, w.o, w.norm2, w.gate_up, w.down, keys, values, idx, left_pad,
                   cos, sin, self.heads, self.scale, self.eps, width)

    def _lm_head(self, x: np.ndarray) -> np.ndarray:
        return linear(x, self._head)

    @staticmethod
    def _layer(layer) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        return _Layer(
            np.asarray(layer.input_layernorm.weight), _fuse([a.q_proj, a.k_proj, a.v_proj]),
            np.asarray(a.o_proj.weight), np.asarray(layer.post_attention_layernorm.weight),
            _fuse([m.gate_proj, m.up_proj]), np.asarray(m.down_proj.weight),
        )

    def __call__(self, tokens: Sequence[int], caches: list) -> mx.array:
        if numba.get_num_threads() != self.threads:  # set once on the engine thread, which calls this
            numba.set_num_threads(self.threads)
        positions, left_pad, views = self._kv.begin(caches, len(tokens))
        cos, sin = self._rope.at(positions)
        h = self._embed_rows(np.asarray(tokens))
        idx = caches[0]._idx
        for w, (keys, values) in zip(self._layers, views):
            self._step(h, w, keys, values, idx, left_pad, cos, sin)
        self._kv.end(caches, positions)
        return mx.array(self._lm_head(rms_norm(h, self._norm, self.eps)))

    def verify(self, rows: Sequence[Sequence[int]], caches: list) -> mx.array:
        """(B, W, vocab) logits of W new tokens per row (a draft's verify forward, causal within
        the span), caches advanced by W positions; the caller trims what it rejects."""
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        width = len(rows[0])
        positions, left_pad, views = self._kv.begin(caches, len(rows), width)
        cos, sin = self._rope.at((positions[:, None] + np.arange(width)).reshape(-1))
        h = self._embed_rows(np.asarray(rows).reshape(-1))
        idx = caches[0]._idx
        for w, (keys, values) in zip(self._layers, views):
            self._step(h, w, keys, values, idx, left_pad, cos, sin, width)
        self._kv.end(caches, positions, width)
        logits = self._lm_head(rms_norm(h, self._norm, self.eps))
        return mx.array(logits.reshape(len(rows), width, -1))


class _KvWriter:
    """Hands out each layer's BatchKVCache buffers as writable numpy views, and afterwards
    advances the caches' bookkeeping exactly as `update_and_fetch` would.

    Writing in place needs buffers nobody else holds: a buffer the cache got from mlx-lm (a
    merge, extend, filter or its own growth) is copied once into a fresh one with spare
    capacity, and remembered on the cache; later steps write into it directly."""

    def begin(self, caches: list, rows: int, width: int = 1) -> tuple[np.ndarray, np.ndarray, list]:
        """(positions (B,), left padding (B,), per-layer (keys, values) views) for this step."""
        first = caches[0]
        idx = first._idx
        if any(type(c) is not BatchKVCache or c._idx != idx or c.keys is None for c in caches):
            raise RuntimeError("decode needs one filled BatchKVCache per layer, all at one position")
        positions = np.asarray(first.offset).astype(np.int64)
        if positions.shape[0] != rows:
            raise RuntimeError(f"KV cache has {positions.shape[0]} rows, the step {rows}")
        left_pad = np.asarray(first.left_padding).astype(np.int64)
        return positions, left_pad, [self._own(c, idx, width) for c in caches]

    @staticmethod
    def _own(cache: BatchKVCache, idx: int, width: int = 1) -> tuple[np.ndarray, np.ndarray]:
        held = getattr(cache, "_mlxcel_kv", None)
        # Held views are current only if nothing else wrote past our last step (mlx-lm's forward
        # may have moved the buffer); a trim back (rejected draft positions) keeps them.
        if (held is not None and held[0] is cache.keys and held[1] is cache.values
                and held[2].shape[2] >= idx + width and getattr(cache, "_mlxcel_idx", -1) >= idx):
            return held[2], held[3]
        arrays = []
        for old in (cache.keys, cache.values):
            rows, heads, _, dim = old.shape
            new = mx.zeros((rows, heads, ((idx + width - 1) // KV_STEP + 1) * KV_STEP, dim), old.dtype)
            view = np.asarray(new)  # evaluates `new`: a fresh buffer only this cache holds
            view[:, :, :idx] = np.asarray(old[:, :, :idx])
            arrays.append((new, view))
        (cache.keys, kview), (cache.values, vview) = arrays
        cache._mlxcel_kv = (cache.keys, cache.values, kview, vview)
        return kview, vview

    @staticmethod
    def end(caches: list, positions: np.ndarray, width: int = 1) -> None:
        offset = mx.array((positions + width).astype(np.int32))
        for cache in caches:
            cache._idx += width
            cache.offset = offset
            cache._mlxcel_idx = cache._idx


def decoder_for(model, threads: int = 1) -> Optional[CpuDecoder]:
    """A CpuDecoder (products split over `threads` threads) when the model is supported; else None.
    The loader hands it to the runner in `LoadedModel.cpu_decode`."""
    why = supported(model)
    if why is not None:
        log.info("decode stays in mlx-lm: %s", why)
        return None
    warm_up()
    return CpuDecoder(model, threads)
