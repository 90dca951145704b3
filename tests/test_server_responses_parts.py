"""The Responses dialect's pure parts, without a server: items -> chat messages, the framer's
ending when the engine fails, and the store's bounds."""

import json

from mlxcel_py.engine import Finished
from mlxcel_py.engine.core.events import Timings, Usage
from mlxcel_py.server.http.body import parse_body
from mlxcel_py.server.http.errors import APIError
from mlxcel_py.server.responses.conversation import input_messages, output_messages
from mlxcel_py.server.responses.events import ResponsesFramer
from mlxcel_py.server.responses.schemas import ResponsesRequest
from mlxcel_py.server.responses.shapes import ResponsesReply
from mlxcel_py.server.responses.store import ResponseStore, StoredResponse


def _items(items):
    return input_messages(parse_body(json.dumps({"input": items}).encode(), ResponsesRequest).input)


def test_items_become_chat_turns():
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    turns = _items([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        call, {**call, "call_id": "call_2"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
        call,
    ])
    as_call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert turns == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [{"id": "call_1", **as_call}, {"id": "call_2", **as_call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", **as_call}]},
    ]
    assert _items("hi") == [{"role": "user", "content": "hi"}]


def test_output_items_become_the_assistant_turn():
    output = [{"type": "message", "content": [{"type": "output_text", "text": "Sure."}]},
              {"type": "function_call", "call_id": "call_9", "name": "g", "arguments": "{\"x\": 1}"}]
    assert output_messages(output) == [{"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]}]


def _finished(reason, text="", error=None):
    return Finished("resp_x", reason, Usage(5, 1, 0), Timings(0, 0, 0, 0, 0, 0), text=text, error=error)


def test_an_engine_failure_ends_the_stream_with_error_then_failed():
    kept = []
    framer = ResponsesFramer(ResponsesReply("resp_x", 0, "m", 5), kept.append)
    frames = framer.opening() + framer.frames(_finished("error", "Hi", error="the engine failed"))
    data = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    assert [d["type"] for d in data][-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert (data[-2]["code"], data[-2]["message"]) == ("engine_error", "the engine failed")
    failed = data[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error", "message": "the engine failed"}
    assert failed["output"][0]["content"][0]["text"] == "Hi" and kept[0].body == failed
    assert framer.cut(APIError(503, "late")) == []  # the stream already ended: a late cut adds nothing


def test_the_store_is_bounded():
    store = ResponseStore(max_responses=2, max_chars=10)
    for i in range(3):
        store.put(StoredResponse({"id": f"r{i}"}, ({"role": "user", "content": "abc"},)))
    assert (store.get("r0"), len(store)) == (None, 2)  # the oldest went first
    store.put(StoredResponse({"id": "big"}, ({"role": "user", "content": "x" * 9},)))
    assert [store.get(k) is not None for k in ("r1", "r2", "big")] == [False, False, True]
    store.put(StoredResponse({"id": "huge"}, ({"role": "user", "content": "x" * 11},)))
    assert store.get("huge") is None and len(store) == 1  # larger than the whole bound: not kept
    assert store.delete("big") and not store.delete("big") and len(store) == 0
