"""--reasoning-format: a reasoning model's <think> text comes back as reasoning_content on the
OpenAI chat route, streamed and not, apart from the answer and the tool calls; the tiny model's
output is forced with a grammar (server/generation/reasoning.py)."""

import json

import pytest

from mlxcel_py.server.generation.reasoning import ReasoningMarkers, ReasoningSplit, ReasoningStart
from server_helpers import GREEDY, start_server, stop_server, stream_post

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "What is the capital of France?"}]
THINK = r'root ::= "<think>\nThe capital is asked.\n</think>\n\nParis."'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
CALL = r'root ::= "<think>\nAdd it.\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"'


@pytest.fixture(scope="module")
def qwen3():
    running = start_server(parallel=1, chat_template="qwen3")
    with running.client() as client:
        yield client, running
    stop_server(running)


def _body(grammar: str, **extra) -> dict:
    return {"messages": MSG, "max_tokens": 64, "grammar": grammar, **GREEDY, **extra}


def _streamed(client, body) -> tuple[str, str, list]:
    chunks = [c for c in stream_post(client, CHAT, body) if isinstance(c, dict) and c["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            [call for d in deltas for call in d.get("tool_calls", [])])


def test_the_markers_are_found_at_load(qwen3):
    assert qwen3[1].runtime.reasoning == ReasoningMarkers("<think>", "</think>")


def test_thinking_is_reasoning_content_apart_from_the_answer(qwen3):
    client, _ = qwen3
    message = client.post(CHAT, json=_body(THINK)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital is asked."}
    assert _streamed(client, _body(THINK)) == ("The capital is asked.", "Paris.", [])


def test_the_tool_call_parser_sees_only_the_answer(qwen3):
    client, _ = qwen3
    body = _body(CALL, tools=TOOLS, max_tokens=200)
    choice = client.post(CHAT, json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Add it."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("add", {"a": 1})]
    reasoning, content, calls = _streamed(client, body)
    assert (reasoning, content) == ("Add it.", "") and [c["function"]["name"] for c in calls] == ["add"]


def test_format_none_leaves_the_thinking_in_the_answer():
    running = start_server(parallel=1, chat_template="qwen3", reasoning_format="none")
    try:
        assert running.runtime.reasoning is None
        with running.client() as client:
            message = client.post(CHAT, json=_body(THINK)).json()["choices"][0]["message"]
            assert message == {"role": "assistant", "content": "<think>\nThe capital is asked.\n</think>\n\nParis."}
            # llama-server's per-request field over the server's format
            split = client.post(CHAT, json=_body(THINK, reasoning_format="deepseek")).json()["choices"][0]["message"]
            assert split == {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital is asked."}
    finally:
        stop_server(running)


def test_a_requests_reasoning_format(qwen3):
    client, _ = qwen3
    message = client.post(CHAT, json=_body(THINK, reasoning_format="none")).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "<think>\nThe capital is asked.\n</think>\n\nParis."}
    assert _streamed(client, _body(THINK, reasoning_format="none"))[:2] == ("", message["content"])
    error = client.post(CHAT, json=_body(THINK, reasoning_format="deepseek-legacy"))
    assert error.status_code == 400 and error.json()["error"]["param"] == "reasoning_format"
    assert "deepseek-legacy is not supported" in error.json()["error"]["message"]


def test_budget_zero_turns_the_templates_thinking_off():
    running = start_server(parallel=1, chat_template="qwen3", reasoning_budget=0)
    try:
        with running.client() as client:
            prompt = client.post("/apply-template", json={"messages": MSG}).json()["prompt"]
            assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            answer = client.post(CHAT, json=_body(r'root ::= "Paris."')).json()["choices"][0]["message"]
            assert answer == {"role": "assistant", "content": "Paris."}
    finally:
        stop_server(running)


def test_reasoning_effort_none_turns_the_templates_thinking_off(qwen3):
    client, _ = qwen3
    body = _body(r'root ::= "Paris."', reasoning_effort="none")
    reply = client.post(CHAT, json=body).json()
    off = client.post("/apply-template", json={"messages": MSG, "chat_template_kwargs": {"enable_thinking": False}})
    tokens = client.post("/tokenize", json={"content": off.json()["prompt"]}).json()["tokens"]
    assert off.json()["prompt"].endswith("<think>\n\n</think>\n\n") and reply["usage"]["prompt_tokens"] == len(tokens)
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}


def test_a_template_without_thinking_has_no_split():
    running = start_server(parallel=1)  # the tiny model's chatml template opens no <think>
    try:
        assert running.runtime.reasoning is None
    finally:
        stop_server(running)


def _split(text: str, sizes: list[int], open_: bool = False) -> tuple[str, str]:
    split = ReasoningSplit(ReasoningStart(ReasoningMarkers("<think>", "</think>"), open_))
    out, at = ["", ""], 0
    for n in sizes:
        for i, piece in enumerate(split.feed(text[at:at + n])):
            out[i] += piece
        at += n
    for i, piece in enumerate(split.finish()):
        out[i] += piece
    return out[0], out[1]


@pytest.mark.parametrize("text,open_,expected", [
    ("<think>\nplan a b\n</think>\n\nanswer", False, ("plan a b", "answer")),
    ("plan</think>answer", True, ("plan", "answer")),  # the prompt opened the block (DeepSeek-R1)
    ("no thinking <think>x</think>", False, ("", "no thinking <think>x</think>")),
    ("  <thi", False, ("", "  <thi")),  # a marker's start that never completes is answer
    ("<think> cut off by max_tokens  ", False, ("cut off by max_tokens", "")),
])
def test_the_split_does_not_depend_on_how_the_text_is_cut(text, open_, expected):
    assert _split(text, [len(text)], open_) == expected
    for size in (1, 2, 3, 5):
        assert _split(text, [size] * (len(text) // size + 1), open_) == expected
