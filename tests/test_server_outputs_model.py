"""Structured output, tools, logprobs and penalties on the default model (SmolLM2-135M) with the official `openai` client:
schema-valid JSON at temperatures 0 and 1, forced tool calls, logprobs, echo, logit_bias and
penalties. Few tokens each, sent together where they can share decode steps."""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import mlx.core as mx
import openai
import pytest

from mlxcel_py.models import encode_text, load_model
from server_helpers import start_server, stop_server

pytestmark = pytest.mark.slow

SCHEMAS = {
    "nested object, enum, bounded integer": {
        "type": "object", "additionalProperties": False, "required": ["name", "pet"],
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "pet": {"type": "object", "additionalProperties": False, "required": ["kind", "age"], "properties": {
                "kind": {"enum": ["cat", "dog", "fish"]}, "age": {"type": "integer", "minimum": 1, "maximum": 20}}},
        },
    },
    "array with min and max items": {
        "type": "object", "additionalProperties": False, "required": ["scores"],
        "properties": {"scores": {"type": "array", "minItems": 2, "maxItems": 3,
                                  "items": {"type": "integer", "minimum": 0, "maximum": 10}}},
    },
    "string enum and negative bounds": {
        "type": "object", "additionalProperties": False, "required": ["size", "delta"],
        "properties": {"size": {"type": "string", "enum": ["S", "M", "L"]},
                       "delta": {"type": "integer", "minimum": -5, "maximum": -1}},
    },
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
               "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "properties": {}}}}
ECHO_PROMPT = "The capital of France is Paris, and the capital of Italy is Rome."
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def lm():
    return load_model(None)


@pytest.fixture(scope="module")
def reference(lm):
    """Each prompt token's logprob from one full forward (computed before the server runs)."""
    ids = encode_text(lm.tokenizer, ECHO_PROMPT)
    logits = lm.model(mx.array([list(ids)]))[0].astype(mx.float32)
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return ids, [rows[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.fixture(scope="module")
def oai(lm, reference):
    running = start_server(model=lm, parallel=6)
    with openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client
    stop_server(running)


def together(fn, args):
    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(lambda a: fn(*a), args))


def test_every_reply_validates_against_its_schema_at_temperatures_0_and_1(oai):
    def reply(name, temperature):
        return oai.chat.completions.create(
            model="", messages=[{"role": "user", "content": f"Answer in JSON ({name})."}], temperature=temperature,
            seed=7, max_tokens=80,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": SCHEMAS[name], "strict": True}},
        ).choices[0]

    cases = [(name, t) for name in SCHEMAS for t in (0.0, 1.0)]
    for (name, _), choice in zip(cases, together(reply, cases)):
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_json_object_replies_parse(oai):
    def reply(temperature):
        return oai.chat.completions.create(
            model="", messages=[{"role": "user", "content": 'Give me a JSON object with the key "ok" set to true.'}], temperature=temperature,
            seed=3, max_tokens=40, response_format={"type": "json_object"}).choices[0]

    for choice in together(reply, [(0.0,), (1.0,)]):
        assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content), dict)


def test_named_and_required_tool_choices_return_valid_calls_streamed_and_not(oai):
    def call(choice, stream):
        kwargs = dict(model="", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                      tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False, temperature=0,
                      max_tokens=80)
        if not stream:
            out = oai.chat.completions.create(**kwargs).choices[0]
            return out.finish_reason, out.message.content, [(c.id, c.function.name, c.function.arguments)
                                                             for c in out.message.tool_calls]
        calls, finish, content = {}, None, ""
        for chunk in oai.chat.completions.create(**kwargs, stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            for c in delta.tool_calls or []:
                calls[c.index] = (c.id, c.function.name, c.function.arguments)
        return finish, content or None, [calls[i] for i in sorted(calls)]

    named = {"type": "function", "function": {"name": "get_weather"}}
    cases = [(choice, stream) for choice in (named, "required") for stream in (False, True)]
    for (choice, _), (finish, content, calls) in zip(cases, together(call, cases)):
        assert finish == "tool_calls" and content is None and len(calls) == 1
        call_id, name, arguments = calls[0]
        assert call_id.startswith("call_") and name in ("get_weather", "get_time")
        assert choice == "required" or name == "get_weather"
        tool = WEATHER if name == "get_weather" else TIME
        jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


def test_greedy_logprobs_lead_with_the_chosen_token(oai):
    out = oai.chat.completions.create(model="", messages=ASK, temperature=0, max_tokens=6, logprobs=True,
                                      top_logprobs=5).choices[0]
    entries = out.logprobs.content
    assert len(entries) == 6
    assert "".join(e.token for e in entries) == out.message.content
    for e in entries:
        values = [t.logprob for t in e.top_logprobs]
        assert len(values) == 5 and e.top_logprobs[0].token == e.token and values[0] == e.logprob
        assert all(v <= 0 for v in values) and values == sorted(values, reverse=True)


def test_echo_with_logprobs_scores_the_prompt(oai, reference, lm):
    ids, expected = reference
    out = oai.completions.create(model="", prompt=ECHO_PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = out.choices[0]
    assert choice.text == ECHO_PROMPT and out.usage.completion_tokens == 0
    scored = choice.logprobs.token_logprobs
    assert len(scored) == len(ids) and scored[0] is None
    # The reference is a float forward; the server scores the prompt with the CPU step's int8
    # activations where its rows run the prompt (docs/CPU_FAST_PATH.md, "One kernel family"): within
    # 0.19 of it on this prompt (mean 0.04); elsewhere the same float forward's numbers.
    rows = getattr(lm.cpu_decode, "runs_rows", None)
    assert scored[1:] == pytest.approx(expected, abs=0.25 if rows and rows() else 1e-4)


def test_a_ban_on_the_greedy_first_token_changes_the_answer(oai, lm):
    def ask(bias):
        out = oai.chat.completions.create(model="", messages=ASK, temperature=0, max_tokens=5, logprobs=True,
                                          logit_bias=bias).choices[0]
        return out.message.content, bytes(out.logprobs.content[0].bytes).decode()

    answer, first = ask(None)
    token = encode_text(lm.tokenizer, first, add_special_tokens=False)
    assert len(token) == 1
    banned, banned_first = ask({str(token[0]): -100})
    assert banned != answer and banned_first != first


def test_penalties_change_the_output_deterministically(oai):
    def complete(presence, frequency):
        return oai.completions.create(model="", prompt="I like cats. I like cats. I like cats.", max_tokens=10,
                                      temperature=0, presence_penalty=presence, frequency_penalty=frequency
                                      ).choices[0].text

    cases = [(0.0, 0.0), (1.5, 0.0), (0.0, 1.5), (1.5, 0.0), (0.0, 1.5)]
    plain, presence, frequency, presence_again, frequency_again = together(complete, cases)
    assert plain.count("cat") > presence.count("cat") and plain.count("cat") > frequency.count("cat")
    assert (presence_again, frequency_again) == (presence, frequency)
