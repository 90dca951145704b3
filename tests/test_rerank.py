"""Reranking: the Qwen3-Reranker-style fixture (qwen3rank-f16.gguf: pooling_type rank, a two-row cls.output,
the rerank template) against llama-server's scores recorded by scripts/make_rerank_fixture.py, against a
second implementation (mlx-lm's forward of the whole prompt and the head in numpy), and every body shape and
refusal of /v1/rerank."""

from __future__ import annotations

import json
import threading

import mlx.core as mx
import numpy as np
import pytest

from gguf_fixtures import FIXTURES
from server_helpers import error_of, start_server, stop_server

RECORD = json.loads((FIXTURES / "qwen3rank_llama_server.json").read_text())
CASES = RECORD["cases"]
LLAMA_TOLERANCE = 1e-3  # measured: at most 2e-4 apart (llama.cpp's f16 products against our float32)
CTX = 1024  # two slots of 512: the longest recorded prompt (455 tokens) fits one
PATHS = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking", "/v2/rerank")


@pytest.fixture(scope="module")
def loaded():
    from mlxcel_py.models import load_model

    return load_model(str(FIXTURES / "qwen3rank-f16.gguf"))


@pytest.fixture(scope="module")
def server(loaded):
    # Pieces of 16 split every prompt (228-455 tokens): the head reads the last piece's last position.
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=16, ctx_size=CTX)
    yield running
    stop_server(running)


