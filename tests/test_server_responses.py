"""OpenAI's Responses API with the official `openai` client against a real server on the tiny
model: create (plain, instructions, developer), the typed event stream, a required function
tool and its output sent back (in full and via previous_response_id), text.format, the
store (GET, DELETE, store: false), refused fields, max_output_tokens, the drain's cut."""

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest

from mlxcel_py.server.app import ROUTES
from mlxcel_py.server.responses.fields import REFUSED
from mlxcel_py.server.responses.schemas import ResponsesRequest
from server_helpers import error_of, start_server, stop_server, wait_for

HELLO = "Hello, how are you today?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}
PET = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
       "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 1,
                                                                          "maximum": 20}}}


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=1, le=20)


PET_FORMAT = {"format": {"type": "json_schema", "name": "pet", "schema": PET, "strict": True}}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2, model_alias="local-model")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def oai(srv):
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def create(oai, **kwargs):
    return oai.responses.create(**{"model": "any-name", "input": HELLO, "max_output_tokens": 8,
                                   "temperature": 0, **kwargs})


def chat_text(oai, messages, max_tokens=8):
    reply = oai.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content


def test_plain_response_is_the_chat_reply(oai):
    r = create(oai)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "local-model"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert [p.type for p in item.content] == ["output_text"] and item.content[0].annotations == []
    assert r.output_text == chat_text(oai, [{"role": "user", "content": HELLO}])
    # The tiny model writes on: the output limit ends it, and says so.
    assert (r.status, r.incomplete_details.reason, item.status) == ("incomplete", "max_output_tokens", "incomplete")
    u = r.usage
    assert (u.output_tokens, u.total_tokens) == (8, u.input_tokens + 8) and u.input_tokens > 0
    assert u.output_tokens_details.reasoning_tokens == 0 and u.input_tokens_details.cached_tokens >= 0


def test_instructions_and_developer_messages_are_the_system_turn(oai):
    system = "You are terse."
    expected = chat_text(oai, [{"role": "system", "content": system}, {"role": "user", "content": HELLO}])
    assert create(oai, instructions=system).output_text == expected
    parts = [{"role": "developer", "content": system},
             {"role": "user", "content": [{"type": "input_text", "text": HELLO}]}]
    assert create(oai, input=parts).output_text == expected
    assert create(oai, instructions=system).instructions == system


def test_stream_deltas_add_up_to_the_response(oai):
    whole = create(oai, max_output_tokens=12)
    with oai.responses.stream(model="m", input=HELLO, max_output_tokens=12, temperature=0) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == deltas and done.item_id == events[2].item.id


