"""Reasoning in the Responses API: a reasoning model's thinking as a `reasoning` output item before
the message (streamed with response.reasoning_text.* events), reasoning_tokens counted, and
`reasoning.effort` "none" turning the template's thinking off; with the opening template of
test_server_thinking.py, so the tiny model's greedy output is thinking."""

import httpx
import openai
import pytest

from mlxcel_py.engine import Finished, TokenDelta
from mlxcel_py.engine.core.events import Timings, Usage
from mlxcel_py.server.generation.assembler import Assembler, Shape
from mlxcel_py.server.generation.reasoning import ReasoningMarkers, ReasoningStart
from mlxcel_py.server.responses.conversation import input_messages, output_messages
from mlxcel_py.server.responses.schemas import ResponsesRequest
from server_helpers import GREEDY, start_server, stop_server
from test_server_thinking import HELLO, OPENING

QUESTION = HELLO[0]["content"]


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=1, chat_template=OPENING, chat_template_kwargs='{"enable_thinking": true}')
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(srv):
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _chat(srv, **extra) -> dict:
    body = {"messages": HELLO, "max_tokens": 12, **GREEDY, **extra}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]


def test_the_thinking_is_a_reasoning_item_before_the_message(srv, client):
    expected = _chat(srv)
    assert expected["reasoning_content"]
    resp = client.responses.create(model="m", input=QUESTION, max_output_tokens=12, temperature=0.0)
    kinds = [item.type for item in resp.output]
    assert kinds == ["reasoning", "message"]
    reasoning = resp.output[0]
    assert reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", expected["reasoning_content"])]
    assert resp.output_text == (expected["content"] or "")
    # The output never left the thinking: every generated token is a reasoning token.
    assert resp.usage.output_tokens_details.reasoning_tokens == resp.usage.output_tokens == 12
    with client.responses.stream(model="m", input=QUESTION, max_output_tokens=12, temperature=0.0) as stream:
        events = list(stream)
    final = events[-1].response  # response.incomplete: cut by max_output_tokens
    types = [e.type for e in events]
    assert types[-1] == "response.incomplete" and final.status == "incomplete"
    assert types[2:5] == ["response.output_item.added", "response.content_part.added",
                          "response.reasoning_text.delta"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        next(e.text for e in events if e.type == "response.reasoning_text.done") == expected["reasoning_content"]
    assert [(c.type, c.text) for c in final.output[0].content] == [(c.type, c.text) for c in reasoning.content]
    assert final.usage.output_tokens_details.reasoning_tokens == 12


def test_effort_none_turns_the_thinking_off_and_others_are_a_400(srv, client):
    resp = client.responses.create(model="m", input=QUESTION, max_output_tokens=12, temperature=0.0,
                                   reasoning={"effort": "none"})
    expected = _chat(srv, chat_template_kwargs={"enable_thinking": False})
    assert [item.type for item in resp.output] == ["message"] and resp.output_text == expected["content"]
    assert resp.usage.output_tokens_details.reasoning_tokens == 0 and resp.reasoning.effort == "none"
    medium = client.responses.create(model="m", input=QUESTION, max_output_tokens=4, reasoning={"effort": "medium"})
    assert medium.output[0].type == "reasoning"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input=QUESTION, reasoning={"effort": "high"})
    assert info.value.body["param"] == "reasoning"
    assert 'effort "high" is not supported by this server (it cannot vary how long' in info.value.body["message"]


def test_reasoning_items_are_the_next_assistant_turns_reasoning():
    body = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Greet."}]},
        {"role": "assistant", "content": "Hello."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call it."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]})
    assert input_messages(body.input) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
        {"role": "assistant", "content": None, "reasoning_content": "Call it.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    output = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Think."}]},
              {"type": "message", "content": [{"type": "output_text", "text": "Paris."}]}]
    assert output_messages(output) == [{"role": "assistant", "content": "Paris.", "reasoning_content": "Think."}]


def test_reasoning_tokens_count_the_thinking_and_its_markers():
    assembler = Assembler(Shape(reasoning=ReasoningStart(ReasoningMarkers("<think>", "</think>"))))
    pieces = ["<think>", "\nplan", "</think>", "\n\n", "Paris", "."]
    for i, piece in enumerate(pieces):
        assembler.feed(TokenDelta("r", i, piece))
    assembler.feed(Finished("r", "stop", Usage(1, len(pieces), 0), Timings(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)))
    assert assembler.reasoning_tokens == 3
