"""Closed objects by default (tool_calls/closed.py): the transform's exact output, the grammar it
compiles to (llguidance over the tiny model's tokenizer), one call when parallel calls are off,
and each dialect's replies on the tiny random-weight model: only the keys the schema lists."""

import copy
import json

import httpx
import pytest

from mlxcel_py.engine.core.request import ConstraintSpec
from mlxcel_py.server.anthropic.prepare import tools_of
from mlxcel_py.server.anthropic.schemas import CountTokensRequest
from mlxcel_py.server.generation.structured import schema_spec
from mlxcel_py.tool_calls import lazy_tool_constraint, tool_constraint, tool_request
from mlxcel_py.tool_calls.closed import closed_parameters, closed_schema
from server_helpers import start_server, stop_server
from test_constraints import compiler, lm  # noqa: F401 - the tiny model and its grammar compiler

MAGIC_PARAMS = {"type": "object", "properties": {
    "input": {"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": 1000}}, "required": ["input"]}
MAGIC = {"type": "function", "function": {"name": "magic_function", "parameters": MAGIC_PARAMS}}
INT = {"type": "integer"}
CLOSED = {"additionalProperties": False}


# -- the transform ------------------------------------------------------------------------------
def test_every_object_that_lists_properties_is_closed_however_deep():
    schema = {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": INT}},
        "tags": {"type": "array", "items": {"properties": {"k": INT}}},
        "pair": {"prefixItems": [{"properties": {"a": INT}}, INT]},
        "either": {"anyOf": [{"properties": {"a": INT}}, {"type": "null"}]},
        "ref": {"$ref": "#/$defs/D"},
        "map": {"type": "object", "additionalProperties": {"properties": {"v": INT}}},
    }, "$defs": {"D": {"properties": {"d": INT}}}, "definitions": {"E": {"oneOf": [{"properties": {"e": INT}}]}}}
    original = copy.deepcopy(schema)
    assert closed_schema(schema) == {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": INT}, **CLOSED},
        "tags": {"type": "array", "items": {"properties": {"k": INT}, **CLOSED}},
        "pair": {"prefixItems": [{"properties": {"a": INT}, **CLOSED}, INT]},
        "either": {"anyOf": [{"properties": {"a": INT}, **CLOSED}, {"type": "null"}]},
        "ref": {"$ref": "#/$defs/D"},
        "map": {"type": "object", "additionalProperties": {"properties": {"v": INT}, **CLOSED}},
    }, "$defs": {"D": {"properties": {"d": INT}, **CLOSED}},
        "definitions": {"E": {"oneOf": [{"properties": {"e": INT}, **CLOSED}]}}, **CLOSED}
    assert schema == original  # a copy: the request's own schema is not changed


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": INT}, "additionalProperties": True},
    {"type": "object", "properties": {"a": INT}, "additionalProperties": {"type": "string"}},
    {"type": "object", "properties": {"a": INT}, "patternProperties": {"^x_": INT}},
    {"type": "object", "properties": {"a": INT}, "unevaluatedProperties": False},
    {"type": "object"},  # any object, as llama.cpp reads it
    {"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {}}}, **CLOSED},
    {"type": "integer"},
    True,
])
def test_a_schema_that_says_what_it_wants_is_left_as_written(schema):
    assert closed_schema(schema) == schema


def test_values_are_data_not_schemas():
    data = {"properties": {"a": 1}}
    schema = {"type": "object", "properties": {"enum": {"enum": [data]}, "const": {"const": data},
                                               "d": {"default": data, "examples": [data]}},
              "x-guidance": {"whitespace_flexible": False}}
    assert closed_schema(schema) == {**schema, **CLOSED}


