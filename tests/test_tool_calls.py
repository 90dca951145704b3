"""Tool calls: request validation, rendering (native template and the Hermes fallback), the
forced-call grammar, and parsing, where streamed deltas add up to the whole-text parse."""

import copy
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel_py.models import encode_chat
from mlxcel_py.tool_calls import (
    FALLBACK_PROMPT, ToolCallError, ToolCallStream, call_constraint, tool_format, tool_messages, tool_request,
)

from constrained import generate
from tiny import tiny_model
from tool_call_helpers import parse_tool_calls

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
# The parts of Qwen2.5's template that matter here: tools in the system turn, calls and results.
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{%- endif %}{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}<tool_call>\n"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n{%- else %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
]


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def ids():
    counter = itertools.count(1)
    return lambda: f"call_{next(counter)}"


@pytest.mark.parametrize("args, param, message", [
    (("x",), "tools", "tools must be a list of function tools"),
    (([{"type": "retrieval"}],), "tools", "tools[0] must be {'type': 'function'"),
    (([{"type": "function", "function": {"name": "has space"}}],), "tools", "tools[0].function.name must be 1-64"),
    (([WEATHER, WEATHER],), "tools", "tools has function 'get_weather' more than once"),
    (([WEATHER], {"type": "function", "function": {"name": "nope"}}), "tool_choice",
     "tool_choice names function 'nope', which is not in tools"),
    (([WEATHER], "sometimes"), "tool_choice", "tool_choice must be 'none', 'auto', 'required' or"),
    ((None, "required"), "tool_choice", "tool_choice needs tools"),
    (([WEATHER], "auto", "yes"), "parallel_tool_calls", "parallel_tool_calls must be true or false"),
])
def test_bad_tool_requests_name_the_field(args, param, message):
    with pytest.raises(ToolCallError) as info:
        tool_request(*args)
    assert info.value.param == param and str(info.value).startswith(message)


def test_tool_request_defaults():
    assert tool_request(None) is None and tool_request([], "auto") is None
    req = tool_request([WEATHER, TIME])
    assert (req.choice, req.parallel, req.names, req.forced) == ("auto", True, ("get_weather", "get_time"), False)
    named = tool_request([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, False)
    assert (named.choice, named.parallel, named.forced) == ("get_time", False, True)


def test_a_template_without_tools_gets_the_hermes_fallback(lm):
    fmt = tool_format(lm.tokenizer)
    assert (fmt.parser, fmt.start, fmt.end, fmt.native, fmt.json_calls) == (
        "json_tools", "<tool_call>", "</tool_call>", False, True)
    messages, tools = tool_messages([{"role": "system", "content": "Be brief."}] + CONVERSATION,
                                    tool_request([WEATHER]), fmt)
    prompt = FALLBACK_PROMPT.format(tools=json.dumps(tool_request([WEATHER]).tools[0]))
    assert tools is None and messages == [
        {"role": "system", "content": "Be brief.\n\n" + prompt},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                         "</tool_call>"},
        {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>\n<tool_response>\nsunny\n"
                                    "</tool_response>"},
    ]
    none, _ = tool_messages(CONVERSATION, tool_request([WEATHER], "none"), fmt)
    assert none == messages[1:]  # tool_choice none: the tools are not shown
    encode_chat(lm.tokenizer, messages)  # the rendered turns pass the template


def test_a_template_with_tools_renders_them_itself(lm):
    hf = copy.copy(lm.tokenizer._tokenizer)
    hf.chat_template = QWEN_LIKE
    fmt = tool_format(hf)
    assert (fmt.parser, fmt.native) == ("json_tools", True)
    req = tool_request([WEATHER])
    messages, tools = tool_messages(CONVERSATION[:3], req, fmt)
    text = lm.tokenizer.decode(list(encode_chat(hf, messages, tools=tools).ids))
    # The template's {%- trims the newlines around its tags; the content is what matters.
    assert text == (
        f"<|im_start|>system\n<tools>{json.dumps(req.tools[0])}</tools><|im_end|>"
        "<|im_start|>user\nWeather in Paris?<|im_end|><|im_start|>assistant<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|><|im_start|>assistant"
    )


