"""Structured output, tools, logprobs, logit_bias and penalties over HTTP on the tiny model:
every bad value is a 400 naming its field, and streams carry what whole replies carry."""

import json

import jsonschema
import pytest

from mlxcel_py.models import encode_chat, encode_text
from mlxcel_py.tool_calls import tool_format, tool_messages, tool_request
from server_helpers import GREEDY, error_of, start_server, stop_server, stream_post
from tiny import tiny_model

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"], "additionalProperties": False}}}
OTHER = {"type": "function", "function": {"name": "other", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
# Whitespace-free JSON keeps the random model's documents short.
COMPACT = {**SCHEMA, "x-guidance": {"whitespace_flexible": False}}
# (path, extra body fields, param, a fragment of the message)
BAD = {
    "schema that does not compile": (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format", "minimum"),
    "json_schema without a schema": (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                                     "response_format", "schema is required"),
    "unknown response_format type": (CHAT, {"response_format": {"type": "xml"}}, "response_format", "type"),
    "llama-server json_schema bad": (COMPLETIONS, {"json_schema": {"type": "object", "uniqueItems": True,
                                     "properties": {"a": {"type": "array", "uniqueItems": True}}}},
                                     "json_schema", "uniqueItems"),
    "x-guidance not an object": (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "x-guidance": 5}}}}, "response_format", "x-guidance must be an object"),
    "bad GBNF": (CHAT, {"grammar": 'root ::= "a" missing'}, "grammar", "missing"),
    "two constraints": (CHAT, {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
                        "grammar", "only one of"),
    "constraint and ignore_eos": (COMPLETIONS, {"grammar": 'root ::= "a"', "ignore_eos": True}, "ignore_eos", ""),
    "forced tool and a format": (CHAT, {"tools": [PICK], "tool_choice": "required",
                                        "response_format": {"type": "json_object"}}, "tool_choice", "only one of"),
    "unknown tool in tool_choice": (CHAT, {"tools": [PICK], "tool_choice": {"type": "function",
                                           "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    "tool_choice without tools": (CHAT, {"tool_choice": "required"}, "tool_choice", "needs tools"),
    "custom tool": (CHAT, {"tools": [{"type": "custom", "custom": {"name": "c"}}]}, "tools", "tools[0]"),
    "duplicate tool": (CHAT, {"tools": [PICK, PICK]}, "tools", "more than once"),
    "bad tool name": (CHAT, {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "name"),
    "allowed_tools choice": (CHAT, {"tools": [PICK], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}},
                             "tool_choice", "tool_choice must be"),
    "tools and functions": (CHAT, {"tools": [PICK], "functions": [PICK["function"]]}, "functions", "not both"),
    "function_call unknown": (CHAT, {"functions": [PICK["function"]], "function_call": {"name": "nope"}},
                              "function_call", "'nope'"),
    "function_call without functions": (CHAT, {"function_call": {"name": "pick"}}, "function_call", "functions"),
    "logit_bias id out of range": (CHAT, {"logit_bias": {"400": 1}}, "logit_bias", "out of range"),
    "logit_bias text with no tokens": (CHAT, {"logit_bias": {"": 1}}, "logit_bias", "has no tokens"),
    "logit_bias value too big": (CHAT, {"logit_bias": {"15": 101}}, "logit_bias", "between -100 and 100"),
    "logit_bias negative id": (COMPLETIONS, {"logit_bias": [[-1, 1.0]]}, "logit_bias", "non-negative"),
    "logit_bias sum too big": (COMPLETIONS, {"logit_bias": {"15": 60, "015": 60}}, "logit_bias", "(got 120.0"),
    "logit_bias bias a string": (COMPLETIONS, {"logit_bias": [["the", "x"]]}, "logit_bias", "logit_bias[0]"),
    "logit_bias true": (COMPLETIONS, {"logit_bias": [[15, True]]}, "logit_bias", "logit_bias[0]"),
    "logit_bias pair of three": (COMPLETIONS, {"logit_bias": [[15, 1, 2]]}, "logit_bias", ""),
    "logit_bias id not an int": (COMPLETIONS, {"logit_bias": [[1.5, 1]]}, "logit_bias", "token ids"),
    "presence_penalty too big": (CHAT, {"presence_penalty": 2.5}, "presence_penalty", ""),
    "frequency_penalty too small": (COMPLETIONS, {"frequency_penalty": -3}, "frequency_penalty", ""),
    "top_logprobs without logprobs": (CHAT, {"top_logprobs": 3}, "top_logprobs", "needs logprobs"),
    "top_logprobs over 20": (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    "completions logprobs over 20": (COMPLETIONS, {"logprobs": 21}, "logprobs", "between 0 and 20"),
    "completions logprobs negative": (COMPLETIONS, {"logprobs": -1}, "logprobs", "between 0 and 20"),
    "n_probs over 20": (CHAT, {"n_probs": 30}, "n_probs", "between 0 and 20"),
    "n_probs with logprobs": (COMPLETIONS, {"n_probs": 2, "logprobs": 2}, "n_probs", "send one"),
    "max_tokens zero without echo": (COMPLETIONS, {"max_tokens": 0}, "max_tokens", ""),
}
BASE = {CHAT: {"messages": MSG, "max_tokens": 4, **GREEDY},
        COMPLETIONS: {"prompt": "The quick", "max_tokens": 4, **GREEDY}}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=4)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def http(srv):
    with srv.client() as client:
        yield client


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_value_is_a_400_naming_its_field(http, name):
    path, extra, param, fragment = BAD[name]
    resp = http.post(path, json={**BASE[path], **extra})
    assert resp.status_code == 400, resp.text
    error = error_of(resp)
    assert error["param"] == param and fragment in error["message"], error


def _post(http, path, body):
    resp = http.post(path, json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _streamed(http, path, body):
    return [f for f in stream_post(http, path, body)[:-1] if f["choices"]]


def test_a_schema_constrains_both_routes_and_streams_alike(http):
    for path, extra in ((CHAT, {"response_format": {"type": "json_schema", "json_schema": {"schema": COMPACT}}}),
                        (COMPLETIONS, {"json_schema": COMPACT}),
                        (COMPLETIONS, {"response_format": {"type": "json_object", "schema": COMPACT}})):
        body = {**BASE[path], "max_tokens": 64, **extra}
        choice = _post(http, path, body)["choices"][0]
        text = choice["message"]["content"] if path == CHAT else choice["text"]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
        frames = _streamed(http, path, body)
        key = (lambda c: c["delta"].get("content") or "") if path == CHAT else (lambda c: c["text"])
        assert "".join(key(f["choices"][0]) for f in frames) == text


def test_a_gbnf_grammar_constrains_the_reply(http):
    body = {**BASE[COMPLETIONS], "grammar": 'root ::= ("yes" | "no") "!"', "max_tokens": 16, "temperature": 1.0}
    for seed in range(3):
        choice = _post(http, COMPLETIONS, {**body, "seed": seed})["choices"][0]
        assert choice["text"] in ("yes!", "no!") and choice["finish_reason"] == "stop"


def _chat_rows(logprobs):
    return [(e["token"], e["logprob"], e["bytes"], [(a["token"], a["logprob"]) for a in e["top_logprobs"]])
            for e in logprobs["content"]]


def test_chat_logprobs_stream_as_they_come_whole(http):
    body = {**BASE[CHAT], "max_tokens": 8, "ignore_eos": True, "logprobs": True, "top_logprobs": 3}
    choice = _post(http, CHAT, body)["choices"][0]
    rows = _chat_rows(choice["logprobs"])
    assert len(rows) == 8
    for token, logprob, raw, top in rows:
        assert logprob <= 0 and len(top) == 3 and top[0] == (token, logprob)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        assert token == bytes(raw).decode() if not token.startswith("bytes:") else "\\x" in token
    frames = _streamed(http, CHAT, body)
    streamed = [r for f in frames if f["choices"][0]["logprobs"] for r in _chat_rows(f["choices"][0]["logprobs"])]
    assert streamed == rows
    assert b"".join(bytes(r[2]) for r in rows).decode("utf-8", errors="replace") == choice["message"]["content"]
    # llama-server's n_probs asks for the same
    same = _post(http, CHAT, {**body, "logprobs": None, "top_logprobs": None, "n_probs": 3})["choices"][0]
    assert _chat_rows(same["logprobs"]) == rows


def test_echo_with_logprobs_scores_the_prompt_in_the_legacy_shape(http, srv):
    prompt = "The quick brown fox jumps"
    ids = encode_text(srv.runtime.loaded.tokenizer, prompt)
    body = {"prompt": prompt, "max_tokens": 3, "ignore_eos": True, "echo": True, "logprobs": 2, **GREEDY}
    choice = _post(http, COMPLETIONS, body)["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(prompt) and len(lp["tokens"]) == len(ids) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    for token, value, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert top[token] == value and 2 <= len(top) <= 3  # the 2 best, plus the sampled token
    # offsets locate each token in the returned text (the prompt is plain ASCII)
    offsets = lp["text_offset"]
    located = [choice["text"][o : o + len(t)] for t, o in zip(lp["tokens"], offsets)]
    assert located[: len(ids)] == lp["tokens"][: len(ids)]
    assert offsets[len(ids)] == len(prompt) and offsets == sorted(offsets)
    frames = _streamed(http, COMPLETIONS, body)
    assert frames[0]["choices"][0]["text"] == prompt
    streamed = {k: [x for f in frames if f["choices"][0]["logprobs"] for x in f["choices"][0]["logprobs"][k]]
                for k in lp}
    assert streamed == lp
    # max_tokens 0: only the prompt comes back, scored the same
    only = _post(http, COMPLETIONS, {**body, "max_tokens": 0})
    assert only["choices"][0]["text"] == prompt and only["usage"]["completion_tokens"] == 0
    assert only["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"][: len(ids)]


def test_logit_bias_forms_agree_and_ban(http):
    plain = _post(http, COMPLETIONS, {**BASE[COMPLETIONS], "logprobs": 0})["choices"][0]
    first = plain["logprobs"]["tokens"][0]
    token = encode_text(tiny_model().tokenizer, first, add_special_tokens=False)
    assert len(token) == 1
    texts = set()
    for bias in ({str(token[0]): -100}, [[token[0], -100]], [[token[0], False]]):
        texts.add(_post(http, COMPLETIONS, {**BASE[COMPLETIONS], "logit_bias": bias})["choices"][0]["text"])
    assert len(texts) == 1 and not texts.pop().startswith(first)
    boosted = _post(http, COMPLETIONS, {**BASE[COMPLETIONS], "logit_bias": {"65": 100}})["choices"][0]["text"]
    assert boosted == tiny_model().tokenizer.decode([65]) * 4


def test_penalties_change_the_reply_deterministically(http):
    body = {**BASE[COMPLETIONS], "max_tokens": 24, "ignore_eos": True}
    texts = {}
    cases = (("plain", {}), ("presence", {"presence_penalty": 2}), ("frequency", {"frequency_penalty": 0.7}))
    for name, extra in cases:
        texts[name] = [_post(http, COMPLETIONS, {**body, **extra})["choices"][0]["text"] for _ in range(2)]
    assert all(a == b for a, b in texts.values())
    assert len({v[0] for v in texts.values()}) == 3


def test_forced_tool_calls_stream_as_deltas_that_add_up_to_the_whole(http):
    for choice_field in ("required", {"type": "function", "function": {"name": "pick"}}):
        body = {**BASE[CHAT], "tools": [PICK, OTHER], "tool_choice": choice_field, "parallel_tool_calls": False,
                "max_tokens": 600}
        choice = _post(http, CHAT, body)["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls" and message["content"] is None
        (call,) = message["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        if choice_field != "required":
            assert call["function"]["name"] == "pick"
        if call["function"]["name"] == "pick":
            jsonschema.validate(json.loads(call["function"]["arguments"]), PICK["function"]["parameters"])
        frames = _streamed(http, CHAT, body)
        deltas = [c for f in frames for c in f["choices"][0]["delta"].get("tool_calls", [])]
        assert [{k: v for k, v in d.items() if k not in ("index", "id")} for d in deltas] == \
               [{k: v for k, v in call.items() if k != "id"}]
        assert deltas[0]["index"] == 0 and frames[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_deprecated_functions_get_a_function_call(http):
    body = {**BASE[CHAT], "functions": [PICK["function"]], "function_call": {"name": "pick"}, "max_tokens": 600}
    choice = _post(http, CHAT, body)["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    call = choice["message"]["function_call"]
    assert call["name"] == "pick" and json.loads(call["arguments"])["n"] in (1, 2, 3)
    frames = _streamed(http, CHAT, body)
    assert [f["choices"][0]["delta"]["function_call"] for f in frames if "function_call" in f["choices"][0]["delta"]] \
        == [call]


def test_tools_and_tool_results_reach_the_template(http):
    history = [{"role": "user", "content": "Pick one"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": '{"n": 2}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "picked 2"}]
    lm = tiny_model()
    request = tool_request([PICK], "auto")
    messages, tools = tool_messages(history, request, tool_format(lm.tokenizer))
    expected = len(encode_chat(lm.tokenizer, messages, tools=tools).ids)
    got = _post(http, CHAT, {**BASE[CHAT], "messages": history, "tools": [PICK]})["usage"]["prompt_tokens"]
    assert got == expected
    none = _post(http, CHAT, {**BASE[CHAT], "messages": history, "tools": [PICK], "tool_choice": "none"})
    assert none["usage"]["prompt_tokens"] < got  # with tool_choice none the tools are not shown


def test_a_grammar_that_fails_mid_generation_fails_its_request_alone(http):
    """`"a"{50000}` compiles but exceeds one of llguidance's limits at its first token."""
    plain = {**BASE[COMPLETIONS], "max_tokens": 12, "ignore_eos": True}
    before = _post(http, COMPLETIONS, plain)["choices"][0]["text"]
    bad = {**BASE[COMPLETIONS], "grammar": 'root ::= "a"{50000}'}
    resp = http.post(COMPLETIONS, json=bad)
    assert resp.status_code == 500 and "the grammar failed during generation" in error_of(resp)["message"]
    frames = stream_post(http, COMPLETIONS, bad)
    assert frames[-3]["choices"][0]["finish_reason"] == "error" and "grammar" in frames[-2]["error"]["message"]
    assert _post(http, COMPLETIONS, plain)["choices"][0]["text"] == before  # the engine carries on
