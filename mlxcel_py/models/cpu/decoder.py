"""Batched decode steps for dense float32 models on the CPU, outside MLX (llama, mistral, qwen2,
qwen3, gemma3, phi3: what differs between them is read into an `ArchSpec`, arch.py).

A decode step runs 30 layers x 7 small products plus the LM head; through MLX each one is an
OpenBLAS GEMM that packs (copies) the whole weight, and the graph costs ~2 ms a step to build.
Here each layer is one numba call (`decode_kernels.layer_step`) over numpy views of the
model's own weights (q/k/v and gate/up fused once at install, no copies kept), streaming each
weight once, and writing the new keys/values in place into the runner's mlx-lm
`BatchKVCache`, whose bookkeeping (offsets, left padding) is advanced exactly as
`update_and_fetch` advances it. Prefill, and every other device or model, is mlx-lm's.
A llama layer is one `layer_step` call; the others one `arch_layer_step` (arch_kernels.py).
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

from .arch import (GELU_TANH, Norms, RopeTable, final_norm, layer_norms, projections, spec_for,
                              supported)
from .arch_kernels import arch_layer_step, warm_up as warm_up_arch
from .decode_kernels import layer_step, linear, rms_norm, warm_up

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
    norms: Optional[Norms] = None  # the parts beyond llama's (arch.py); None: a llama layer
    window: int = 0  # sliding window (0: full attention)
    rope: int = 0  # index of this layer's rope table


def _fused(modules: Sequence[nn.Linear]) -> np.ndarray:
    """The float32 weight of one module as it is, of several fused (`_fuse`)."""
    return np.asarray(modules[0].weight) if len(modules) == 1 else _fuse(modules)


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


class CpuDecoder:
    """`decoder(tokens, caches)` -> (B, vocab) float32 logits, caches advanced by one position."""

    def __init__(self, model, threads: int = 1):
        # numba's pool holds NUMBA_NUM_THREADS (every core by default); the count is per calling thread.
        self.threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
        self.spec = spec = spec_for(model)
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.scale, self.eps = spec.scale, spec.eps
        self._ropes = [RopeTable(r, self.head_dim) for r in spec.ropes]
        self._embed_rows, self._head = self._load_embedding(model)
        self._norm = final_norm(model, spec)
        self._layers = self._load_layers(model)
        self._kv = _KvWriter()

    def _load_embedding(self, model) -> tuple[Callable[[np.ndarray], np.ndarray], Optional[np.ndarray]]:
        """(token ids -> embedding rows, the LM head's float32 weight)."""
        embed = np.asarray(model.model.embed_tokens.weight)
        return embed.__getitem__, embed if model.args.tie_word_embeddings else np.asarray(model.lm_head.weight)

    def _load_layers(self, model) -> list:
        return [self._layer(layer, i) for i, layer in enumerate(model.model.layers)]

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        h = self._embed_rows(ids)
        if self.spec.embed_scale != 1.0:  # gemma3: rows are a fresh gather, scaled as mlx-lm scales them
            h *= np.float32(self.spec.embed_scale)
        return h

    def _trig(self, positions: np.ndarray) -> list:
        return [r.at(positions) for r in self._ropes]

    def _step(self, h, w, keys, values, idx, left_pad, cos, sin, width: int = 1) -> None:
        if w.norms is None:
            layer_step(h, w.norm1, w.qkv, w.o, w.norm2, w.gate_up, w.down, keys, values, idx, left_pad,
                       cos, sin, self.heads, self.scale, self.eps, width)
            return
        n = w.norms
        arch_layer_step(h, w.norm1, w.qkv, n.qkv_bias, n.q_norm, n.k_norm, w.o, n.post_attn, w.norm2, w.gate_up,
                        w.down, n.post_ffn, keys, values, idx, left_pad, cos, sin, self.heads, self.scale,
                        self.eps, self.spec.activation == GELU_TANH, w.window, width)

    def _lm_head(self, x: np.ndarray) -> np.ndarray:
        return linear(x, self._head)

    def _layer(self, layer, i: int) -> _Layer:
        qkv, o, gate_up, down = projections(layer)
        norm1, norm2, norms = layer_norms(layer, self.spec)
        return _Layer(norm1, _fused(qkv), np.asarray(o[0].weight), norm2, _fused(gate_up),
                      np.asarray(down[0].weight), None if self.spec.plain else norms,
                      self.spec.windows[i], self.spec.rope_of[i])

    def __call__(self, tokens: Sequence[int], caches: list) -> mx.array:
        if numba.get_num_threads() != self.threads:  # set once on the engine thread, which calls this
            numba.set_num_threads(self.threads)
        positions, left_pad, views = self._kv.begin(caches, len(tokens))
        trig = self._trig(positions)
        h = self._embed(np.asarray(tokens))
        idx = caches[0]._idx
        for w, (keys, values) in zip(self._layers, views):
            self._step(h, w, keys, values, idx, left_pad, *trig[w.rope])
        self._kv.end(caches, positions)
        return mx.array(self._lm_head(rms_norm(h, self._norm, self.eps)))

    def verify(self, rows: Sequence[Sequence[int]], caches: list) -> mx.array:
        """(B, W, vocab) logits of W new tokens per row (a draft's verify forward, causal within
        the span), caches advanced by W positions; the caller trims what it rejects."""
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        width = len(rows[0])
        positions, left_pad, views = self._kv.begin(caches, len(rows), width)
        trig = self._trig((positions[:, None] + np.arange(width)).reshape(-1))
        h = self._embed(np.asarray(rows).reshape(-1))
        idx = caches[0]._idx
        for w, (keys, values) in zip(self._layers, views):
            self._step(h, w, keys, values, idx, left_pad, *trig[w.rope], width)
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
    warm_up_arch()
    return CpuDecoder(model, threads)
