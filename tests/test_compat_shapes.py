"""The llama-server and Anthropic shapes as pure functions: a Messages body -> OpenAI turns and
tools, and the stop fields of both APIs for every way a request ends (EOS included, which
the tiny model does not reliably reach)."""

import pytest

from mlxcel_py.engine import Finished
from mlxcel_py.engine.core.events import Timings, Usage
from mlxcel_py.errors import RequestError
from mlxcel_py.server.anthropic.prepare import openai_messages, tools_of
from mlxcel_py.server.anthropic.schemas import MessagesRequest
from mlxcel_py.server.anthropic.shapes import AnthropicReply, stop_reason, usage_json
from mlxcel_py.server.llama.shapes import NativeReply, final_json, pick_fields

TIMINGS = Timings(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


def finished(reason, completion=5, stop_word=None, prompt=10, cached=4, slot=1):
    return Finished("r", reason, Usage(prompt, completion, cached), TIMINGS, stop_word=stop_word, slot=slot)


def body(**kwargs):
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **kwargs})


def test_turns_tool_use_and_results():
    req = body(system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;"},
                       {"type": "text", "text": "You are Claude Code."}],
               messages=[
                   {"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                     {"type": "tool_use", "id": "toolu_1", "name": "w",
                                                      "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                                                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                                 "content": [{"type": "text", "text": "down"}]}]},
               ])
    assert openai_messages(req) == [
        # the per-request stamp is blanked so the prompt cache sees one prefix
        {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1; cch=fffff;\nYou are Claude Code."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: down"},  # results answer the calls first
        {"role": "user", "content": "Thanks"},
    ]


@pytest.mark.parametrize(("messages", "words"), [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "prefill"),
    ([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}]}],
     "a user message cannot hold a 'tool_use' block"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
      {"role": "user", "content": "a"}], "an assistant message cannot hold a 'tool_result' block"),
])
def test_misplaced_blocks_are_refused(messages, words):
    with pytest.raises(RequestError) as info:  # a 400 naming the field, raised where it is found
        openai_messages(body(messages=messages))
    assert words in str(info.value) and info.value.param == "messages"


def test_tool_choice_mapping():
    tool = {"name": "w", "input_schema": {"type": "object"}, "description": "Weather"}
    msgs = [{"role": "user", "content": "a"}]
    cases = {"auto": "auto", "any": "required", "none": "none"}
    for kind, choice in cases.items():
        assert tools_of(body(messages=msgs, tools=[tool], tool_choice={"type": kind})).choice == choice
    named = tools_of(body(messages=msgs, tools=[tool], tool_choice={"type": "tool", "name": "w",
                                                                     "disable_parallel_tool_use": True}))
    assert (named.choice, named.parallel, named.tools[0]["function"]["description"]) == ("w", False, "Weather")
    assert tools_of(body(messages=msgs)) is None


def test_anthropic_stop_reasons_and_usage():
    reply = AnthropicReply("msg_1", "m", 10, max_tokens=5)
    assert stop_reason(reply, finished("stop"), called=False) == ("end_turn", None)
    assert stop_reason(reply, finished("stop", stop_word="END"), called=False) == ("stop_sequence", "END")
    assert stop_reason(reply, finished("stop"), called=True) == ("tool_use", None)
    assert stop_reason(reply, finished("length", completion=5), called=True) == ("max_tokens", None)
    assert stop_reason(reply, finished("length", completion=3), called=False) == ("model_context_window_exceeded", None)
    assert usage_json(finished("stop")) == {"input_tokens": 6, "output_tokens": 5, "cache_creation_input_tokens": 0,
                                            "cache_read_input_tokens": 4}


@pytest.mark.parametrize(("event", "stop_type", "word", "cached", "truncated"), [
    (finished("stop"), "eos", "", 15, False),  # EOS is not kept: prompt + text are all in the KV cache
    (finished("stop", stop_word="\n\n"), "word", "\n\n", 14, False),
    (finished("length"), "limit", "", 14, False),
    (finished("length", completion=10, prompt=10), "limit", "", 19, True),  # the slot's context (20) is full
])
def test_native_stop_fields(event, stop_type, word, cached, truncated):
    reply = NativeReply("m", "prompt", 10, 20, {"n_predict": 5})
    out = final_json(reply, "text\n", (1, 2), event)
    assert (out["stop_type"], out["stopping_word"], out["tokens_cached"], out["truncated"]) == (
        stop_type, word, cached, truncated)
    assert (out["id_slot"], out["has_new_line"], out["tokens"]) == (1, True, [])


def test_response_fields_pick_nested_paths():
    body_ = {"content": "x", "timings": {"prompt_n": 3}, "generation_settings": {"n_predict": 4}}
    assert pick_fields(body_, ("content", "timings/prompt_n", "timings/nope", "nope")) == {
        "content": "x", "timings/prompt_n": 3}


def _events(frames):
    import json

    out = []
    for frame in frames:
        name, data = frame.strip().split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        out.append(payload)
    return out


def test_anthropic_event_trace():
    from mlxcel_py.engine import PromptProgress, TokenDelta
    from mlxcel_py.server.anthropic.shapes import AnthropicFramer

    framer = AnthropicFramer(AnthropicReply("msg_1", "m", 10, max_tokens=5))
    frames = framer.opening() + framer.frames(PromptProgress("r", 10, 0, 10, 1.0, 512))
    frames += framer.frames(TokenDelta("r", 7, "Hel")) + framer.frames(TokenDelta("r", 8, ""))
    frames += framer.frames(TokenDelta("r", 9, "lo")) + framer.frames(finished("stop", stop_word="!"))
    trace = [(e["type"], e.get("index"), e.get("delta")) for e in _events(frames)]
    assert trace == [
        ("message_start", None, None), ("ping", None, None), ("ping", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, {"type": "text_delta", "text": "Hel"}),
        ("content_block_delta", 0, {"type": "text_delta", "text": "lo"}),
        ("content_block_stop", 0, None),
        ("message_delta", None, {"stop_reason": "stop_sequence", "stop_sequence": "!"}),
        ("message_stop", None, None),
    ]


def test_anthropic_stream_failure_is_an_error_event():
    from mlxcel_py.server.anthropic.shapes import AnthropicFramer

    framer = AnthropicFramer(AnthropicReply("msg_1", "m", 10, max_tokens=5))
    failed = Finished("r", "error", Usage(10, 0, 0), TIMINGS, error="the engine failed")
    assert _events(framer.frames(failed)) == [
        {"type": "error", "error": {"type": "api_error", "message": "the engine failed"}}]


def test_native_frames_carry_held_tokens_with_their_text():
    import json

    from mlxcel_py.engine import TokenDelta
    from mlxcel_py.server.llama.shapes import NativeFramer

    framer = NativeFramer(NativeReply("m", "p", 3, 20, {}))
    frames = framer.frames(TokenDelta("r", 5, "a")) + framer.frames(TokenDelta("r", 6, ""))
    frames += framer.frames(TokenDelta("r", 7, "bc")) + framer.frames(finished("length", completion=3))
    got = [json.loads(f[6:]) for f in frames]
    assert [(g["content"], g["tokens"], g["tokens_predicted"], g["stop"]) for g in got[:-1]] == [
        ("a", [5], 1, False), ("bc", [6, 7], 3, False)]
    assert got[-1]["stop"] is True and got[-1]["content"] == "" and got[-1]["stop_type"] == "limit"
