"""A tool call cut short (max_tokens, or the reply ending before the call's end marker) is a tool
call, never markup: the parser on cut text (exact outputs), the partial-JSON closer, and the
Anthropic tool_result "Error:" prefix. The four dialects over HTTP are in
test_tool_calls_cut_server.py."""

import itertools

import pytest

from mlxcel_py.models.tool_parsers import tool_parser_module
from mlxcel_py.server.anthropic.prepare import openai_messages
from mlxcel_py.server.anthropic.schemas import MessagesRequest
from mlxcel_py.tool_calls import ToolCallStream, ToolFormat, arguments_object, complete_json

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def fmt_of(parser: str) -> ToolFormat:
    module = tool_parser_module(parser)
    return ToolFormat(parser, module.tool_call_start, module.tool_call_end, module.parse_tool_call, True)


def run(text: str, cut: bool = True, parser: str = "json_tools", tools=(WEATHER,), parallel: bool = True,
        pieces: int = 0) -> list[dict]:
    """The deltas of `text` fed whole (or in `pieces`-character pieces), then finished; content
    deltas in a row joined (a stream releases text as it becomes clear)."""
    counter = itertools.count(1)
    stream = ToolCallStream(fmt_of(parser), list(tools) if tools else None, parallel, lambda: f"call_{next(counter)}")
    step = pieces or len(text) or 1
    deltas = [d for at in range(0, len(text), step) for d in stream.feed(text[at : at + step])]
    out: list[dict] = []
    for delta in deltas + stream.finish(cut):
        if "content" in delta and out and "content" in out[-1]:
            out[-1] = {"content": out[-1]["content"] + delta["content"]}
        else:
            out.append(delta)
    return out


def call(index: int, arguments: str, name: str = "get_weather") -> dict:
    return {"index": index, "id": f"call_{index + 1}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def test_a_call_cut_in_its_arguments_is_a_partial_call():
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    expected = [{"content": "Checking."}, {"tool_calls": [call(0, '{"city": "Par')], "partial": True}]
    assert run(text) == expected
    assert run(text, pieces=1) == expected  # streamed a character at a time: the same deltas
    assert run(text, cut=False) == expected  # the reply ended (EOS) inside the call: a call too


@pytest.mark.parametrize(("text", "arguments"), [
    ('<tool_call>{"name": "get_weather"', ""),
    ('<tool_call>{"name": "get_weather", "arguments": ', ""),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa\\u00', '{"city": "Pa\\u00'),
    ('<tool_call>{"name": "get_weather", "arguments": {"days": [1, 2', '{"days": [1, 2'),
])
def test_arguments_are_the_text_generated_so_far(text, arguments):
    assert run(text) == [{"tool_calls": [call(0, arguments)], "partial": True}]


def test_whole_arguments_before_the_end_marker_make_a_whole_call():
    for text in (CALL[:-3], CALL[: -len("</tool_call>")], CALL[: CALL.rindex("}")]):
        assert run(text) == [{"tool_calls": [call(0, '{"city": "Paris"}')]}], text


@pytest.mark.parametrize("cut", range(1, len("<tool_call>")))
def test_a_cut_inside_the_start_marker_drops_it(cut):
    text = "Let me check.\n" + "<tool_call>"[:cut]
    assert run(text) == run(text, pieces=1) == [{"content": "Let me check."}]
    if cut > 1:  # a reply that really ended with it (EOS) keeps its text
        assert run(text, cut=False) == [{"content": text}]


def test_after_complete_calls_a_cut_call_or_marker_adds_no_markup():
    second = CALL.replace("Paris", "Rome")
    assert run(f"{CALL}\n{second[:5]}") == [{"tool_calls": [call(0, '{"city": "Paris"}')]}]
    assert run(f"{CALL}\n{second[:-18]}", pieces=3) == [
        {"tool_calls": [call(0, '{"city": "Paris"}')]}, {"tool_calls": [call(1, '{"city": "Ro')], "partial": True}]
    assert run(f"{CALL}\n{second[:-18]}", parallel=False) == [{"tool_calls": [call(0, '{"city": "Paris"}')]}]


@pytest.mark.parametrize("text", [
    "<tool_call>", '<tool_call>\n{"na', '<tool_call>\n{"name": "get_wea', '<tool_call>\n{"name": ""',
    '<tool_call>\n{"name": "nope", "arguments": {"a": 1', "<tool_call>\nnot json", '<tool_call>[{"name": "get_weather"',
])
def test_a_cut_call_without_a_known_complete_name_is_dropped(text):
    assert run(text) == run(text, pieces=2) == []
    assert run("Hi." + text) == [{"content": "Hi."}]


def test_without_the_requests_tools_any_complete_name_is_a_call():
    assert run('<tool_call>{"name": "nope", "arguments": {', tools=None) == [
        {"tool_calls": [call(0, "{", name="nope")], "partial": True}]


def test_a_closed_call_that_does_not_parse_stays_content():
    text = "<tool_call>\n{not json}\n</tool_call>"
    assert run(text) == [{"content": text}]


def test_formats_read_only_whole_drop_a_cut_call_but_return_an_unterminated_whole_one():
    assert run('Sure. <|tool_call_start|>[get_weather(city="Pa', parser="pythonic") == [{"content": "Sure."}]
    assert run("<|tool_call_start|>[get_weather(city=\"Paris\")]", parser="pythonic") == [
        {"tool_calls": [call(0, '{"city": "Paris"}')]}]
    # Mistral's calls have no end marker: they run to the end of the reply.
    assert run('Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', cut=False, parser="mistral", pieces=4) == [
        {"content": "Sure."}, {"tool_calls": [call(0, '{"city": "Paris"}')]}]
    assert run('[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', parser="mistral") == []


@pytest.mark.parametrize(("text", "value"), [
    ('{"setup": "Why', {"setup": "Why"}),
    ('{"a": 1, "b', {"a": 1}),
    ('{"a": 1, "b": ', {"a": 1}),
    ('{"a": 1, "b": tru', {"a": 1}),
    ('{"a": 1,', {"a": 1}),
    ('{"a": 12', {"a": 12}),
    ('{"a": 1.', {}),
    ('{"a": "x\\u00', {"a": "x"}),
    ('{"a": "x\\', {"a": "x"}),
    ('{"a": {"b": ["c", {"d": "e', {"a": {"b": ["c", {"d": "e"}]}}),
    ('{"a": {"b": "c"}, "d": [', {"a": {"b": "c"}, "d": []}),
    ("{", {}),
    ('{"a": true}', {"a": True}),
])
def test_complete_json_closes_cut_json(text, value):
    assert complete_json(text) == value == arguments_object(text)


@pytest.mark.parametrize("text", ["", "garbage", "[1, 2", '"a string', "42"])
def test_arguments_that_are_no_object_are_an_empty_one(text):
    assert arguments_object(text) == {}


@pytest.mark.parametrize(("text", "is_error", "rendered"), [
    ("down", True, "Error: down"),
    ("Error: down", True, "Error: down"),
    ("  error: down", True, "  error: down"),
    ("ERROR:down", True, "ERROR:down"),
    ("Errors: two", True, "Error: Errors: two"),
    ("Error: down", False, "Error: down"),
    ("fine", None, "fine"),
])
def test_an_error_result_says_error_once(text, is_error, rendered):
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text,
              **({} if is_error is None else {"is_error": is_error})}
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "w", "input": {}}]},
        {"role": "user", "content": [result]}]})
    assert openai_messages(body)[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": rendered}
