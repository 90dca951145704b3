"""A BERT cross-encoder reranker (bertrank-f16.gguf: llama.cpp's `bert` architecture, a WordPiece vocabulary,
cls + cls.output) against llama-server's tokens and scores recorded by scripts/make_bert_rerank_fixture.py,
and against a second implementation: the encoder written out in numpy over the GGUF's own tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gguf_fixtures import FIXTURES
from server_helpers import start_server, stop_server

PATH = FIXTURES / "bertrank-f16.gguf"
RECORD = json.loads((FIXTURES / "bertrank_llama_server.json").read_text())
CASES = RECORD["cases"]
LLAMA_TOLERANCE = 2e-3  # measured: at most 7.6e-4 apart (llama.cpp's f16 products and GELU table)


@pytest.fixture(scope="module")
def loaded():
    from mlxcel_py.models import load_model

    return load_model(str(PATH))


@pytest.fixture(scope="module")
def server(loaded):
    # Pieces of 16 would split every pair; an encoder's prompt must run whole.
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=16, ctx_size=1024)
    yield running
    stop_server(running)


def _layer_norm(x, w, b, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def numpy_score(ids: list[int]) -> float:
    """The encoder and llama.cpp's rank head (src/models/bert.cpp, build_pooling) in float64 numpy."""
    from gguf import GGUFReader

    reader = GGUFReader(PATH)
    t = {x.name: np.asarray(x.data, np.float64).reshape(tuple(int(n) for n in reversed(x.shape.tolist())))
         for x in reader.tensors}
    heads = int(reader.fields["bert.attention.head_count"].contents())
    x = t["token_embd.weight"][ids] + t["token_types.weight"][0] + t["position_embd.weight"][: len(ids)]
    x = _layer_norm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"])
    for i in range(int(reader.fields["bert.block_count"].contents())):
        def lin(name, v):
            return v @ t[f"blk.{i}.{name}.weight"].T + t[f"blk.{i}.{name}.bias"]

        q, k, v = (lin(n, x).reshape(len(ids), heads, -1).transpose(1, 0, 2) for n in ("attn_q", "attn_k", "attn_v"))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = lin("attn_output", (att @ v).transpose(1, 0, 2).reshape(len(ids), -1))
        h = _layer_norm(x + o, t[f"blk.{i}.attn_output_norm.weight"], t[f"blk.{i}.attn_output_norm.bias"])
        x = _layer_norm(h + lin("ffn_down", _gelu(lin("ffn_up", h))), t[f"blk.{i}.layer_output_norm.weight"],
                        t[f"blk.{i}.layer_output_norm.bias"])
    y = np.tanh(t["cls.weight"] @ x[0] + t["cls.bias"])
    return float((t["cls.output.weight"] @ y + t["cls.output.bias"])[0])


def test_the_wordpiece_vocabulary_tokenizes_as_llama_server(loaded):
    from mlxcel_py.models import encode_text

    for case in CASES:  # accents, unknown words and punctuation among them
        for text, plain, special in zip([case["query"], *case["documents"]], case["tokens"],
                                        case["tokens_with_special"]):
            assert list(encode_text(loaded.tokenizer, text, add_special_tokens=False)) == plain, text
            assert list(encode_text(loaded.tokenizer, text)) == special, text


def test_the_fixture_reads_as_an_encoder_reranker(loaded):
    head = loaded.rank_head
    assert not loaded.causal and loaded.pooling == "rank"
    assert head.first_token and head.add_sep and head.sep_token_id == 3 and not head.softmax
    assert head.dense.shape == (64, 64) and head.out.shape == (1, 64) and head.template is None


def test_scores_agree_with_llama_server_and_with_numpy(server, loaded):
    from mlxcel_py.server.rerank.prepare import pair_ids

    with server.client() as client:
        for case in CASES:
            got = client.post("/v1/rerank", json={"query": case["query"], "documents": case["documents"],
                                                  "top_n": len(case["documents"])}).json()
            assert [r["index"] for r in got["results"]] == [r["index"] for r in case["results"]]
            assert got["usage"] == case["usage"]
            theirs = {r["index"]: r["relevance_score"] for r in case["results"]}
            for r in got["results"]:
                assert abs(r["relevance_score"] - theirs[r["index"]]) < LLAMA_TOLERANCE
                # [CLS] query [SEP] document (llama.cpp's pair), run whole though the server's pieces are 16 tokens
                ids = pair_ids(loaded, loaded.rank_head, case["query"], case["documents"][r["index"]])
                assert ids[0] == 2 and ids.count(3) == 1
                assert abs(r["relevance_score"] - numpy_score(ids)) < 1e-4, r


def test_an_encoder_prompt_is_one_piece_and_a_causal_one_is_not(loaded):
    from mlxcel_py.config import resolve
    from mlxcel_py.engine import Embedding, EngineWorker, Finished, PromptProgress, Request, build_engine
    from config_helpers import flags_for

    ids = tuple(range(5, 45))
    worker = EngineWorker(build_engine(resolve("serve", flags_for("serve", prefill_chunk_size=16), env={}).engine,
                                       loaded)).start()
    try:
        handle = worker.submit(Request("r", ids, pooling="rank", whole_prompt=True))
        events = []
        while not events or not isinstance(events[-1], Finished):
            events.append(handle.get(timeout=60))
    finally:
        worker.stop()
    assert [e.processed for e in events if isinstance(e, PromptProgress)] in ([], [40])
    (score,) = [e.vector for e in events if isinstance(e, Embedding)]
    assert abs(float(score[0]) - numpy_score(list(ids))) < 1e-4


def test_an_encoder_reranker_refuses_generation(server):
    with server.client() as client:
        resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 501 and "reranking model" in resp.json()["error"]["message"]


@pytest.mark.parametrize("command", [["generate", "hi"], ["run"]])
def test_generate_and_run_refuse_a_reranker_in_one_line(command):
    from typer.testing import CliRunner

    from mlxcel_py.cli.app import app

    args = [command[0], "-m", str(PATH), *command[1:]]
    result = CliRunner().invoke(app, args, input="hi\n")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[-1] == (f"error: {command[0]}: bertrank-f16 is a reranking model; use /v1/rerank "
                         "(serve it with `mlxcel-py serve`)"), result.output
