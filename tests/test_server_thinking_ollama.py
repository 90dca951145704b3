"""Reasoning in Ollama's API: a reasoning model's thinking as `message.thinking` (/api/chat) and
`thinking` (/api/generate), whole and streamed, `think: false` turning the template's thinking
off, and an earlier turn's `thinking` rendered as its reasoning; with the opening template of
test_server_thinking.py, so the tiny model's greedy output is thinking."""

import httpx
import ollama
import pytest

from mlxcel_py.server.ollama.prepare import openai_messages
from mlxcel_py.server.ollama.schemas import OllamaChatRequest
from server_helpers import GREEDY, start_server, stop_server
from test_server_thinking import HELLO, OPENING

OPTIONS = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=1, chat_template=OPENING, chat_template_kwargs='{"enable_thinking": true}')
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host=srv.url, timeout=60)


def _chat(srv, **extra) -> dict:
    body = {"messages": HELLO, "max_tokens": 12, **GREEDY, **extra}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]


def test_chat_thinking_is_message_thinking(srv, client):
    expected = _chat(srv)
    assert expected["reasoning_content"]
    for think in (None, True):
        reply = client.chat(model="m", messages=HELLO, options=OPTIONS, think=think)
        assert (reply.message.thinking, reply.message.content) == (expected["reasoning_content"],
                                                                    expected.get("content") or "")
    pieces = list(client.chat(model="m", messages=HELLO, options=OPTIONS, stream=True))
    assert "".join(p.message.thinking or "" for p in pieces) == expected["reasoning_content"]
    assert all(p.message.thinking for p in pieces[:-1]) and pieces[-1].done


def test_generate_thinking_is_thinking(srv, client):
    expected = _chat(srv)
    reply = client.generate(model="m", prompt=HELLO[0]["content"], options=OPTIONS)
    assert (reply.thinking, reply.response) == (expected["reasoning_content"], expected.get("content") or "")
    pieces = list(client.generate(model="m", prompt=HELLO[0]["content"], options=OPTIONS, stream=True))
    assert "".join(p.thinking or "" for p in pieces) == expected["reasoning_content"]


def test_think_false_turns_the_templates_thinking_off(srv, client):
    expected = _chat(srv, chat_template_kwargs={"enable_thinking": False})
    reply = client.chat(model="m", messages=HELLO, options=OPTIONS, think=False)
    assert (reply.message.thinking, reply.message.content) == (None, expected["content"])
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="m", prompt="Hi", raw=True, think=False)
    assert info.value.status_code == 400 and "think: false has no effect with raw" in info.value.error


def test_an_earlier_turns_thinking_is_its_reasoning(srv):
    earlier = [*HELLO, {"role": "assistant", "content": "Paris.", "thinking": "It is Paris."},
               {"role": "user", "content": "And of Italy?"}]
    as_openai = [*HELLO, {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."},
                 {"role": "user", "content": "And of Italy?"}]
    assert openai_messages(OllamaChatRequest.model_validate({"messages": earlier})) == as_openai
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": as_openai}, timeout=60).json()["prompt"]
    assert "<|im_start|>assistant\n<think>\nIt is Paris.\n</think>\n\nParis.<|im_end|>" in prompt
