"""The qwen3 reasoning fixture (thinking_fixture.py) on the OpenAI chat and Anthropic routes:
--reasoning-budget N and the requests' budgets end the thinking after N tokens by forcing
</think>, budget 0 turns it off, and a JSON schema or a forced tool call constrains only the
answer that follows, streamed and not. The fixture's prompt opens <think>, so a greedy reply
thinks until the budget closes it; the reference is the same reply without a budget."""

import json

import anthropic
import jsonschema
import pytest

from server_helpers import GREEDY, start_server, stop_server, stream_post
from thinking_fixture import thinking_model

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
       "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
BUDGET = 4


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=1, model=thinking_model(), reasoning_budget=BUDGET)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(srv):
    with srv.client() as c:
        yield c


def _chat(client, **extra) -> dict:
    resp = client.post(CHAT, json={"messages": MSG, "max_tokens": 24, **GREEDY, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def _unbudgeted(client, num_tokens: int, **extra) -> str:
    """The first `num_tokens` of the reply without a budget, thinking marker and all."""
    return _chat(client, max_tokens=num_tokens, thinking_budget_tokens=-1, reasoning_format="none", **extra)[
        "message"]["content"]


def _streamed(client, **extra) -> tuple[str, str, list]:
    body = {"messages": MSG, "max_tokens": 24, "stream": True, **GREEDY, **extra}
    deltas = [c["choices"][0]["delta"] for c in stream_post(client, CHAT, body) if isinstance(c, dict) and c["choices"]]
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            [call for d in deltas for call in d.get("tool_calls", [])])


def test_the_server_budget_forces_the_end_marker_after_n_thinking_tokens(client):
    thought = _unbudgeted(client, BUDGET)
    raw = _chat(client, reasoning_format="none")["message"]["content"]
    assert raw.startswith(thought + "</think>") and len(raw) > len(thought + "</think>")
    split = _chat(client)
    assert split["message"]["reasoning_content"] == thought.strip()
    assert raw.endswith(split["message"]["content"]) and split["message"]["content"]
    assert _streamed(client) == (thought.strip(), split["message"]["content"], [])


def test_a_requests_budget_wins_over_the_servers(client):
    thought = _unbudgeted(client, 2)
    assert _chat(client, thinking_budget_tokens=2)["message"]["reasoning_content"] == thought.strip()
    unlimited = _chat(client, thinking_budget_tokens=-1, max_tokens=12)
    assert unlimited["message"]["content"] == "" and unlimited["finish_reason"] == "length"  # all thinking


def test_budget_zero_in_a_request_turns_the_templates_thinking_off(client):
    off = client.post("/apply-template", json={"messages": MSG, "chat_template_kwargs": {"enable_thinking": False}})
    tokens = client.post("/tokenize", json={"content": off.json()["prompt"]}).json()["tokens"]
    resp = client.post(CHAT, json={"messages": MSG, "max_tokens": 6, **GREEDY, "thinking_budget_tokens": 0}).json()
    assert resp["usage"]["prompt_tokens"] == len(tokens) and off.json()["prompt"].endswith("<think>\n\n</think>\n\n")
    assert "reasoning_content" not in resp["choices"][0]["message"]


@pytest.mark.parametrize("value", [-2, "8", 1.5])
def test_a_bad_budget_is_a_400_naming_it(client, value):
    resp = client.post(CHAT, json={"messages": MSG, "thinking_budget_tokens": value})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "thinking_budget_tokens"


def test_a_schema_constrains_only_the_answer_after_the_thinking(client):
    thought = _unbudgeted(client, BUDGET)
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    choice = _chat(client, response_format=fmt, max_tokens=60)
    assert choice["finish_reason"] == "stop" and choice["message"]["reasoning_content"] == thought.strip()
    jsonschema.validate(json.loads(choice["message"]["content"]), CITY)
    reasoning, content, _ = _streamed(client, response_format=fmt, max_tokens=60)
    assert (reasoning, content) == (thought.strip(), choice["message"]["content"])


def test_a_forced_tool_call_parses_with_the_thinking_present(client):
    choice = _chat(client, tools=TOOLS, tool_choice="required", max_tokens=300)
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "add"
    jsonschema.validate(json.loads(call["function"]["arguments"]), ADD)
    reasoning, content, calls = _streamed(client, tools=TOOLS, tool_choice="required", max_tokens=300)
    assert (reasoning, content) == (choice["message"]["reasoning_content"], "")
    assert "".join(c["function"].get("arguments", "") for c in calls) == call["function"]["arguments"]


@pytest.fixture(scope="module")
def claude(srv):
    with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0, timeout=60) as c:
        yield c


def _message(claude, **kwargs):
    return claude.messages.create(**{"model": "m", "max_tokens": 24, "messages": MSG, "extra_body": GREEDY, **kwargs})


def test_anthropic_budget_tokens_cut_the_thinking_block(client, claude):
    thought = _unbudgeted(client, 2)
    msg = _message(claude, thinking={"type": "enabled", "budget_tokens": 2})
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == thought.strip()
    with claude.messages.stream(**{"model": "m", "max_tokens": 24, "messages": MSG, "extra_body": GREEDY,
                                   "thinking": {"type": "enabled", "budget_tokens": 2}}) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == \
        [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in msg.content]
    server_default = _message(claude)  # no budget_tokens: --reasoning-budget's
    assert server_default.content[0].thinking == _unbudgeted(client, BUDGET).strip()


def test_anthropic_forced_tool_use_follows_the_thinking(claude):
    tools = [{"name": "add", "input_schema": ADD}]
    msg = _message(claude, tools=tools, tool_choice={"type": "tool", "name": "add"}, max_tokens=300)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"] and msg.stop_reason == "tool_use"
    jsonschema.validate(msg.content[1].input, ADD)