def test_parts_of_one_object_stay_open_so_that_they_do_not_forbid_each_others_keys():
    parts = {"allOf": [{"properties": {"a": INT}}, {"$ref": "#/$defs/B"}],
             "$defs": {"B": {"properties": {"b": INT}}, "C": {"properties": {"c": INT}}}}
    defs = {"B": parts["$defs"]["B"], "C": {**parts["$defs"]["C"], **CLOSED}}  # B is a part; C is not
    assert closed_schema(parts) == {**parts, "$defs": defs}
    tagged = {"properties": {"kind": {"type": "string"}}, "oneOf": [{"properties": {"x": INT}}]}
    assert closed_schema(tagged) == tagged
    one_of_keys = {"properties": {"a": INT, "b": INT}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert closed_schema(one_of_keys) == {**one_of_keys, **CLOSED}  # the branches bring no keys
    single = {"allOf": [{"properties": {"a": INT}}]}  # one part is the whole object
    assert closed_schema(single) == {"allOf": [{"properties": {"a": INT}, **CLOSED}]}


@pytest.mark.parametrize("params", [
    {}, {"type": "object"}, {"type": "object", "properties": {}}, {"type": "object", "description": "none"},
])
def test_a_tool_without_parameters_takes_exactly_an_empty_object(params):
    assert closed_parameters(params) == {**params, "type": "object", "properties": {}, **CLOSED}


def test_tool_parameters_with_properties_close_like_any_schema():
    assert closed_parameters(MAGIC_PARAMS) == {**MAGIC_PARAMS, **CLOSED}
    union = {"anyOf": [{"type": "object", "properties": {"a": INT}}, {"type": "object"}]}
    assert closed_parameters(union) == {"anyOf": [{"type": "object", "properties": {"a": INT}, **CLOSED},
                                                  {"type": "object"}]}


# -- the grammar --------------------------------------------------------------------------------

def accepts(lm, compiler, spec: ConstraintSpec, text: str) -> bool:
    """Whether the grammar takes the whole text and may end there."""
    matcher = compiler.compile(spec).deep_copy()
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def forced(tools: list, choice="required", parallel=False) -> ConstraintSpec:
    return tool_constraint(tool_request(tools, choice, parallel), "<tool_call>", "</tool_call>")


def test_the_magic_function_takes_its_one_key_once(lm, compiler):
    spec = forced([MAGIC])
    assert accepts(lm, compiler, spec, call("magic_function", '{"input": 3}'))
    for arguments in ('{"input": 3, "type": 1}', '{"input": 3, "input": 4}', '{"input": 3, "exclusiveMaximum": 1000}',
                      '{"input": 1000}', '{}'):
        assert not accepts(lm, compiler, spec, call("magic_function", arguments)), arguments


def test_additional_properties_true_is_honoured(lm, compiler):
    tool = copy.deepcopy(MAGIC)
    tool["function"]["parameters"]["additionalProperties"] = True
    spec = forced([tool])
    assert accepts(lm, compiler, spec, call("magic_function", '{"input": 3, "type": 1}'))
    assert not accepts(lm, compiler, spec, call("magic_function", '{"input": 3, "input": 4}'))  # llguidance: once


@pytest.mark.parametrize("params", [None, {}, {"type": "object"}, {"type": "object", "properties": {}}])
def test_a_zero_parameter_tool_accepts_exactly_the_empty_object(lm, compiler, params):
    function = {"name": "ping"} if params is None else {"name": "ping", "parameters": params}
    spec = forced([{"type": "function", "function": function}])
    assert accepts(lm, compiler, spec, call("ping", "{}"))
    assert not accepts(lm, compiler, spec, call("ping", '{"a": 1}'))


def test_references_resolve_inside_the_parameters(lm, compiler):
    params = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}},
                                               "n": {"$ref": "#/$defs/N"}},
              "$defs": {"N": {"type": "object", "properties": {"v": INT}}}}
    spec = forced([{"type": "function", "function": {"name": "tree", "parameters": params}}])
    assert accepts(lm, compiler, spec, call("tree", '{"kids": [{"kids": []}], "n": {"v": 1}}'))
    assert not accepts(lm, compiler, spec, call("tree", '{"kids": [{"name": 1}]}'))
    assert not accepts(lm, compiler, spec, call("tree", '{"n": {"v": 1, "w": 2}}'))


def test_response_format_schemas_are_closed_too(lm, compiler):
    spec = schema_spec(MAGIC_PARAMS)
    assert accepts(lm, compiler, spec, '{"input": 3}')
    assert not accepts(lm, compiler, spec, '{"input": 3, "type": 1}')
    parts = schema_spec({"allOf": [{"properties": {"a": INT}}, {"properties": {"b": INT}}]})
    assert accepts(lm, compiler, parts, '{"a": 1, "b": 2}')  # parts of one object keep each other's keys


def test_one_call_unless_parallel_calls_are_allowed_for_required(lm, compiler):
    ping = {"type": "function", "function": {"name": "ping"}}
    one, two = call("ping", "{}"), call("ping", "{}") + "\n" + call("magic_function", '{"input": 1}')
    assert accepts(lm, compiler, forced([ping, MAGIC], parallel=True), two)
    assert not accepts(lm, compiler, forced([ping, MAGIC], parallel=False), two)
    assert accepts(lm, compiler, forced([ping, MAGIC], parallel=False), one)
    named = forced([ping, MAGIC], {"type": "function", "function": {"name": "ping"}}, parallel=True)
    assert accepts(lm, compiler, named, one) and not accepts(lm, compiler, named, one + "\n" + one)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_lazy_strict_grammar_takes_one_call_without_parallel_calls(lm, compiler, parallel):
    spec = lazy_tool_constraint(tool_request([MAGIC], "auto", parallel), frozenset({"magic_function"}),
                                "<tool_call>", "</tool_call>")
    matcher = compiler.matcher(spec)
    encode = lambda text: lm.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    for token in [*encode("Let me see.\n"), *compiler.trigger_ids("<tool_call>"),
                  *encode('\n{"name": "magic_function", "arguments": {"input": 7}}\n</tool_call>')]:
        assert matcher.allows(token) or not matcher.active
        matcher.accept(token)
    assert matcher.done is not parallel  # without parallel calls only EOS may follow
    assert matcher.ll.is_accepting()


