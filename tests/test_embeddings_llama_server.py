"""A true embedding model against llama-server: the Qwen3-Embedding-style fixture
(qwen3emb-f16.gguf: pooling_type last, add_eos_token with <|endoftext|>) and llama-server's vectors for it,
recorded by scripts/make_embedding_fixture.py. Ours must agree on both routes: cosine >= 0.99."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from gguf_fixtures import FIXTURES
from server_helpers import start_server, stop_server

RECORD = json.loads((FIXTURES / "qwen3emb_llama_server.json").read_text())
INPUTS = [entry["input"] for entry in RECORD["inputs"]]
MIN_COSINE = 0.99


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def loaded():
    from mlxcel_py.models import load_model

    return load_model(str(FIXTURES / "qwen3emb-f16.gguf"))


@pytest.fixture(scope="module")
def server(loaded):
    # Chunks of 16 split the longer inputs, so last-token pooling is checked across prefill pieces too.
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=16)
    yield running
    stop_server(running)


def test_the_fixture_reads_as_an_embedding_model_that_appends_its_eos(loaded):
    from mlxcel_py.models import encode_text

    endoftext = loaded.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert loaded.pooling == "last" and loaded.appended_eos == endoftext
    for entry in RECORD["inputs"]:  # llama-server's /tokenize with add_special: the eos at the end
        assert list(encode_text(loaded.tokenizer, entry["input"])) == entry["tokens"]
        assert entry["tokens"][-1] == endoftext
        assert list(encode_text(loaded.tokenizer, entry["input"], add_special_tokens=False)) == entry["tokens"][:-1]


def test_the_recorded_vectors_tell_the_inputs_apart():
    # Otherwise agreeing with them would prove nothing: every pair of inputs is far apart.
    vectors = [entry["v1_embeddings"] for entry in RECORD["inputs"]]
    pairs = [cosine(a, b) for i, a in enumerate(vectors) for b in vectors[i + 1:]]
    assert max(pairs) < 0.5, pairs


def test_v1_embeddings_agree_with_llama_server(server):
    with server.client() as c:
        reply = c.post("/v1/embeddings", json={"input": INPUTS, "encoding_format": "float"}).json()
    assert reply["usage"]["prompt_tokens"] == sum(len(e["tokens"]) for e in RECORD["inputs"])
    for got, entry in zip(reply["data"], RECORD["inputs"]):
        assert abs(np.linalg.norm(got["embedding"]) - 1.0) < 1e-5
        assert cosine(got["embedding"], entry["v1_embeddings"]) >= MIN_COSINE, entry["input"]


def test_native_embedding_route_agrees_with_llama_server(server):
    with server.client() as c:
        for entry in RECORD["inputs"]:
            rows = c.post("/embedding", json={"content": entry["input"]}).json()
            assert len(rows) == 1 and len(rows[0]["embedding"]) == 1
            assert cosine(rows[0]["embedding"][0], entry["embedding"]) >= MIN_COSINE, entry["input"]


def test_without_the_appended_eos_the_vectors_would_disagree(loaded):
    # The eos is what makes ours match: pooling the text's own last token does not.
    from mlxcel_py.models import encode_text

    misses = 0
    for entry in RECORD["inputs"]:
        ids = list(encode_text(loaded.tokenizer, entry["input"], add_special_tokens=False))
        hidden = np.array(loaded.model.model(mx.array([ids]))[0, -1].astype(mx.float32))
        misses += cosine(hidden, entry["v1_embeddings"]) < MIN_COSINE
    assert misses == len(INPUTS)
