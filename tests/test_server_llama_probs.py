"""/completion's n_probs and post_sampling_probs: llama-server's `completion_probabilities`
(server-task.cpp's probs_vector_to_json), whole and streamed, on the tiny model."""

import math

import pytest

from mlxcel_py.server.llama.probs import utf8_text
from server_helpers import GREEDY, error_of, start_server, stop_server, stream_post

BODY = {"prompt": "The quick brown fox", "n_predict": 6, "ignore_eos": True, "cache_prompt": False,
        "return_tokens": True, **GREEDY}
ENTRY = {"id", "token", "bytes", "logprob", "top_logprobs"}
ALTERNATIVE = {"id", "token", "bytes", "logprob"}


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=2)
    with running.client() as client:
        yield client
    stop_server(running)


def complete(http, **extra):
    resp = http.post("/completion", json={**BODY, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_utf8_text_drops_a_cut_character_as_validate_utf8():
    assert utf8_text("€".encode()) == "€" and utf8_text(b"a\xe2\x82") == "a" and utf8_text(b"\xe2") == ""
    assert utf8_text(b"\xc3\xa9") == "é" and utf8_text(b"\x80") == "\ufffd"


def test_completion_probabilities_shape_and_values(http):
    body = complete(http, n_probs=3)
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == body["tokens"] and len(probs) == 6
    for p in probs:
        assert set(p) == ENTRY and all(set(a) == ALTERNATIVE for a in p["top_logprobs"])
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]  # greedy: the best
        values = [a["logprob"] for a in p["top_logprobs"]]
        assert values == sorted(values, reverse=True) and p["logprob"] == values[0] < 0
        assert bytes(p["bytes"]).decode("utf-8", "replace").startswith(p["token"]) or p["token"] == ""
    # the same numbers as the OpenAI route's logprobs (one engine, one definition)
    oai = http.post("/v1/completions", json={"prompt": BODY["prompt"], "max_tokens": 6, "ignore_eos": True,
                                             "logprobs": 3, **GREEDY}).json()["choices"][0]["logprobs"]
    assert [p["logprob"] for p in probs] == oai["token_logprobs"]
    settings = body["generation_settings"]
    assert (settings["n_probs"], settings["post_sampling_probs"]) == (3, False)
    assert "completion_probabilities" not in complete(http)  # n_probs 0: none, as llama-server


def test_streamed_frames_carry_their_tokens_probabilities(http):
    whole = complete(http, n_probs=2)
    frames = stream_post(http, "/completion", {**BODY, "n_probs": 2})
    partial, final = frames[:-1], frames[-1]
    streamed = [p for f in partial for p in f["completion_probabilities"]]
    assert streamed == whole["completion_probabilities"]
    assert all(len(f["completion_probabilities"]) == len(f["tokens"]) for f in partial)
    assert "completion_probabilities" not in final and final["stop"] is True  # as llama-server's stream


def test_post_sampling_probs_greedy_is_certain(http):
    body = complete(http, n_probs=4, post_sampling_probs=True)
    for p in body["completion_probabilities"]:
        assert set(p) == {"id", "token", "bytes", "prob", "top_probs"}
        assert p["prob"] == 1.0 and [(a["id"], a["prob"]) for a in p["top_probs"]] == [(p["id"], 1.0)]
    assert body["generation_settings"]["post_sampling_probs"] is True


def test_post_sampling_probs_after_the_filters(http):
    sampled = {"temperature": 0.9, "top_k": 3, "seed": 11}
    body = complete(http, n_probs=5, post_sampling_probs=True, **sampled)
    pre = complete(http, n_probs=5, **sampled)
    assert pre["content"] == body["content"]  # the same draws: only what is reported differs
    for post, raw in zip(body["completion_probabilities"], pre["completion_probabilities"]):
        top = post["top_probs"]
        assert len(top) <= 3 and math.fsum(a["prob"] for a in top) == pytest.approx(1.0, abs=1e-5)
        assert post["prob"] == next(a["prob"] for a in top if a["id"] == post["id"])
        # top-k keeps the 3 best of the pre-sampling ranking, renormalized at temperature 0.9
        best = raw["top_logprobs"][: len(top)]
        assert {a["id"] for a in top} == {a["id"] for a in best}
        norm = math.log(math.fsum(math.exp(a["logprob"] / 0.9) for a in best))
        expect = {a["id"]: math.exp(a["logprob"] / 0.9 - norm) for a in best}
        assert all(a["prob"] == pytest.approx(expect[a["id"]], abs=1e-4) for a in top)


def test_a_stop_string_drops_its_tokens_whole_and_streams_them(http):
    full = complete(http, n_predict=16)
    text = full["content"]
    stop = next(text[i:i + 2] for i in range(1, len(text) - 1) if text[i:i + 2].isalnum())
    whole = complete(http, n_predict=16, n_probs=1, stop=[stop])
    assert whole["stop_type"] == "word"
    kept = [p["id"] for p in whole["completion_probabilities"]]
    assert kept == whole["tokens"][: len(kept)] and len(kept) < len(whole["tokens"])
    frames = stream_post(http, "/completion", {**BODY, "n_predict": 16, "n_probs": 1, "stop": [stop]})
    streamed = [p["id"] for f in frames[:-1] for p in f.get("completion_probabilities", [])]
    assert streamed == whole["tokens"]  # every generated token's, the stop string's last with content ""


def test_response_fields_and_bad_counts(http):
    body = complete(http, n_probs=1, response_fields=["completion_probabilities"])
    assert set(body) == {"completion_probabilities"} and len(body["completion_probabilities"]) == 6
    resp = http.post("/completion", json={**BODY, "n_probs": 21})
    assert resp.status_code == 400 and error_of(resp)["param"] == "n_probs"
    assert error_of(resp)["message"] == "n_probs must be between 0 and 20 (got 21)"
