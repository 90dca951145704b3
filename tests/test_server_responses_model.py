"""The Responses API on the default model (SmolLM2-135M) with the official `openai` client, where
the output must mean something: an answer that follows its instructions and ends by itself, its
stream, a forced function call answered through previous_response_id, and JSON output."""

import json

import jsonschema
import openai
import pytest

from mlxcel_py.models import load_model
from server_helpers import start_server, stop_server

pytestmark = pytest.mark.slow

ASK = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "strict": True, "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                                          "properties": {"city": {"type": "string", "maxLength": 20}}}}


@pytest.fixture(scope="module")
def oai():
    # No prompt cache: a chained turn would reuse the KV its previous reply's tokens got from the int8
    # decode step, the explicit one prefill them through float products (equal within the quantized
    # path's tolerance, docs/CPU_FAST_PATH.md, not bit for bit); this module compares the two turns' text.
    running = start_server(model=load_model(None), parallel=2, prompt_cache=False)
    with openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client
    stop_server(running)


def test_an_answer_that_ends_by_itself_streamed_and_not(oai):
    kwargs = {"model": "m", "instructions": "Answer in one short sentence.", "input": ASK,
              "max_output_tokens": 48, "temperature": 0}
    r = oai.responses.create(**kwargs)
    assert r.status == "completed" and r.incomplete_details is None and "Paris" in r.output_text
    with oai.responses.stream(**kwargs) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas == final.output_text == r.output_text and final.status == "completed"


def test_a_forced_call_answered_through_previous_response_id(oai):
    first = oai.responses.create(model="m", input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", parallel_tool_calls=False, max_output_tokens=64,
                                 temperature=0)
    (call,) = first.output
    assert first.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    assert "paris" in arguments["city"].lower()
    answer = oai.responses.create(model="m", previous_response_id=first.id, tools=[{**WEATHER, "strict": False}],
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "21 degrees and sunny"}],
                                  max_output_tokens=64, temperature=0)
    # Whether the small model stops within 64 tokens is a near tie: an ulp of the prefill attention's exp moves it.
    assert [item.type for item in answer.output] == ["message"] and (
        answer.status == "completed" or answer.incomplete_details.reason == "max_output_tokens")
    # The chain is the conversation: the same turns sent whole give the same answer (the small model's
    # wording of a tool result is tie-sensitive across CPU kernels, so its text is not asserted).
    explicit = oai.responses.create(model="m", tools=[{**WEATHER, "strict": False}], max_output_tokens=64, temperature=0,
                                    input=[{"role": "user", "content": "What is the weather in Paris?"},
                                           {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                            "arguments": call.arguments},
                                           {"type": "function_call_output", "call_id": call.call_id,
                                            "output": "21 degrees and sunny"}])
    assert explicit.output_text == answer.output_text
    assert explicit.usage.input_tokens == answer.usage.input_tokens > first.usage.input_tokens


def test_json_object_and_json_schema_output(oai):
    as_object = oai.responses.create(model="m", input='Give me a JSON object with the key "ok" set to true.', max_output_tokens=40,
                                     temperature=0, text={"format": {"type": "json_object"}})
    assert as_object.status == "completed" and isinstance(json.loads(as_object.output_text), dict)
    common = {"model": "m", "input": "Describe a cat as JSON with its name and age.", "max_output_tokens": 96,
              "temperature": 0}
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}}}
    typed = oai.responses.create(**common, text={"format": {"type": "json_schema", "name": "cat", "schema": schema,
                                                            "strict": True}})
    assert typed.status == "completed"
    jsonschema.validate(json.loads(typed.output_text), schema)
