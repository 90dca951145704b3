"""A mixed load at the engine, on the tiny model: four streams decoding while 32 embedding
requests of 300 tokens arrive. Every embedding equals the one computed alone, and every stream's tokens
equal its tokens alone (`python -m bench mixed-embeddings` measures the streams' latency on the real model)."""

from __future__ import annotations

import random

import numpy as np

from mlxcel_py.config import resolve
from mlxcel_py.engine import Embedding, EngineWorker, Finished, Request, SamplingParams, TokenDelta
from mlxcel_py.engine import build_engine
from config_helpers import flags_for
from tiny import tiny_model

TIMEOUT = 120
STREAMS, EMBEDDINGS, EMBED_TOKENS, GEN_TOKENS = 4, 32, 300, 64


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def events_of(handle) -> list:
    out = []
    while not out or not isinstance(out[-1], Finished):
        out.append(handle.get(timeout=TIMEOUT))
    return out


def until_token(handle) -> list:
    """A stream's events up to its first token: it is decoding from then on."""
    out = [handle.get(timeout=TIMEOUT)]
    while not isinstance(out[-1], (TokenDelta, Finished)):
        out.append(handle.get(timeout=TIMEOUT))
    return out


def vector_of(events) -> np.ndarray:
    (emb,) = [e for e in events if isinstance(e, Embedding)]
    return emb.vector


def test_embeddings_arriving_while_four_streams_decode_equal_their_alone_vectors():
    cfg = resolve("serve", flags_for("serve", parallel=STREAMS + 4), env={})
    worker = EngineWorker(build_engine(cfg.engine, tiny_model())).start()
    gens = [Request(f"g{i}", prompt(20, i), SamplingParams(max_tokens=GEN_TOKENS, ignore_eos=True))
            for i in range(STREAMS)]
    embeds = [Request(f"e{i}", prompt(EMBED_TOKENS, 100 + i), pooling="last") for i in range(EMBEDDINGS)]
    try:
        alone_vectors = [vector_of(events_of(worker.submit(e))) for e in embeds]
        alone_tokens = [[e.token_id for e in events_of(worker.submit(g)) if isinstance(e, TokenDelta)] for g in gens]
        streams = [worker.submit(g) for g in gens]
        first = [until_token(s) for s in streams]  # every stream decodes before they arrive
        handles = [worker.submit(e) for e in embeds]
        mixed_tokens = [[e.token_id for e in [*f, *events_of(s)] if isinstance(e, TokenDelta)]
                        for f, s in zip(first, streams)]
        mixed_events = [events_of(h) for h in handles]
    finally:
        worker.stop()
    assert mixed_tokens == alone_tokens and all(len(t) == GEN_TOKENS for t in alone_tokens)
    for events, want in zip(mixed_events, alone_vectors):
        np.testing.assert_array_equal(vector_of(events), want)
