"""One forward per tick on the CPU: the decode rows and a prefill piece's tokens go
through every layer's products together, so the weights are streamed once a tick.

The B decode rows keep the engine's own rows (engine/runner/kv_rows.py: `write_kv_rows` /
`attend_rows`); the piece's P tokens attend causally over their own sequence's KV, which a
`store(layer, keys, values)` callback appends to and hands back as (kv_heads, S, dim) arrays
(`prefill_kernels.causal_attention`, the prefill's own). Norms, RoPE and SwiGLU work row by row and
the streaming products compute each output row whole, so each row's result does not depend on
what rode along (tests/test_cpu_tick.py checks it against the separate forwards).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numba
import numpy as np

from .blas import numpy_blas_threads
from .decode_kernels import rms_norm, silu_mul
from .rows import _mul, attend_rows, no_prefix, qkv_rows, write_kv_rows
from .prefill_kernels import causal_attention

Store = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
# numpy's OpenBLAS threads for the piece's attention (its 2 x heads small products a layer): one.
# Waking a second thread per product, on cores numba's threads just held, cost 1.3-60x the CPU
# time of one thread at every piece size and context measured (docs/CONTINUOUS_BATCHING.md).
PIECE_BLAS_THREADS: Optional[int] = 1  # None: numpy's own setting


def forward_tick(decoder, tokens: Sequence[int], keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                 slot: np.ndarray, start: np.ndarray, pos: np.ndarray, piece: Sequence[int], piece_start: int,
                 store: Store, last: bool, prefix: Optional[np.ndarray] = None) -> np.ndarray:
    """(B (+ 1), vocab) float32 logits: the decode rows', then the piece's last position's when `last`.
    Writes the decode rows' new K/V into their slots (the caller advances their lengths) and hands
    the piece's to `store`. `prefix`: the decode rows' shared prefixes (rows.forward_rows)."""
    if numba.get_num_threads() != decoder.threads:
        numba.set_num_threads(decoder.threads)
    with numpy_blas_threads(PIECE_BLAS_THREADS):
        return _forward(decoder, tokens, keys, values, slot, start, pos, piece, piece_start, store, last, prefix)


def _forward(decoder, tokens, keys, values, slot, start, pos, piece, piece_start, store, last, prefix) -> np.ndarray:
    t, eps, heads, kv_heads, dim = decoder.threads, decoder.eps, decoder.heads, decoder.kv_heads, decoder.head_dim
    b, p = len(tokens), len(piece)
    prefix = no_prefix(b) if prefix is None else prefix
    positions = np.concatenate([np.asarray(pos, np.int64), piece_start + np.arange(p, dtype=np.int64)])
    cos, sin = decoder._ropes[0].at(positions)  # llama's layer: one rope (rows.supports_rows)
    h = np.array(decoder._embed_rows(np.asarray([*tokens, *piece])), dtype=np.float32)
    k0, v0 = heads * dim, (heads + kv_heads) * dim
    for i, (w, k, v) in enumerate(zip(decoder._layers, keys, values)):
        qkv = qkv_rows(decoder, w, h, cos, sin)
        att = np.empty((b + p, heads * dim), np.float32)
        if b:
            rows = qkv[:b]
            write_kv_rows(rows, k, v, slot, pos, heads, 1)
            att[:b] = attend_rows(rows, k, v, slot, start, pos, heads, decoder.scale, 1, prefix)
        new = qkv[b:]
        piece_k, piece_v = store(i, _heads(new[:, k0:v0], kv_heads), _heads(new[:, v0:], kv_heads))
        out = causal_attention(np.ascontiguousarray(_heads(new[:, :k0], heads)), piece_k, piece_v, decoder.scale)
        att[b:] = out.transpose(1, 0, 2).reshape(p, heads * dim)
        h += _mul(w.o, att, t)
        h += _mul(w.down, silu_mul(_mul(w.gate_up, rms_norm(h, w.norm2, eps), t)), t)
    rows = np.concatenate([h[:b], h[-1:]]) if last else h[:b]
    return decoder._lm_head(rms_norm(np.ascontiguousarray(rows), decoder._norm, eps))


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """(P, n * dim) -> (n, P, dim)."""
    return x.reshape(x.shape[0], n, -1).transpose(1, 0, 2)
