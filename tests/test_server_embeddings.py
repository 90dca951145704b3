"""The embedding routes with the official clients: OpenAI's /v1/embeddings, llama-server's /embedding,
Ollama's /api/embed and /api/embeddings, over the tiny model."""

from __future__ import annotations

import base64

import mlx.core as mx
import numpy as np
import pytest

from server_helpers import error_of, start_server, stop_server
from tiny import tiny_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "hello"]


@pytest.fixture(scope="module")
def server():
    running = start_server(parallel=4, prefill_chunk_size=8)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def direct(text: str, pooling: str) -> np.ndarray:
    """The tiny model's final hidden states from a plain mlx-lm forward, pooled and L2-normalised in numpy."""
    from mlxcel_py.models import encode_text

    lm = tiny_model()
    ids = encode_text(lm.tokenizer, text)
    hidden = np.array(lm.model.model(mx.array([list(ids)]))[0].astype(mx.float32), dtype=np.float64)
    v = {"mean": hidden.mean(axis=0), "cls": hidden[0], "last": hidden[-1]}[pooling]
    return v / np.linalg.norm(v)


def test_openai_sdk_base64_by_default_gives_unit_vectors_equal_to_the_direct_computation(client):
    reply = client.embeddings.create(model="anything", input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.object == "list"
    for d, text in zip(reply.data, TEXTS):
        v = np.array(d.embedding)
        assert v.shape == (64,) and abs(np.linalg.norm(v) - 1.0) < 1e-5
        np.testing.assert_allclose(v, direct(text, "last"), atol=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 0


def test_float_format_batched_equals_one_at_a_time_and_is_deterministic(server, client):
    batched = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    alone = [client.embeddings.create(model="m", input=t, encoding_format="float").data[0].embedding for t in TEXTS]
    again = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    for d, one, other in zip(batched.data, alone, again.data):
        np.testing.assert_allclose(d.embedding, one, atol=1e-5)
        assert d.embedding == other.embedding
    raw = server.client().post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, alone[2], atol=1e-6)
    assert set(raw) == {"object", "data", "model", "usage"} and set(raw["data"][0]) == {"object", "index", "embedding"}


def test_token_id_inputs_equal_text_inputs(server):
    from mlxcel_py.models import encode_text

    ids = list(encode_text(tiny_model().tokenizer, TEXTS[0]))
    with server.client() as c:
        by_text = c.post("/v1/embeddings", json={"input": TEXTS[0]}).json()["data"][0]["embedding"]
        one = c.post("/v1/embeddings", json={"input": ids}).json()
        many = c.post("/v1/embeddings", json={"input": [ids, ids[:3]]}).json()
    assert one["data"][0]["embedding"] == by_text and len(many["data"]) == 2
    assert many["data"][0]["embedding"] == by_text and one["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "dimensions": 8}, "dimensions"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [10**7]}, "input"),
    ({"input": "word " * 5000}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
])
def test_openai_refusals_name_the_field(server, body, param):
    with server.client() as c:
        response = c.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param


def test_chunked_prefill_equals_unchunked_and_generation_next_to_it_is_unchanged(server):
    long_text = " ".join(TEXTS * 12)  # far more tokens than the 8-token chunk
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}
    with server.client() as c:
        alone = c.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(4) as pool:
            embeds = [pool.submit(c.post, "/v1/embeddings", json={"input": [long_text] * 3}) for _ in range(3)]
            mixed = pool.submit(c.post, "/v1/chat/completions", json=chat)
            vectors = [f.result().json()["data"] for f in embeds]
            mixed_text = mixed.result().json()["choices"][0]["message"]["content"]
    assert mixed_text == alone
    for data in vectors:
        for d in data:
            np.testing.assert_allclose(d["embedding"], direct(long_text, "last"), atol=1e-5)


def test_llama_server_embedding_shape_and_normalisation(server):
    with server.client() as c:
        one = c.post("/embedding", json={"content": TEXTS[1]}).json()
        raw = c.post("/embeddings", json={"input": TEXTS[1], "embd_normalize": -1}).json()
        taxicab = c.post("/embedding", json={"input": [TEXTS[1]], "embd_normalize": 1}).json()
        missing = c.post("/embedding", json={})
    assert [set(r) for r in one] == [{"index", "embedding"}] and len(one[0]["embedding"]) == 1
    np.testing.assert_allclose(one[0]["embedding"][0], direct(TEXTS[1], "last"), atol=1e-5)
    v = np.array(raw[0]["embedding"][0])
    np.testing.assert_allclose(v / np.linalg.norm(v), direct(TEXTS[1], "last"), atol=1e-5)
    np.testing.assert_allclose(np.abs(taxicab[0]["embedding"][0]).sum(), 1.0, atol=1e-5)
    assert missing.status_code == 400 and error_of(missing)["param"] == "input"


