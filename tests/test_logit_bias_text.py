"""logit_bias keyed by text, as llama-server: the text is tokenized without special tokens and
each of its tokens biased; `false` bans (-inf); every entry's bias is added. Unit (the ids
that reach the engine, on the tiny model's tokenizer) and over HTTP (a text ban changes the
greedy reply exactly as the same ids given numerically)."""

import math

import pytest

from mlxcel_py.errors import FieldError
from mlxcel_py.models import encode_text
from mlxcel_py.server.generation.sampling import logit_bias_pairs
from server_helpers import GREEDY, error_of, start_server, stop_server
from tiny import tiny_model

INF = -math.inf


def ids(text):
    return encode_text(tiny_model().tokenizer, text, add_special_tokens=False)


def test_text_keys_become_their_tokens():
    tok = tiny_model().tokenizer
    fox = ids(" the fox")
    assert len(fox) == 2
    assert logit_bias_pairs({" the fox": -5}, tok) == tuple((t, -5.0) for t in fox)
    assert logit_bias_pairs([[" the fox", False]], tok) == tuple((t, INF) for t in fox)
    # ids stay ids (strtol's reading: leading spaces and a sign allowed), in either form
    assert logit_bias_pairs({" 15": 2, "+7": 1}, tok) == ((15, 2.0), (7, 1.0))
    assert logit_bias_pairs([[15, 2], ["7", 1]], tok) == ((15, 2.0), (7, 1.0))


def test_repeated_tokens_add_up_as_in_llama_server():
    tok = tiny_model().tokenizer
    the = ids(" the")
    assert len(the) == 1 and ids(" the the") == the * 2
    assert logit_bias_pairs({" the the": -3, str(the[0]): 1}, tok) == ((the[0], -5.0),)
    assert logit_bias_pairs([[" the", 5], [" the", False]], tok) == ((the[0], INF),)


@pytest.mark.parametrize("value, message", [
    ({"": 1}, "logit_bias['']: the logit_bias text '' has no tokens"),
    ([[1.5, 1]], "logit_bias[0]: logit_bias keys must be token ids or text (got 1.5)"),
    ([[" the", True]], "logit_bias[0]: a bias must be a number or false (got True)"),
    ([[" the", 1, 2]], "logit_bias[0]: must be a [token id or text, bias] pair (got [' the', 1, 2])"),
])
def test_bad_entries_are_named(value, message):
    with pytest.raises(FieldError) as info:
        logit_bias_pairs(value, tiny_model().tokenizer)
    assert str(info.value) == message and info.value.param == "logit_bias"


def test_without_a_tokenizer_text_keys_are_refused():
    with pytest.raises(FieldError, match="logit_bias keys must be token ids"):
        logit_bias_pairs({" the": 1})


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=1)
    with running.client() as client:
        yield client
    stop_server(running)


def _reply(http, path, body):
    resp = http.post(path, json=body)
    assert resp.status_code == 200, resp.text
    reply = resp.json()
    return reply["content"] if path == "/completion" else reply["choices"][0]["text"]


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_a_text_ban_changes_the_greedy_reply_as_its_ids_do(http, path):
    body = {"prompt": "Paris is the", "max_tokens": 6, "ignore_eos": True, "cache_prompt": False, **GREEDY}
    assert _reply(http, path, body) == " in" * 6  # the tiny model's greedy continuation
    (in_,) = ids(" in")
    by_id = _reply(http, path, {**body, "logit_bias": [[in_, False]]})
    assert " in" not in by_id
    for bias in ([[" in", False]], {" in": False}, {" in": -100}, {str(in_): -100}):
        assert _reply(http, path, {**body, "logit_bias": bias}) == by_id
    # a finite bias by text equals the same ids given numerically (a boost this time)
    boost = ids(" lazy dog")
    by_text = _reply(http, path, {**body, "logit_bias": {" lazy dog": 8}})
    assert by_text == _reply(http, path, {**body, "logit_bias": {str(t): 8 for t in boost}}) != " in" * 6


def test_chat_takes_text_keys_and_generation_settings_report_them(http):
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **GREEDY}
    boosted = http.post("/v1/chat/completions", json={**chat, "logit_bias": {" in": 100}})
    assert boosted.status_code == 200 and boosted.json()["choices"][0]["message"]["content"] == " in" * 4
    settings = http.post("/completion", json={"prompt": "x", "n_predict": 1, "logit_bias": [[" in", False], [7, 2]]}
                         ).json()["generation_settings"]
    assert settings["logit_bias"] == [{"bias": None, "token": ids(" in")[0]}, {"bias": 2.0, "token": 7}]


def test_a_bad_text_entry_is_a_400_naming_logit_bias(http):
    resp = http.post("/completion", json={"prompt": "x", "logit_bias": [["", 1]]})
    assert resp.status_code == 400 and error_of(resp)["param"] == "logit_bias"
    assert "has no tokens" in error_of(resp)["message"]