def _anthropic_tools(choice: dict):
    raw = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": choice,
           "tools": [{"name": "magic_function", "input_schema": MAGIC_PARAMS}]}
    return tools_of(CountTokensRequest.model_validate(raw))


def test_each_api_has_its_own_default_for_parallel_calls():
    assert tool_request([MAGIC]).parallel is True  # OpenAI chat and Responses: true unless sent
    assert tool_request([MAGIC], "required", False).parallel is False
    assert _anthropic_tools({"type": "any"}).parallel is True  # Anthropic: parallel unless disabled
    assert _anthropic_tools({"type": "any", "disable_parallel_tool_use": True}).parallel is False
    assert _anthropic_tools({"type": "tool", "name": "magic_function", "disable_parallel_tool_use": False}).parallel


# -- over HTTP, per dialect ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=2)
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    stop_server(running)


def post(http: httpx.Client, path: str, body: dict) -> dict:
    response = http.post(path, json={"model": "m", "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def only_input(arguments) -> None:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert list(value) == ["input"] and isinstance(value["input"], int) and -1000 < value["input"] < 1000, value


ASK = [{"role": "user", "content": "Call the magic function."}]
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


def test_openai_chat_forced_call_has_only_the_listed_key(http):
    named = {"type": "function", "function": {"name": "magic_function"}}
    reply = post(http, "/v1/chat/completions", {"messages": ASK, "tools": [MAGIC], "tool_choice": named,
                                                "max_tokens": 200})
    (tool_call,) = reply["choices"][0]["message"]["tool_calls"]
    only_input(tool_call["function"]["arguments"])
    empty = post(http, "/v1/chat/completions", {"messages": ASK, "tools": [PING, MAGIC], "max_tokens": 200,
                                                "tool_choice": {"type": "function", "function": {"name": "ping"}}})
    assert empty["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_openai_chat_required_without_parallel_calls_gives_one_call(http):
    reply = post(http, "/v1/chat/completions", {"messages": ASK, "tools": [MAGIC, PING], "tool_choice": "required",
                                                "parallel_tool_calls": False, "max_tokens": 200})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1


def test_openai_response_format_and_llama_json_schema_are_closed(http):
    fmt = {"type": "json_schema", "json_schema": {"name": "magic", "schema": MAGIC_PARAMS}}
    reply = post(http, "/v1/chat/completions", {"messages": ASK, "response_format": fmt, "max_tokens": 200})
    only_input(reply["choices"][0]["message"]["content"])
    native = post(http, "/completion", {"prompt": "JSON:", "json_schema": MAGIC_PARAMS, "n_predict": 200})
    only_input(native["content"])


def test_responses_forced_call_and_text_format(http):
    tool = {"type": "function", "name": "magic_function", "parameters": MAGIC_PARAMS, "strict": True}
    ping = {"type": "function", "name": "ping", "parameters": {}}
    reply = post(http, "/v1/responses", {"input": "Call it.", "tools": [tool, ping], "tool_choice": "required",
                                         "parallel_tool_calls": False, "max_output_tokens": 200})
    (item,) = [i for i in reply["output"] if i["type"] == "function_call"]
    if item["name"] == "magic_function":
        only_input(item["arguments"])
    else:
        assert item["arguments"] == "{}"
    named = post(http, "/v1/responses", {"input": "Call it.", "tools": [tool], "max_output_tokens": 200,
                                         "tool_choice": {"type": "function", "name": "magic_function"}})
    only_input(next(i for i in named["output"] if i["type"] == "function_call")["arguments"])
    text = post(http, "/v1/responses", {"input": "JSON.", "max_output_tokens": 200, "text": {"format": {
        "type": "json_schema", "name": "magic", "schema": MAGIC_PARAMS}}})
    only_input(text["output"][-1]["content"][0]["text"])


def test_anthropic_forced_tool_use_has_only_the_listed_key(http):
    tool = {"name": "magic_function", "input_schema": MAGIC_PARAMS}
    body = {"max_tokens": 200, "messages": ASK, "tools": [tool, {"name": "ping", "input_schema": {"type": "object"}}]}
    named = post(http, "/v1/messages", {**body, "tool_choice": {"type": "tool", "name": "magic_function"}})
    (use,) = [b for b in named["content"] if b["type"] == "tool_use"]
    only_input(use["input"])
    one = post(http, "/v1/messages", {**body, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert one["stop_reason"] == "tool_use" and len([b for b in one["content"] if b["type"] == "tool_use"]) == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_ollama_format_schema_is_closed(http, seed):
    # Sampled, not greedy: the greedy reply happens to stop after `input` even when the object is open.
    options = {"temperature": 1, "seed": seed, "num_predict": 120}
    response = http.post("/api/chat", json={"model": "m", "messages": ASK, "format": MAGIC_PARAMS, "stream": False,
                                            "options": options})
    assert response.status_code == 200, response.text
    only_input(response.json()["message"]["content"])