def test_forced_choices_build_the_call_grammar(lm):
    fmt = tool_format(lm.tokenizer)
    assert call_constraint(tool_request([WEATHER, TIME]), fmt) is None
    assert call_constraint(tool_request([WEATHER], "none"), fmt) is None
    spec = json.loads(call_constraint(tool_request([WEATHER, TIME], "required"), fmt).text)
    assert (spec["start"], spec["end"], spec["parallel"]) == ("<tool_call>", "</tool_call>", True)
    assert [s["properties"]["name"]["const"] for s in spec["schema"]["anyOf"]] == ["get_weather", "get_time"]
    named = json.loads(call_constraint(
        tool_request([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}), fmt).text)
    assert named["parallel"] is False and named["schema"]["properties"]["arguments"] == {
        "$id": "urn:mlxcel:tool:get_weather:parameters", **WEATHER["function"]["parameters"],
        "additionalProperties": False}  # closed: only the listed keys (tool_calls/closed.py)
    pythonic = fmt.__class__("pythonic", "<|tool_call_start|>", "<|tool_call_end|>", fmt.parse, True)
    with pytest.raises(ToolCallError, match="needs a JSON tool-call format") as info:
        call_constraint(tool_request([WEATHER], "required"), pythonic)
    assert info.value.param == "tool_choice"


REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n')


def test_parse_a_whole_reply(lm):
    fmt = tool_format(lm.tokenizer)
    content, calls = parse_tool_calls(REPLY, fmt, new_id=ids())
    assert content == "Let me check."
    assert [c.to_openai() for c in calls] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    _, first = parse_tool_calls(REPLY, fmt, parallel=False, new_id=ids())
    assert [c.name for c in first] == ["get_weather"]
    assert parse_tool_calls("no calls here\n", fmt) == ("no calls here\n", [])
    only, _ = parse_tool_calls(REPLY.split("\n", 1)[1], fmt)
    assert only is None  # only calls: content is null, as OpenAI returns it


@pytest.mark.parametrize("body", ["{not json}", "42", '{"arguments": {}}', '{"name": 3}'])
def test_a_call_that_does_not_parse_stays_as_content(lm, body):
    fmt = tool_format(lm.tokenizer)
    text = f"<tool_call>\n{body}\n</tool_call>"
    assert parse_tool_calls(text, fmt) == (text, [])
    cut = text[: -len("</tool_call>") - 3]  # cut by max_tokens: no name, so no call, and never markup
    assert parse_tool_calls(cut, fmt) == ("", [])


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, len(REPLY)), max_size=12))
def test_streamed_deltas_add_up_to_the_whole_reply_parse(cuts):
    fmt = tool_format(tiny_model().tokenizer)
    bounds = sorted(set(cuts)) + [len(REPLY)]
    stream, deltas, at = ToolCallStream(fmt, new_id=ids()), [], 0
    for b in bounds:
        deltas += stream.feed(REPLY[at:b])
        at = b
    deltas += stream.finish()
    content, calls = parse_tool_calls(REPLY, fmt, new_id=ids())
    assert "".join(d.get("content", "") for d in deltas) == content
    assert [d["tool_calls"][0] for d in deltas if "tool_calls" in d] == [
        c.to_openai(index=i) for i, c in enumerate(calls)]
    assert stream.called


def forced_call(lm, compiler, choice, temperature: float, seed: int):
    """The whole path for one forced tool call: render, constrain, generate, parse."""
    from mlxcel_py.engine.runner.sampling import SequenceSampler
    from mlxcel_py.engine.core.request import SamplingParams

    # Random weights ramble: bound the strings and close the objects (as OpenAI's strict mode does).
    weather, clock = copy.deepcopy(WEATHER), copy.deepcopy(TIME)
    weather["function"]["parameters"]["properties"]["city"]["maxLength"] = 12
    for tool in (weather, clock):
        tool["function"]["parameters"]["additionalProperties"] = False
    # One call: with parallel calls allowed, random weights keep opening new ones until max_tokens.
    req = tool_request([weather, clock], choice, False)
    fmt = tool_format(lm.tokenizer)
    messages, tools = tool_messages([{"role": "user", "content": "Weather in Paris?"}], req, fmt)
    prompt = encode_chat(lm.tokenizer, messages, tools=tools)
    spec = call_constraint(req, fmt)
    params = SamplingParams(temperature=temperature, seed=seed, constraint=spec)
    sampler = SequenceSampler(params, matcher=compiler.matcher(spec))
    text = generate(lm, prompt.ids, sampler, compiler, 400)
    return req, parse_tool_calls(text, fmt, req.as_openai(), req.parallel)


@pytest.mark.parametrize("seed", [0])
def test_a_forced_call_from_the_tiny_model_parses_and_validates(lm, seed):
    import jsonschema

    from mlxcel_py.engine.runner.constraints import ConstraintCompiler

    compiler = ConstraintCompiler(lm.tokenizer, lm.model.args.vocab_size, lm.eos_token_ids)
    named = {"type": "function", "function": {"name": "get_weather"}}
    req, (content, calls) = forced_call(lm, compiler, named, 1.0, seed)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].arguments), req.tools[0]["function"]["parameters"])
    req, (content, calls) = forced_call(lm, compiler, "required", 1.0, seed)
    assert content is None and calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in req.tools}
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
