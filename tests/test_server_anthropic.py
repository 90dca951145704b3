"""Anthropic's Messages API with the official `anthropic` client against a real server on the
tiny model: messages, streaming, count_tokens, x-api-key, a tool_use round trip, errors."""

import json

import anthropic
import pytest

from mlxcel_py.server.anthropic.fields import HONOURED, IGNORED, REFUSED
from mlxcel_py.server.anthropic.schemas import MessagesRequest
from server_helpers import start_server, stop_server

KEY = "s3cret"
GREEDY = {"temperature": 0.0}  # not declared by anthropic 2.x (the API still takes it): sent as extra_body
HELLO = [{"role": "user", "content": "Hello, how are you today?"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2, api_key=KEY, model_alias="local-model")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def claude(srv):
    with anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0, timeout=60) as client:
        yield client


def create(claude, **kwargs):
    return claude.messages.create(**{"model": "any-name", "max_tokens": 8, "messages": HELLO,
                                     "extra_body": GREEDY, **kwargs})


def test_message(claude):
    msg = create(claude, system="You are terse.")
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == "local-model"  # any name is accepted; the served id is reported
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text
    assert (msg.stop_reason, msg.stop_sequence, msg.usage.output_tokens) == ("max_tokens", None, 8)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0


def test_system_blocks_and_strings_render_alike(claude):
    as_string = create(claude, system="You are terse.\nAnswer in French.")
    blocks = [{"type": "text", "text": "You are terse."},
              {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral"}}]
    as_blocks = create(claude, system=blocks)
    assert as_string.content[0].text == as_blocks.content[0].text


def test_stream_matches_the_message(claude):
    whole = create(claude, max_tokens=12)
    with claude.messages.stream(model="m", max_tokens=12, messages=HELLO, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 12)


def test_raw_event_stream(srv):
    import httpx

    body = {"model": "m", "max_tokens": 3, "messages": HELLO, "stream": True, **GREEDY}
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60) as resp:
        lines = [line for line in resp.iter_lines() if line]
    events = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert events == [d["type"] for d in data]  # each event's name is its data's type
    assert events[:2] == ["message_start", "ping"] and events[-1] == "message_stop"
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    delta = next(d for d in data if d["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3


def test_count_tokens_is_the_prompt_run(claude):
    count = claude.messages.count_tokens(model="m", messages=HELLO, system="You are terse.")
    msg = create(claude, system="You are terse.")
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    bigger = claude.messages.count_tokens(model="m", messages=HELLO, system="You are terse.", tools=[WEATHER])
    assert bigger.input_tokens > count.input_tokens  # the tools are part of the prompt


def test_stop_sequence(claude):
    full = create(claude, max_tokens=24).content[0].text
    stop = next(full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].isalnum())
    msg = create(claude, max_tokens=24, stop_sequences=[stop])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == full[: full.index(stop)]


def test_api_key_as_x_api_key_or_bearer(srv, claude):
    assert create(claude).usage.output_tokens == 8  # the SDK sends x-api-key
    with anthropic.Anthropic(base_url=srv.url, auth_token=KEY, api_key=None, max_retries=0) as bearer:
        assert create(bearer).usage.output_tokens == 8  # Authorization: Bearer
    with anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError) as info:
            create(bad)
    assert info.value.body == {"type": "error", "error": {"type": "authentication_error", "message": (
        "invalid or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")}}


def test_tool_use_round_trip(claude):
    forced = create(claude, max_tokens=400, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                    messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert forced.stop_reason == "tool_use"
    (call,) = [b for b in forced.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather" and call.input["city"] in ("Paris", "Rome")
    answer = create(claude, max_tokens=6, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": forced.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"},
                                     {"type": "text", "text": "Thanks!"}]},
    ])
    assert answer.stop_reason == "max_tokens" and answer.content[0].type == "text"
    count = claude.messages.count_tokens(model="m", tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": forced.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}]}])
    assert count.input_tokens > 0


def test_streamed_tool_use(claude):
    kwargs = {"model": "m", "max_tokens": 400, "tools": [WEATHER],
              "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
              "messages": [{"role": "user", "content": "Weather in Rome?"}], "extra_body": GREEDY}
    whole = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert [d.type for d in deltas] == ["input_json_delta"]
    assert json.loads(deltas[0].partial_json) == whole.content[-1].input == final.content[-1].input
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"


@pytest.mark.parametrize(("body", "status", "kind", "words"), [
    ({"messages": HELLO}, 400, "invalid_request_error", "missing required field 'max_tokens'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     400, "invalid_request_error", "takes text only; images need a vision-language model"),
    ({"max_tokens": 4, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 2048}},
     400, "invalid_request_error", "'thinking' type \"enabled\" needs thinking, which is off"),
    ({"max_tokens": 4, "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     400, "invalid_request_error", "server tools ('web_search_20250305') are not supported"),
    ({"max_tokens": 4, "messages": HELLO + [{"role": "assistant", "content": "Well,"}]},
     400, "invalid_request_error", "prefill"),
    ({"max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]},
     400, "invalid_request_error", "tool_choice names function 'nope'"),
    ({"max_tokens": 4, "messages": HELLO, "output_config": {"format": {"type": "json_schema", "schema": {}}}},
     400, "invalid_request_error", "'output_config' format"),
])
def test_errors_are_anthropic_shaped(srv, body, status, kind, words):
    import httpx

    resp = httpx.post(srv.url + "/v1/messages", json={"model": "m", **body}, headers={"x-api-key": KEY}, timeout=30)
    assert resp.status_code == status, resp.text
    error = resp.json()
    assert set(error) == {"type", "error"} and error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == kind and words in error["error"]["message"], error


def test_unknown_route_under_messages_is_anthropic_shaped(srv):
    import httpx

    resp = httpx.post(srv.url + "/v1/messages/batches", json={}, headers={"x-api-key": KEY}, timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error"


def test_ignored_fields_change_nothing(claude):
    plain = create(claude).content[0].text
    extra = create(claude, metadata={"user_id": "u-1"}, extra_body={
        **GREEDY, "service_tier": "auto", "thinking": {"type": "disabled"}, "speed": "standard",
        "inference_geo": "us", "container": "c-1"})
    assert extra.content[0].text == plain


def test_every_field_is_honoured_refused_or_ignored():
    fields = set(MessagesRequest.model_fields)
    assert fields == HONOURED | REFUSED | IGNORED and not (HONOURED & REFUSED or HONOURED & IGNORED)
    assert set(anthropic.types.message_create_params.MessageCreateParamsBase.__annotations__) <= fields


def test_openapi_documents_the_anthropic_error_shape(srv):
    import httpx

    schema = httpx.get(srv.url + "/openapi.json", headers={"x-api-key": KEY}, timeout=30).json()
    messages = schema["paths"]["/v1/messages"]["post"]
    assert messages["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/MessagesRequest")
    error = messages["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert error == "#/components/schemas/AnthropicError"
    assert schema["paths"]["/completion"]["post"]["responses"]["400"]["content"]["application/json"]["schema"][
        "$ref"] == "#/components/schemas/Error"
