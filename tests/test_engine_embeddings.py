"""Embedding requests through the engine: prefill-only sequences, pooled hidden states."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Embedding, EngineWorker, Finished, PromptProgress, Request, SamplingParams, TokenDelta
from mlxcel_py.engine import build_engine
from config_helpers import flags_for
from tiny import tiny_model

TIMEOUT = 60


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(5, 300) for _ in range(n))


def make_worker(lm, **kw):
    cfg = resolve("serve", flags_for("serve", **kw), env={})
    return EngineWorker(build_engine(cfg.engine, lm)).start()


def events_of(handle) -> list:
    out = []
    while not out or not isinstance(out[-1], Finished):
        out.append(handle.get(timeout=TIMEOUT))
    return out


def vector_of(events) -> np.ndarray:
    (emb,) = [e for e in events if isinstance(e, Embedding)]
    return emb.vector


def reference(lm, ids, pooling: str) -> np.ndarray:
    """Pooled in numpy from one plain mlx-lm forward of the inner model (no engine, no chunks)."""
    hidden = np.array(lm.model.model(mx.array([list(ids)]))[0].astype(mx.float32))
    return {"mean": hidden.mean(axis=0), "cls": hidden[0], "last": hidden[-1], "none": hidden}[pooling]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_pooled_vector_equals_the_direct_computation(lm, pooling):
    worker = make_worker(lm, parallel=2)
    try:
        ids = prompt(37, 1)
        events = events_of(worker.submit(Request("e", ids, pooling=pooling)))
    finally:
        worker.stop()
    assert not any(isinstance(e, TokenDelta) for e in events)
    finished = events[-1]
    assert (finished.finish_reason, finished.usage.prompt_tokens, finished.usage.completion_tokens) == ("stop", 37, 0)
    vec = vector_of(events)
    assert vec.dtype == np.float32
    np.testing.assert_allclose(vec, reference(lm, ids, pooling), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_chunked_prefill_pools_what_one_piece_does(lm, pooling):
    ids = prompt(100, 2)
    worker = make_worker(lm, prefill_chunk_size=16)
    try:
        events = events_of(worker.submit(Request("e", ids, pooling=pooling)))
    finally:
        worker.stop()
    progress = [e.processed for e in events if isinstance(e, PromptProgress)]
    assert progress == [16, 32, 48, 64, 80, 96, 100]
    np.testing.assert_allclose(vector_of(events), reference(lm, ids, pooling), atol=1e-5, rtol=1e-5)


def test_generation_next_to_embeddings_is_token_identical_to_alone(lm):
    gen = Request("g", prompt(20, 3), SamplingParams(max_tokens=24, ignore_eos=True))
    alone_worker = make_worker(lm, parallel=3, prefill_chunk_size=8)
    try:
        alone = [e.token_id for e in events_of(alone_worker.submit(gen)) if isinstance(e, TokenDelta)]
        handle = alone_worker.submit(gen)
        embeds = [alone_worker.submit(Request(f"e{i}", prompt(40, 10 + i), pooling="mean")) for i in range(4)]
        mixed = [e.token_id for e in events_of(handle) if isinstance(e, TokenDelta)]
        vectors = [vector_of(events_of(h)) for h in embeds]
        stats = alone_worker.stats()
    finally:
        alone_worker.stop()
    assert mixed == alone and len(alone) == 24
    for i, vec in enumerate(vectors):
        np.testing.assert_allclose(vec, reference(lm, prompt(40, 10 + i), "mean"), atol=1e-5, rtol=1e-5)
    assert stats.num_kv_tokens == 0 and all(s.state == "idle" for s in stats.slots)  # their KV was freed


def test_an_embedding_aborted_mid_prefill_ends_with_abort(lm):
    worker = make_worker(lm, prefill_chunk_size=8)
    try:
        handle = worker.submit(Request("e", prompt(400, 4), pooling="mean"))
        first = handle.get(timeout=TIMEOUT)
        assert isinstance(first, PromptProgress)
        handle.abort()
        events = [first] + events_of(handle)
        after = events_of(worker.submit(Request("f", prompt(10, 5), pooling="last")))
    finally:
        worker.stop()
    assert events[-1].finish_reason == "abort" and not any(isinstance(e, Embedding) for e in events)
    np.testing.assert_allclose(vector_of(after), reference(lm, prompt(10, 5), "last"), atol=1e-5, rtol=1e-5)


def test_an_unknown_pooling_is_refused_naming_it():
    from mlxcel_py.errors import RequestError

    with pytest.raises(RequestError, match="pooling must be one of mean, cls, last, none") as info:
        Request("e", (1, 2), pooling="max")
    assert info.value.param == "pooling"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3", "phi3"])
def test_every_architecture_embeds_its_checkpoints_hidden_states(arch):
    """Through the engine on our GGUF load vs the final normed hidden states of mlx-lm's model of
    the HF checkpoint the GGUF was converted from: the inner module is found for every family."""
    from gguf_fixtures import ARCH_FILES, PROMPT, fixture_model, hf_reference

    ours = fixture_model(ARCH_FILES[arch])
    ids = tuple(ours.tokenizer.encode(PROMPT, add_special_tokens=True))
    hidden = np.array(hf_reference(arch).model(mx.array([list(ids)]))[0].astype(mx.float32), dtype=np.float64)
    worker = make_worker(ours, prefill_chunk_size=4)
    try:
        got = {p: vector_of(events_of(worker.submit(Request(p, ids, pooling=p)))) for p in ("mean", "last")}
    finally:
        worker.stop()
    for pooling, want in (("mean", hidden.mean(axis=0)), ("last", hidden[-1])):
        v = got[pooling].astype(np.float64)
        cosine = v @ want / (np.linalg.norm(v) * np.linalg.norm(want))
        assert cosine > 0.9999, (arch, pooling, cosine)
