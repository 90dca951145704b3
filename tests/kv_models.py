"""A tiny llama with head dim 32 (quantized KV needs a multiple of the group, 32), and helpers
to run engines over it. Not a test module."""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np

from tiny import tiny_model


@functools.lru_cache(maxsize=None)
def model32():
    """Random float32 llama: 2 layers, 2 query heads and 1 KV head of dim 32, the tiny vocabulary."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    args = ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                     num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
                     vocab_size=tiny_model().model.args.vocab_size, rope_theta=10000.0,
                     max_position_embeddings=4096, tie_word_embeddings=True)
    model = Model(args)
    rng = np.random.default_rng(0)
    weights = []
    for name, p in tree_flatten(model.parameters()):
        w = rng.standard_normal(p.shape) / np.sqrt(p.shape[-1]) if p.ndim > 1 else 1 + 0.1 * rng.standard_normal(p.shape)
        weights.append((name, mx.array(w.astype(np.float32))))
    model.load_weights(weights)
    return model


def loaded32():
    """model32 with the tiny model's tokenizer, as the loader would hand it over (no CPU fast path)."""
    return dataclasses.replace(tiny_model(), model=model32(), cpu_decode=None, cpu_kernels=None)


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def run_engine(engine, requests) -> dict[str, list[int]]:
    """Drive an engine tick by tick until every request finished; tokens per request id."""
    from mlxcel_py.engine import Finished, TokenDelta

    for request in requests:
        engine.add_request(request)
    out: dict[str, list[int]] = {r.request_id: [] for r in requests}
    done: set[str] = set()
    for _ in range(100_000):
        if not engine.has_work():
            break
        for event in engine.step():
            if isinstance(event, TokenDelta):
                out[event.request_id].append(event.token_id)
            elif isinstance(event, Finished):
                done.add(event.request_id)
    assert done == set(out)
    return out