def _rank(client, case, path="/v1/rerank", **extra):
    resp = client.post(path, json={"query": case["query"], "documents": case["documents"], **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _by_index(results, key="relevance_score"):
    return {r["index"]: r[key] for r in results}


def test_the_fixture_reads_as_a_reranker_whose_prompts_are_llama_servers(loaded):
    from mlxcel_py.server.rerank.prepare import pair_ids

    head = loaded.rank_head
    assert loaded.pooling == "rank" and head.labels == ("yes", "no") and head.softmax
    assert head.out.shape == (2, 64) and head.dense is None and "{query}" in head.template
    for case in CASES:  # llama-server's /tokenize of each templated pair, special tokens parsed
        assert [pair_ids(loaded, head, case["query"], d) for d in case["documents"]] == case["tokens"]


def test_scores_agree_with_llama_server(server):
    with server.client() as client:
        for case in CASES:
            got = _rank(client, case, top_n=len(case["documents"]))
            assert [r["index"] for r in got["results"]] == [r["index"] for r in case["results"]]
            ours, theirs = _by_index(got["results"]), _by_index(case["results"])
            assert max(abs(ours[i] - theirs[i]) for i in theirs) < LLAMA_TOLERANCE, (ours, theirs)
            assert got["usage"] == case["usage"]


def test_the_chunked_engine_score_is_the_head_over_one_whole_forward(server, loaded):
    """A second implementation: mlx-lm's forward of the whole prompt, the last position's normed state,
    softmax(cls.output @ h)[0] in numpy."""
    out = loaded.rank_head.out.astype(np.float64)
    with server.client() as client:
        for case in CASES:
            got = _by_index(_rank(client, case)["results"])
            for i, ids in enumerate(case["tokens"]):
                hidden = np.array(loaded.model.model(mx.array(ids)[None])[0, -1].astype(mx.float32), np.float64)
                logits = out @ hidden
                expected = np.exp(logits[0]) / np.exp(logits).sum()
                assert abs(got[i] - expected) < 1e-5, (i, got[i], expected)


def test_concurrent_requests_score_as_lone_ones(server):
    with server.client() as client:
        alone = [_by_index(_rank(client, case)["results"]) for case in CASES]
        together: list = [None] * len(CASES)

        def run(k):
            together[k] = _by_index(_rank(client, CASES[k])["results"])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(CASES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert together == alone


def test_top_n_documents_and_every_path(server):
    case = CASES[0]
    with server.client() as client:
        full = _rank(client, case)
        assert full["object"] == "list" and full["model"] == server.runtime.model_id
        assert full["id"].startswith("rerank-") and "document" not in full["results"][0]
        scores = [r["relevance_score"] for r in full["results"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == len(case["documents"])
        top = _rank(client, case, top_n=2, return_documents=True, model="any-name")
        assert top["results"] == [{**r, "document": {"text": case["documents"][r["index"]]}}
                                  for r in full["results"][:2]]
        assert top["model"] == "any-name"  # echoed, as llama-server
        for path in PATHS[1:]:
            assert _rank(client, case, path)["results"] == full["results"], path
        as_objects = client.post("/v1/rerank", json={"query": case["query"],
                                                     "documents": [{"text": d} for d in case["documents"]]})
        assert as_objects.json()["results"] == full["results"]
        tei = client.post("/rerank", json={"query": case["query"], "texts": case["documents"], "return_text": True})
        assert tei.json() == [{"index": r["index"], "score": r["relevance_score"],
                               "text": case["documents"][r["index"]]} for r in full["results"]]


def test_the_cohere_client_reranks(server):
    import cohere

    case = CASES[1]
    client = cohere.ClientV2(api_key="unused", base_url=server.url)  # posts to /v2/rerank
    got = client.rerank(model="tiny-reranker", query=case["query"], documents=case["documents"], top_n=2)
    assert [r.index for r in got.results] == [r["index"] for r in case["results"][:2]]
    theirs = _by_index(case["results"])
    assert all(abs(r.relevance_score - theirs[r.index]) < LLAMA_TOLERANCE for r in got.results)


def test_long_documents_are_refused_or_cut_as_asked(server, loaded):
    from mlxcel_py.models import encode_text

    query, long = "capital of France", "Paris, France. " * 200
    fits = server.worker.stats().slot_context - 1
    with server.client() as client:
        resp = client.post("/v1/rerank", json={"query": query, "documents": [long, "short"]})
        assert resp.status_code == 400 and error_of(resp)["param"] == "documents"
        assert "documents[0]" in error_of(resp)["message"] and "truncate" in error_of(resp)["message"]
        cut = _rank(client, {"query": query, "documents": [long]}, truncate=True)["usage"]["prompt_tokens"]
        assert fits - 4 <= cut <= fits
        few = _rank(client, {"query": query, "documents": [long]}, max_tokens_per_doc=8)["usage"]["prompt_tokens"]
    before, _, after = loaded.rank_head.template.partition("{document}")
    around = [len(encode_text(loaded.tokenizer, t.replace("{query}", query), add_special_tokens=False))
              for t in (before, after)]
    assert few == sum(around) + 8


@pytest.mark.parametrize("body, param", [
    ({"documents": ["a"]}, "query"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": [1, 2]}, "documents"),
    ({"query": "q", "documents": ["a"], "texts": ["b"]}, "texts"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["text"]}, "rank_fields"),
    ({"query": "q", "texts": ["a"], "truncation_direction": "Left"}, "truncation_direction"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
])
def test_bad_bodies_are_a_400_naming_the_field(server, body, param):
    with server.client() as client:
        resp = client.post("/v1/rerank", json=body)
        assert resp.status_code == 400, resp.text
        assert param in (error_of(resp)["param"] or "") + error_of(resp)["message"], resp.text
        assert _rank(client, CASES[1])["results"]  # the server goes on


def test_a_reranker_refuses_generation_and_embeddings(server):
    with server.client() as client:
        assert client.get("/v1/models").json()["data"][0]["capabilities"] == ["rerank"]
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/v1/embeddings", {"input": "hi"})):
            resp = client.post(path, json=body)
            assert resp.status_code == 501 and error_of(resp)["type"] == "not_supported_error", path
            assert "reranking model" in error_of(resp)["message"] and "/v1/rerank" in error_of(resp)["message"]


def test_a_model_without_a_head_refuses_reranking_and_rerank_refuses_it():
    from mlxcel_py.errors import ConfigError

    running = start_server()  # the tiny chat model
    try:
        with running.client() as client:
            resp = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
            assert resp.status_code == 501 and error_of(resp)["type"] == "not_supported_error"
            assert "not a reranking model" in error_of(resp)["message"]
    finally:
        stop_server(running)
    with pytest.raises(ConfigError, match="--rerank: .* is not a reranking model"):
        start_server(rerank=True)


def test_rerank_is_a_switch_with_llama_servers_variable():
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError

    assert resolve("serve", flags_for("serve", rerank=True), env={}).server.rerank
    assert resolve("serve", flags_for("serve"), env={"LLAMA_ARG_RERANKING": "1"}).server.rerank
    assert not resolve("serve", flags_for("serve"), env={}).server.rerank
    with pytest.raises(ConfigError, match="--rerank applies to serve"):
        resolve("generate", flags_for("generate", rerank=True), env={})


def test_the_fields_table_is_exact():
    """docs/RERANK.md's table: every field of the body once, with rerank/fields.py's status."""
    import re
    from pathlib import Path

    from mlxcel_py.server.rerank.fields import FIELDS
    from mlxcel_py.server.rerank.schemas import RerankRequest

    docs = (Path(__file__).parents[1] / "docs" / "RERANK.md").read_text()
    table: dict[str, dict[str, str]] = {"/v1/rerank": {}}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] in ("honoured", "refused", "ignored") and cells[1] in table:
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                assert name not in table[cells[1]], name
                table[cells[1]][name] = cells[2]
    assert table == FIELDS
    assert set(table["/v1/rerank"]) == set(RerankRequest.model_fields)


def test_a_reranker_beside_a_chat_model(server):
    """Several models: the body's `model` picks the reranker or the chat model; each refuses the other's route."""
    from test_server_models import LLAMA, PROMPT, Many

    from mlxcel_py.errors import ConfigError

    case = CASES[1]
    with server.client() as client:
        alone = _rank(client, case)["results"]
    case = {"query": case["query"], "documents": case["documents"]}
    many = Many(f"rank={FIXTURES / 'qwen3rank-f16.gguf'}", f"chat={LLAMA}", ctx_size=CTX, parallel=2)
    try:
        with many.client() as client:
            got = client.post("/v1/rerank", json={**case, "model": "rank"})
            assert got.status_code == 200 and got.json()["model"] == "rank", got.text
            routed = got.json()["results"]  # whole prompts here, pieces of 16 in `server`: within 1e-5
            assert [r["index"] for r in routed] == [r["index"] for r in alone]
            assert all(abs(a["relevance_score"] - b["relevance_score"]) < 1e-5 for a, b in zip(routed, alone))
            assert client.post("/v1/completions", json={**PROMPT, "model": "chat"}).status_code == 200
            refused = client.post("/v1/rerank", json={**case, "model": "chat"})
            assert refused.status_code == 501 and "chat is not a reranking model" in error_of(refused)["message"]
            refused = client.post("/v1/completions", json={**PROMPT, "model": "rank"})
            assert refused.status_code == 501 and "rank is a reranking model" in error_of(refused)["message"]
    finally:
        many.stop()
    with pytest.raises(ConfigError, match="--rerank names one reranking model"):
        from config_helpers import flags_for
        from mlxcel_py.config import resolve

        resolve("serve", flags_for("serve", model=f"a={LLAMA}", extra_models=[f"b={LLAMA}"], rerank=True), env={})
