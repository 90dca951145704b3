"""The qwen3 reasoning fixture (thinking_fixture.py) on the Responses and Ollama routes:
--reasoning-budget N ends the thinking (a `reasoning` item, Ollama's `thinking`), and a JSON
schema constrains only the answer after it, streamed and not; Responses' strict tools with
tool_choice auto: free text until the model opens a call, then the call's schema. The
fixture's prompt opens <think>, so a greedy reply thinks until the budget closes it."""

import json

import jsonschema
import pytest

from server_helpers import GREEDY, start_server, stop_server, stream_post
from test_server_reasoning_budget import ADD, BUDGET, CITY, MSG
from thinking_fixture import thinking_model, token_id

RESPONSES = "/v1/responses"
ASK = MSG[0]["content"]
CITY_FORMAT = {"format": {"type": "json_schema", "name": "city", "schema": CITY}}


@pytest.fixture(scope="module")
def client():
    running = start_server(parallel=1, model=thinking_model(), reasoning_budget=BUDGET)
    with running.client() as c:
        yield c
    stop_server(running)


def _thought(client, num_tokens: int) -> str:
    """The reply's first `num_tokens` without a budget (the chat route's, same prompt), stripped."""
    body = {"messages": MSG, "max_tokens": num_tokens, "thinking_budget_tokens": -1, "reasoning_format": "none",
            **GREEDY}
    return client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"].strip()


def _respond(client, **extra) -> dict:
    resp = client.post(RESPONSES, json={"input": ASK, "max_output_tokens": 60, **GREEDY, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_responses_reasoning_item_cut_by_the_budget_then_a_schema_valid_answer(client):
    out = _respond(client, text=CITY_FORMAT)
    reasoning, message = out["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == _thought(client, BUDGET)
    assert out["status"] == "completed" and out["usage"]["output_tokens_details"]["reasoning_tokens"] == BUDGET + 1
    jsonschema.validate(json.loads(message["content"][0]["text"]), CITY)
    events = stream_post(client, RESPONSES, {"input": ASK, "max_output_tokens": 60, **GREEDY, "text": CITY_FORMAT})
    deltas = {kind: "".join(e["delta"] for e in events if isinstance(e, dict) and e.get("type") == kind)
              for kind in ("response.reasoning_text.delta", "response.output_text.delta")}
    assert deltas == {"response.reasoning_text.delta": reasoning["content"][0]["text"],
                      "response.output_text.delta": message["content"][0]["text"]}


def _ollama(client, **extra) -> dict:
    body = {"model": "m", "messages": MSG, "stream": False, "options": {"temperature": 0, "num_predict": 60}, **extra}
    resp = client.post("/api/chat", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_ollama_thinking_cut_by_the_budget_then_a_schema_valid_answer(client):
    reply = _ollama(client, format=CITY)
    assert reply["message"]["thinking"] == _thought(client, BUDGET) and reply["done_reason"] == "stop"
    jsonschema.validate(json.loads(reply["message"]["content"]), CITY)
    with client.stream("POST", "/api/chat", json={"model": "m", "messages": MSG, "format": CITY,
                                                  "options": {"temperature": 0, "num_predict": 60}}) as resp:
        pieces = [json.loads(line) for line in resp.iter_lines() if line]
    assert "".join(p["message"].get("thinking", "") for p in pieces) == reply["message"]["thinking"]
    assert "".join(p["message"]["content"] for p in pieces) == reply["message"]["content"]


def test_ollama_think_false_leaves_no_thinking(client):
    reply = _ollama(client, think=False)
    assert "thinking" not in reply["message"] and reply["message"]["content"]


STRICT = {"type": "function", "name": "add", "strict": True, "parameters": ADD}


@pytest.fixture(scope="module")
def eager():
    """The fixture with every reply biased towards <tool_call>: the model opens a call at once."""
    bias = ((token_id(thinking_model(), "<tool_call>"), 50.0),)
    running = start_server(parallel=1, model=thinking_model(), reasoning_budget=BUDGET, sampling={"logit_bias": bias})
    with running.client() as c:
        yield c
    stop_server(running)


def _calls(out: dict) -> list:
    return [item for item in out["output"] if item["type"] == "function_call"]


@pytest.mark.parametrize("reasoning", [{"effort": "none"}, None])
def test_a_strict_tool_with_auto_holds_the_call_the_model_opens_to_its_schema(eager, reasoning):
    out = _respond(eager, tools=[STRICT], max_output_tokens=300, **({"reasoning": reasoning} if reasoning else {}))
    (call,) = _calls(out)
    assert call["name"] == "add" and out["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), ADD)
    if reasoning is None:  # <tool_call> inside the thinking opens nothing: the grammar waits for the answer
        assert out["output"][0]["content"][0]["text"] == "<tool_call>" * BUDGET
    loose = _respond(eager, tools=[{**STRICT, "strict": False}], max_output_tokens=40, reasoning={"effort": "none"})
    assert not _calls(loose)  # without the grammar the biased model writes no valid call
