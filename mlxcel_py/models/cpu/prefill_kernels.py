"""Prefill attention and SwiGLU (gemma3: GELU-tanh) through numpy on the CPU.

MLX's CPU `exp` is scalar: at 512 queries x 2048 keys its softmax costs ~190 ms a layer,
and SiLU over a 2048-token MLP ~180 ms, most of a long prefill. numpy's vectorized exp is
~18x faster, so these run here for multi-token inputs; decode (one token per sequence,
batched masks) stays in MLX, where the round trip would cost more than it saves.
Every mlx-lm module that calls them through its globals gets them (llama, qwen2, qwen3, phi3;
gemma3's attention, its sliding-window layers' boolean masks included, and its GELU).
The loader hands a `PrefillKernels` to the runner in `LoadedModel.cpu_kernels`; mlx-lm's
module is patched only while the runner's forwards run inside it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

import mlx.core as mx
import numpy as np

from .prefill_attention import causal_tiles, range_tiles, run_tiles
from .arch_kernels import gelu_rows
from .decode_kernels import silu_mul_rows

log = logging.getLogger("mlxcel_py.models")

QUERY_BLOCK = 256  # bounds the score matrix of the numpy fallback: heads x 256 x keys floats
MIN_QUERIES = 8  # below this MLX's own kernel is as fast and skips the round trip


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Causal attention for queries at the last L of S positions. q (H, L, D), k/v (KV, S, D).
    Tiles of queries over the keys up to each tile's end, in parallel (models/cpu/prefill_attention.py)."""
    return run_tiles(q, k, v, scale, causal_tiles(q.shape[1], k.shape[1], q.shape[0] // k.shape[0]))


def masked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, seen: np.ndarray,
                     tiles: Optional[list] = None) -> np.ndarray:
    """Attention under a boolean (L, S) mask (True: the key is seen), e.g. a sliding window's.
    q (H, L, D), k/v (KV, S, D). Each tile of queries multiplies only the keys some row of it sees:
    under a window of W that is at most a tile + W keys, whatever the context. `tiles`: range_tiles of
    this mask, already found (every sliding layer of a forward gets the same mask)."""
    tiles = tiles if tiles is not None else range_tiles(seen, q.shape[0] // k.shape[0])
    if tiles is not None:  # every row sees one run of keys (causal, sliding window): the tiled kernel
        return run_tiles(q, k, v, scale, tiles)
    return _masked_attention_numpy(q, k, v, scale, seen)


def _masked_attention_numpy(q, k, v, scale, seen) -> np.ndarray:
    """masked_attention for any boolean mask: numpy's passes over whole score blocks."""
    num_heads, num_q, _ = q.shape
    group = num_heads // k.shape[0]
    out = np.empty((num_heads, num_q, v.shape[2]), dtype=np.float32)
    for b0 in range(0, num_q, QUERY_BLOCK):
        b1 = min(num_q, b0 + QUERY_BLOCK)
        cols = np.flatnonzero(seen[b0:b1].any(axis=0))
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        hidden = np.where(seen[b0:b1, lo:hi], np.float32(0.0), np.float32(-np.inf))
        nb, width = b1 - b0, hi - lo
        for h in range(k.shape[0]):
            heads = slice(h * group, (h + 1) * group)
            # The group's heads as one GEMM: numpy's batched matmul against k.T was 5x slower here.
            qh = (q[heads, b0:b1] * np.float32(scale)).reshape(group * nb, -1)
            scores = (qh @ k[h, lo:hi].T).reshape(group, nb, width)
            scores += hidden
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            total = scores.sum(axis=-1, keepdims=True)
            res = (scores.reshape(group * nb, width) @ v[h, lo:hi]).reshape(group, nb, -1)
            res /= total
            out[heads, b0:b1] = res
    return out


def _mask_kind(mask, queries, keys) -> Optional[str]:
    """"causal", "array" (a boolean (L, S) mask: gemma3's sliding window), or None (MLX's own kernel)."""
    if isinstance(mask, str):
        return "causal" if mask == "causal" else None
    if isinstance(mask, mx.array) and mask.dtype == mx.bool_ and mask.shape == (queries.shape[2], keys.shape[2]):
        return "array"
    return None


def make_sdpa(original: Callable) -> Callable:
    """Wrap mlx-lm's `scaled_dot_product_attention`: numpy for unbatched causal prefill, and for one
    under a boolean (L, S) mask (a sliding-window layer's). A forward hands every sliding layer the same
    mask object: its tiles are found once (`held`, per engine thread, keeps the mask alive, so its
    identity is its own)."""
    held = threading.local()

    def mask_tiles(mask, seen: np.ndarray, group: int) -> Optional[list]:
        if getattr(held, "key", None) is not mask or held.group != group:
            held.key, held.group, held.tiles = mask, group, range_tiles(seen, group)
        return held.tiles

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        # a quantized cache hands over (packed, scales, biases) tuples: mlx-lm's quantized attention
        kind = None if hasattr(cache, "bits") else _mask_kind(mask, queries, keys)
        eligible = (
            kind is not None and sinks is None and queries.shape[0] == 1
            and queries.shape[2] >= MIN_QUERIES and not hasattr(cache, "bits")
            and queries.dtype == mx.float32 and keys.dtype == mx.float32
        )
        if not eligible:
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        mx.eval(queries, keys, values)
        # Index in numpy, not MLX: the cache hands over a strided view of its buffer, which
        # numpy reads in place, while an MLX `keys[0]` is a new op that copies the whole KV
        # (2.4 ms a layer at 4,096 positions, most of a short piece's time at long context).
        q, k, v = np.asarray(queries)[0], np.asarray(keys)[0], np.asarray(values)[0]
        if kind == "causal":
            out = causal_attention(q, k, v, scale)
        else:
            seen = np.asarray(mask)
            out = masked_attention(q, k, v, scale, seen, mask_tiles(mask, seen, q.shape[0] // k.shape[0]))
        return mx.array(out)[None]

    sdpa.mlxcel_numpy = True  # type: ignore[attr-defined]
    sdpa.__wrapped__ = original  # type: ignore[attr-defined]
    return sdpa


def make_swiglu(original: Callable) -> Callable:
    """Wrap mlx-lm's `swiglu(gate, x)`: numpy for float32 inputs of many rows (prefill)."""

    def swiglu(gate, x):
        rows = gate.size // max(gate.shape[-1], 1)
        if rows < MIN_QUERIES or gate.dtype != mx.float32 or x.dtype != mx.float32:
            return original(gate, x)
        mx.eval(gate, x)
        g, up = np.asarray(gate), np.asarray(x)
        if g.shape != up.shape:  # broadcasting: numpy's passes
            return mx.array(numpy_swiglu(g, up))
        width = g.shape[-1]
        out = np.empty(g.shape, np.float32)
        silu_mul_rows(np.ascontiguousarray(g).reshape(-1, width), np.ascontiguousarray(up).reshape(-1, width),
                      out.reshape(-1, width))
        return mx.array(out)

    swiglu.mlxcel_numpy = True  # type: ignore[attr-defined]
    swiglu.__wrapped__ = original  # type: ignore[attr-defined]
    return swiglu


def numpy_swiglu(g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """silu(g) * x in numpy's passes, a new array."""
    out = np.negative(g)
    np.exp(out, out=out)
    out += 1.0
    np.divide(g, out, out=out)
    out *= x
    return out


def numpy_gelu_mul(g: np.ndarray) -> np.ndarray:
    """mlx's `nn.gelu_approx` (0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))) of a float32 array, a new
    array: one numba pass over the rows (arch_kernels.gelu_rows)."""
    flat = np.ascontiguousarray(g, dtype=np.float32).reshape(-1, g.shape[-1])
    out = np.empty_like(flat)
    gelu_rows(flat, out)
    return out.reshape(g.shape)


class _NnWithGelu:
    """mlx.nn as a gemma3 module sees it inside the scope: `gelu_approx` in numpy for many float32 rows
    (MLX's CPU tanh is scalar: 0.18 s for a 2,048 x 2,048 gate, numpy's 0.025 s), the rest mlx.nn's."""

    mlxcel_numpy = True

    def __init__(self, original):
        self.__wrapped__ = original

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def gelu_approx(self, gate):
        rows = gate.size // max(gate.shape[-1], 1)
        if rows < MIN_QUERIES or gate.dtype != mx.float32:
            return self.__wrapped__.gelu_approx(gate)
        mx.eval(gate)
        return mx.array(numpy_gelu_mul(np.asarray(gate)))


KERNELS = {"scaled_dot_product_attention": make_sdpa, "swiglu": make_swiglu}
# Globals routed only in one mlx-lm module: gemma3's MLP calls `nn.gelu_approx` through the module's `nn`.
MODULE_KERNELS = {"mlx_lm.models.gemma3_text": {"nn": _NnWithGelu}}
LABELS = {"scaled_dot_product_attention": "attention", "swiglu": "SwiGLU", "nn": "GELU"}  # for the load line


class PrefillKernels:
    """mlx-lm's attention and SwiGLU routed through numpy, only inside `with kernels:`.

    mlx-lm's layers call these through their module's globals, so routing them means
    swapping those globals; the runner enters this around each of its forwards and the
    originals are back once the last overlapping scope (one per engine thread) has left."""

    _lock = threading.Lock()
    _depth: dict[str, int] = {}  # module name -> scopes open over it, across instances
    # MLX's cache limit is the process's: the scopes that raise it (one per model module, e.g. two models
    # behind one server) count together, and the last to leave puts back the limit the first found.
    _raising: dict[str, int] = {}  # module name -> the limit its open scopes asked for
    _saved_limit: list[int] = []

    def __init__(self, module, originals: dict[str, Callable], cache_bytes: int = 0):
        self.module = module
        self._originals = originals
        self.cache_bytes = cache_bytes  # MLX's cache limit inside the scope (0: left alone); prefill_cache_bytes
        factories = {**KERNELS, **MODULE_KERNELS.get(module.__name__, {})}
        self._wrapped = {name: factories[name](fn) for name, fn in originals.items()}

    def describe(self) -> str:
        """The load line's note: which parts run in numpy, e.g. "prefill attention+GELU in numpy" (gemma3)."""
        parts = [LABELS[name] for name in LABELS if name in self._originals]
        return f"prefill {'+'.join(parts)} in numpy"

    def __enter__(self) -> "PrefillKernels":
        with self._lock:
            key = self.module.__name__
            if self._depth.get(key, 0) == 0:
                for name, fn in self._wrapped.items():
                    setattr(self.module, name, fn)
                if self.cache_bytes:
                    self._raise_cache(key)
            self._depth[key] = self._depth.get(key, 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            key = self.module.__name__
            self._depth[key] -= 1
            if self._depth[key] == 0:
                for name, fn in self._originals.items():
                    setattr(self.module, name, fn)
                if self._raising.pop(key, None) is not None:
                    self._lower_cache()

    def _raise_cache(self, key: str) -> None:
        self._raising[key] = self.cache_bytes
        before = mx.set_cache_limit(max(self._raising.values()))
        if not self._saved_limit:
            self._saved_limit.append(before)

    def _lower_cache(self) -> None:
        """Lowering the limit frees what the cache holds (measured): resident memory as it was after the forward."""
        mx.set_cache_limit(max(self._raising.values()) if self._raising else self._saved_limit.pop())


PREFILL_ROWS = 2048  # the alone chunk (engine/chunking/fixed.py): the rows of the prefill's widest buffers
MLX_CPU_CACHE = 32 << 20  # MLX's default CPU cache limit (mlx 0.32)


def prefill_cache_bytes(model) -> int:
    """MLX's cache limit for a prefill forward: three of its widest buffers (rows x FFN width of float32:
    gate, up and SwiGLU), where one of them is more than MLX's default CPU cache holds, else 0. Under
    the default a 1B's 64 MiB buffers were allocated afresh every layer, each fresh page faulting:
    `mx.array` of a 2,048 x 8,192 numpy array 28-35 ms, 4 ms from the cache (Zen 5 VM)."""
    args = getattr(model, "args", None)
    width = int(getattr(args, "intermediate_size", 0) or 0) or 4 * int(getattr(args, "hidden_size", 0) or 0)
    widest = PREFILL_ROWS * width * 4
    return 3 * widest if widest > MLX_CPU_CACHE else 0


def kernels_for(model) -> Optional[PrefillKernels]:
    """The numpy prefill kernels for the model's mlx-lm module; None when it has none of them."""
    import importlib

    module_name = type(model).__module__  # e.g. mlx_lm.models.llama
    module = importlib.import_module(module_name)
    originals = {}
    for name in {**KERNELS, **MODULE_KERNELS.get(module_name, {})}:
        fn = getattr(module, name, None)
        if fn is not None:  # loaded while another engine's scope is open: keep mlx-lm's own
            originals[name] = fn.__wrapped__ if getattr(fn, "mlxcel_numpy", False) else fn
    if not originals:
        return None
    log.info("CPU prefill kernels in numpy (vectorized exp) for %s: %s", module_name,
             ", ".join("gelu_approx" if n == "nn" else n for n in originals))
    return PrefillKernels(module, originals, prefill_cache_bytes(model))
