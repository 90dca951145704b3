"""Reasoning in the Anthropic dialect: a reasoning model's thinking as `thinking` blocks before
the text, streamed as Anthropic streams them; `thinking` in a request (disabled -> the template's
enable_thinking false) and in the history (the turn's reasoning_content). The template below
opens the thinking in the prompt, so the tiny model's greedy output is thinking."""

import json

import anthropic
import httpx
import pytest

from mlxcel_py.engine import Finished, TokenDelta
from mlxcel_py.engine.core.events import Timings, Usage
from mlxcel_py.server.anthropic.shapes import AnthropicFramer, AnthropicReply, message_json
from mlxcel_py.server.generation.reasoning import ReasoningMarkers, ReasoningStart
from mlxcel_py.tool_calls import tool_format, tool_request
from server_helpers import GREEDY, start_server, stop_server
from tiny import tiny_model

# ChatML whose generation prompt opens <think> (DeepSeek-R1's way) with enable_thinking (on for the
# server: mlx-lm defaults it to whether the vocabulary has thinking tokens, which the tiny one lacks),
# and which renders an assistant turn's reasoning_content.
OPENING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% endif %}{% endif %}")
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
MARKERS = ReasoningMarkers("<think>", "</think>")


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=1, chat_template=OPENING, chat_template_kwargs='{"enable_thinking": true}')
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def claude(srv):
    with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0, timeout=60) as client:
        yield client


def _create(claude, **kwargs):
    return claude.messages.create(**{"model": "m", "max_tokens": 12, "messages": HELLO, "extra_body": GREEDY,
                                     **kwargs})


def _openai(srv, **extra) -> dict:
    body = {"messages": HELLO, "max_tokens": 12, **GREEDY, **extra}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]


def test_thinking_blocks_are_the_openai_routes_reasoning(srv, claude):
    expected = _openai(srv)
    assert expected["reasoning_content"]  # the prompt opened the thinking
    msg = _create(claude)
    thinking = [b for b in msg.content if b.type == "thinking"]
    assert [(b.thinking, b.signature) for b in thinking] == [(expected["reasoning_content"], "")]
    assert msg.content[0].type == "thinking"
    assert "".join(b.text for b in msg.content if b.type == "text") == (expected["content"] or "")
    with claude.messages.stream(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in msg.content]
    assert ("content_block_delta", "thinking_delta") in kinds and ("content_block_delta", "signature_delta") in kinds


def test_thinking_disabled_turns_the_templates_thinking_off(srv, claude):
    msg = _create(claude, thinking={"type": "disabled"})
    expected = _openai(srv, chat_template_kwargs={"enable_thinking": False})
    assert [b.type for b in msg.content] == ["text"] and "reasoning_content" not in expected
    assert msg.content[0].text == expected["content"]
    on = claude.messages.count_tokens(model="m", messages=HELLO).input_tokens
    off = claude.messages.count_tokens(model="m", messages=HELLO, thinking={"type": "disabled"}).input_tokens
    assert (on, off) == (_tokens(srv, HELLO), _tokens(srv, HELLO, {"enable_thinking": False})) and on > off


def test_thinking_in_the_history_is_the_turns_reasoning(srv, claude):
    history = [*HELLO, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "It is Paris.", "signature": ""}, {"type": "text", "text": "Paris."}]},
        {"role": "user", "content": "And of Italy?"}]
    rendered = httpx.post(srv.url + "/apply-template", timeout=60, json={"messages": [
        *HELLO, {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."},
        {"role": "user", "content": "And of Italy?"}]}).json()["prompt"]
    assert "<think>\nIt is Paris.\n</think>\n\nParis." in rendered
    openai_history = [*HELLO, {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."},
                      {"role": "user", "content": "And of Italy?"}]
    assert claude.messages.count_tokens(model="m", messages=history).input_tokens == _tokens(srv, openai_history)


@pytest.mark.parametrize("thinking,max_tokens,problem", [
    ({"type": "enabled", "budget_tokens": 0}, 16, "budget_tokens must be a positive number of tokens (got 0)"),
    ({"type": "adaptive", "display": "omitted"}, 16, 'display "omitted" is not supported'),
    ({"type": "between_tools"}, 16, 'type "between_tools" is not supported'),
])
def test_thinking_it_cannot_honour_is_a_400_naming_it(claude, thinking, max_tokens, problem):
    with pytest.raises(anthropic.BadRequestError) as info:
        _create(claude, thinking=thinking, max_tokens=max_tokens)
    assert problem in info.value.body["error"]["message"]
    assert info.value.body["error"]["message"].startswith("'thinking' ")


def test_thinking_enabled_with_a_budget_max_tokens_bounds(claude):
    msg = _create(claude, thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=12)
    assert msg.content[0].type == "thinking"


def _tokens(srv, messages: list, kwargs: dict = None) -> int:
    """The prompt's length as /apply-template renders the OpenAI messages and /tokenize counts them."""
    body = {"messages": messages, **({"chat_template_kwargs": kwargs} if kwargs else {})}
    prompt = httpx.post(srv.url + "/apply-template", json=body, timeout=60).json()["prompt"]
    return len(httpx.post(srv.url + "/tokenize", json={"content": prompt}, timeout=60).json()["tokens"])


def _events(pieces: list[str]) -> list:
    usage, timings = Usage(5, len(pieces), 0), Timings(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return [TokenDelta("r", i, p) for i, p in enumerate(pieces)] + [Finished("r", "stop", usage, timings)]


def test_the_stream_is_anthropics_thinking_then_text():
    reply = AnthropicReply("msg_1", "m", 5, 64, reasoning=ReasoningStart(MARKERS))
    framer = AnthropicFramer(reply)
    pieces = ["<think>\nThe capital", " is asked.\n</", "think>\n\nParis", "."]
    frames = [f for e in _events(pieces) for f in framer.frames(e)]
    data = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    summary = [(d["type"], d.get("index"), d.get("delta", d.get("content_block"))) for d in data]
    assert summary[:-2] == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "The capital"}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": " is asked."}),
        ("content_block_delta", 0, {"type": "signature_delta", "signature": ""}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "Paris"}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "."}),
        ("content_block_stop", 1, None),
    ]
    whole = message_json(reply, "<think>\nThe capital is asked.\n</think>\n\nParis.", _events([])[-1])
    assert whole["content"] == [{"type": "thinking", "thinking": "The capital is asked.", "signature": ""},
                                {"type": "text", "text": "Paris."}]


def test_a_tool_call_after_the_thinking_is_a_tool_use_block():
    fmt = tool_format(tiny_model().tokenizer)
    weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    reply = AnthropicReply("msg_1", "m", 5, 64, tool_request(weather), fmt, ReasoningStart(MARKERS))
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    text = f"<think>\nCall it.\n</think>\n\n{fmt.start}{call}{fmt.end}"
    whole = message_json(reply, text, _events([])[-1])
    assert [b["type"] for b in whole["content"]] == ["thinking", "tool_use"] and whole["stop_reason"] == "tool_use"
    assert (whole["content"][0]["thinking"], whole["content"][1]["input"]) == ("Call it.", {"city": "Paris"})
    framer = AnthropicFramer(reply)
    data = [json.loads(f.split("data: ", 1)[1]) for e in _events(list(text)) for f in framer.frames(e)]
    starts = [d["content_block"]["type"] for d in data if d["type"] == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    assert next(d for d in data if d["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"