def test_ollama_client_embed_and_embeddings(server):
    import ollama

    c = ollama.Client(host=server.url)
    reply = c.embed(model="tiny", input=TEXTS[:2])
    assert reply.model == "tiny" and len(reply.embeddings) == 2 and reply.prompt_eval_count > 0
    assert reply.total_duration > 0 and reply.load_duration == 0
    for v, text in zip(reply.embeddings, TEXTS):
        np.testing.assert_allclose(v, direct(text, "last"), atol=1e-5)
    legacy = np.array(c.embeddings(model="tiny", prompt=TEXTS[0]).embedding)
    np.testing.assert_allclose(legacy / np.linalg.norm(legacy), direct(TEXTS[0], "last"), atol=1e-5)
    long = c.embed(model="tiny", input="word " * 5000)  # truncated to the slot, as Ollama does
    assert len(long.embeddings) == 1
    with pytest.raises(ollama.ResponseError) as info:
        c.embed(model="tiny", input="x", truncate=False, dimensions=4)
    assert info.value.status_code == 400 and "dimensions" in info.value.error


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_flag(pooling):
    running = start_server(pooling=pooling)
    try:
        with running.client() as c:
            data = c.post("/v1/embeddings", json={"input": TEXTS[0]}).json()["data"]
    finally:
        stop_server(running)
    np.testing.assert_allclose(data[0]["embedding"], direct(TEXTS[0], pooling), atol=1e-5)


def test_pooling_none_gives_per_token_rows_on_embedding_and_a_400_on_v1():
    running = start_server(pooling="none")
    try:
        with running.client() as c:
            rows = c.post("/embedding", json={"content": TEXTS[2]}).json()[0]["embedding"]
            refused = c.post("/v1/embeddings", json={"input": TEXTS[2]})
            ollama_new = c.post("/api/embed", json={"model": "m", "input": TEXTS[2]})
            ollama_old = c.post("/api/embeddings", json={"model": "m", "prompt": TEXTS[2]})
    finally:
        stop_server(running)
    from mlxcel_py.models import encode_text

    assert len(rows) == len(encode_text(tiny_model().tokenizer, TEXTS[2]))
    assert all(abs(np.linalg.norm(r) - 1) < 1e-5 for r in rows)
    assert refused.status_code == 400 and error_of(refused)["code"] == "invalid_pooling"
    assert error_of(refused)["message"] == ("pooling 'none' gives one vector per token, which /v1/embeddings cannot "
                                            "return; use /embedding, or serve with --pooling mean|cls|last")
    assert (ollama_new.status_code, ollama_new.json()) == (400, {"error": (
        "pooling 'none' gives one vector per token, which /api/embed cannot return; serve with --pooling mean|cls|last")})
    assert (ollama_old.status_code, ollama_old.json()) == (400, {
        "error": "pooling 'none' gives one vector per token, which /api/embeddings cannot return"})


def test_the_ggufs_pooling_type_is_the_default_and_the_flag_wins(tmp_path):
    from mlxcel_py.models import load_model
    from tiny import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "mean.gguf", metadata={"llama.pooling_type": mx.array(1, dtype=mx.uint32)})
    loaded = load_model(str(path))
    assert loaded.pooling == "mean" and tiny_model().pooling is None
    for flag, want in ((None, "mean"), ("cls", "cls")):
        running = start_server(model=loaded, pooling=flag)
        try:
            with running.client() as c:
                data = c.post("/v1/embeddings", json={"input": TEXTS[0]}).json()["data"]
        finally:
            stop_server(running)
        np.testing.assert_allclose(data[0]["embedding"], direct(TEXTS[0], want), atol=1e-5)


def test_a_batch_bigger_than_the_queue_runs_in_waves():
    running = start_server(max_queue=4, parallel=2)
    texts = [f"text number {i}" for i in range(11)]
    try:
        with running.client() as c:
            many = c.post("/v1/embeddings", json={"input": texts}).json()["data"]
            alone = c.post("/v1/embeddings", json={"input": texts[7]}).json()["data"][0]["embedding"]
            too_many = c.post("/v1/embeddings", json={"input": ["x"] * 2049})
    finally:
        stop_server(running)
    assert [d["index"] for d in many] == list(range(11))
    np.testing.assert_allclose(many[7]["embedding"], alone, atol=1e-5)
    assert too_many.status_code == 400 and "at most 2048" in error_of(too_many)["message"]