def test_raw_event_stream_names_each_event_by_its_type(srv):
    body = {"model": "m", "input": HELLO, "max_output_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and "[DONE]" not in lines
    assert data[0]["response"]["status"] == "in_progress" and data[0]["response"]["output"] == []
    assert data[-1]["response"]["usage"]["output_tokens"] == 3


def test_openapi_declares_the_body_and_the_stored_routes(srv):
    schema = httpx.get(srv.url + "/openapi.json", timeout=60).json()
    post = schema["paths"]["/v1/responses"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    assert "text/event-stream" in post["responses"]["200"]["content"]
    stored = schema["paths"]["/v1/responses/{response_id}"]
    assert set(stored) == {"get", "delete"} and all("404" in op["responses"] for op in stored.values())
    assert "/responses" not in schema["paths"]  # the alias
    # Each body's own types keep their own names, so none overwrites another's in the components.
    others = [r.body for r in ROUTES if r.body is not None and r.body is not ResponsesRequest]
    ours = ResponsesRequest.model_json_schema()["$defs"]
    for body in others:
        theirs = body.model_json_schema().get("$defs", {})
        assert all(ours[name] == theirs[name] for name in set(ours) & set(theirs)), body


def test_alias_route(srv):
    body = {"input": HELLO, "max_output_tokens": 2, "temperature": 0}
    assert httpx.post(srv.url + "/responses", json=body, timeout=60).json()["object"] == "response"


def _call_turn(oai, **kwargs):
    # One call: with parallel calls allowed the tiny model repeats its call until the limit.
    return create(oai, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=400, **kwargs)


def test_required_function_call_then_its_output(oai):
    first = _call_turn(oai)
    assert first.status == "completed" and first.incomplete_details is None
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               result]
    sent_back = create(oai, input=history, tools=[{**WEATHER, "strict": False}], max_output_tokens=6)
    chained = create(oai, previous_response_id=first.id, input=[result], tools=[{**WEATHER, "strict": False}],
                     max_output_tokens=6)
    # The first response's own output items, sent back as they came, render the same.
    as_items = create(oai, input=[history[0], *first.output, result], tools=[{**WEATHER, "strict": False}],
                      max_output_tokens=6)
    assert sent_back.output_text == chained.output_text == as_items.output_text
    assert chained.output[0].type == "message"
    assert chained.previous_response_id == first.id
    assert chained.usage.input_tokens == sent_back.usage.input_tokens


def test_streamed_function_call(oai):
    whole = _call_turn(oai)
    with oai.responses.stream(model="m", input="What is the weather in Paris?", tools=[WEATHER],
                              tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=400,
                              temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    assert kinds[-1] == "response.completed"
    (call,) = final.output
    assert call.type == "function_call" and call.arguments == whole.output[-1].arguments
    assert events[3].delta == call.arguments == events[4].arguments


def test_text_format_json_schema(oai):
    r = create(oai, text=PET_FORMAT, max_output_tokens=200)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), PET)
    with oai.responses.stream(model="m", input=HELLO, text=PET_FORMAT, max_output_tokens=200,
                              temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_text == r.output_text
    # The SDK's own structured output: a pydantic model as the format, the reply parsed into it.
    parsed = oai.responses.parse(model="m", input=HELLO, text_format=Pet, max_output_tokens=200, temperature=0)
    assert isinstance(parsed.output_parsed, Pet) and 1 <= parsed.output_parsed.age <= 20


def test_stored_responses_get_and_delete(oai, srv):
    r = create(oai, metadata={"k": "v"}, user="u-1")
    got = oai.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"} and got.user == "u-1"
    replay = httpx.get(f"{srv.url}/v1/responses/{r.id}?stream=true", timeout=60)
    assert error_of(replay)["param"] == "stream"
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        oai.responses.retrieve(r.id)
    assert info.value.body["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as info:
        create(oai, previous_response_id=r.id)
    error = info.value.body
    assert (error["param"], error["code"]) == ("previous_response_id", "previous_response_not_found")
    unstored = create(oai, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


# A value that changes the output, per refused field: each must be a 400 naming the field.
CHANGING = {
    "background": True, "conversation": "conv_1", "include": ["message.output_text.logprobs"],
    "reasoning": {"effort": "high"}, "top_logprobs": 2, "prompt": {"id": "pmpt_1"}, "truncation": "auto",
    "context_management": [{"type": "compaction"}], "moderation": {"model": "omni-moderation-latest"},
    "image": {"size": "1024x1024"},
}
INERT = {
    "background": False, "include": ["reasoning.encrypted_content"],
    "reasoning": {"effort": "none", "mode": "standard", "context": "auto"},
    "top_logprobs": 0, "truncation": "disabled", "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "metadata": {"k": "v"}, "user": "u", "stream_options": {"include_obfuscation": False}, "max_tool_calls": 3,
    "prompt_cache_key": "k", "prompt_cache_retention": "24h", "safety_identifier": "s", "service_tier": "auto",
    "tools": [], "tool_choice": "none", "parallel_tool_calls": True, "store": True,
}


def test_every_refused_field_is_tried():
    assert set(CHANGING) == REFUSED


@pytest.mark.parametrize("field", sorted(CHANGING))
def test_a_field_we_cannot_honour_is_a_400_naming_it(srv, field):
    body = {"input": HELLO, "max_output_tokens": 2, field: CHANGING[field]}
    error = error_of(httpx.post(srv.url + "/v1/responses", json=body, timeout=60))
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert error["message"].startswith(f"'{field}' ")


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"tools": [{"type": "web_search"}]}, "tools", "'web_search' tools are not supported"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "tools",
     "only one of text.format, strict tools and a forced tool_choice may constrain the output"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}, "input",
     "input[0].content[0]: local-model takes text only; images need a vision-language model"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "input",
     "'input_audio' content parts are not supported"),
    ({"input": [{"type": "item_reference", "id": "rs_1"}]}, "input", "'item_reference' input items"),
    ({"text": {"verbosity": "low"}}, "text", 'verbosity "low" is not supported'),
    ({"reasoning": {"mode": "pro"}}, "reasoning", 'mode "pro" is not supported'),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "'file_search' tool choices are not supported"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"input": []}, "input", "input is required"),
])
def test_other_refusals_name_their_field(srv, extra, param, words):
    error = error_of(httpx.post(srv.url + "/v1/responses", json={"input": HELLO, **extra}, timeout=60))
    assert error["param"] == param and words in error["message"], error


def test_inert_values_change_nothing(oai, srv):
    plain = create(oai, max_output_tokens=4).output_text
    body = {"input": HELLO, "max_output_tokens": 4, "temperature": 0, **INERT}
    resp = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["output"][0]["content"][0]["text"] == plain


def test_the_drain_cuts_a_stream_with_error_then_failed():
    running = start_server(parallel=1, grace_s=0.3)
    body = {"input": HELLO, "max_output_tokens": 3000, "stream": True, "temperature": 0}
    try:
        with running.client() as client, client.stream("POST", "/v1/responses", json=body) as resp:
            lines = resp.iter_lines()
            data = [json.loads(next(line for line in lines if line.startswith("data: "))[6:])]
            wait_for(lambda: running.worker.stats().num_busy_slots == 1, 10, "the request to run")
            running.server.should_exit = True  # what SIGTERM does
            data += [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
            running.thread.join(10)
    finally:
        stop_server(running)
    assert [d["type"] for d in data[-2:]] == ["error", "response.failed"]
    assert data[-2]["code"] == "server_shutting_down"
    assert data[-1]["response"]["status"] == "failed"
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
