"""Chat prompts: template rendering, the history boundary, validation, fallback format."""

import dataclasses

import mlx.core as mx
import pytest

from mlxcel_py.models import ChatPrompt, encode_chat, encode_text, load_model
from mlxcel_py.errors import RequestError
from mlxcel_py.models.chat import ChatOptions, validate_messages
from mlxcel_py.tool_calls.render import tool_format, tool_messages
from tiny import tiny_model, write_tiny_gguf

TURN1 = [{"role": "user", "content": "What is the capital of France?"}]
TURN2 = TURN1 + [
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def test_chat_prompt_renders_chatml():
    tok = tiny_model().tokenizer
    prompt = encode_chat(tok, TURN1)
    assert isinstance(prompt, ChatPrompt) and isinstance(prompt.ids, tuple)
    assert tok.decode(list(prompt.ids)) == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_history_boundary_is_the_next_turns_prefix():
    tok = tiny_model().tokenizer
    first, second = encode_chat(tok, TURN1), encode_chat(tok, TURN2)
    boundary = first.history_boundary
    assert boundary is not None and boundary < len(first.ids)
    assert tok.decode(list(first.ids[boundary:])) == "<|im_start|>assistant\n"
    assert second.ids[:boundary] == first.ids[:boundary]
    assert encode_chat(tok, TURN1, options=ChatOptions(add_generation_prompt=False)).history_boundary is None


def test_text_parts_are_joined():
    tok = tiny_model().tokenizer
    content = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]
    parts = [{"role": "user", "content": content}]
    text = tok.decode(list(encode_chat(tok, parts).ids))
    assert "<|im_start|>user\nWhat is the capital\nof France?<|im_end|>" in text


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages must be a non-empty list"),
        ("hi", "messages must be a non-empty list"),
        (["hi"], r"messages\[0\] must be an object"),
        (
            [{"role": "robot", "content": "x"}],
            r"messages\[0\]\.role must be one of system, developer, user, assistant, tool \(got 'robot'\)",
        ),
        ([{"role": "user"}], r"messages\[0\] has no 'content'"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\.content must be a string or a list of text parts"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], r"content parts must be"),
    ],
)
def test_invalid_messages(messages, message):
    with pytest.raises(RequestError, match=message):
        encode_chat(tiny_model().tokenizer, messages)


class NoTemplate:
    """A tokenizer without a chat template: characters as ids."""

    chat_template = None
    bos_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


def test_fallback_format_without_template():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = encode_chat(NoTemplate(), messages)
    assert "".join(map(chr, prompt.ids)) == "system: Be brief.\nuser: Hi\nassistant:"
    assert prompt.history_boundary == len("system: Be brief.\nuser: Hi\n")


def test_encode_text():
    tok = tiny_model().tokenizer
    ids = encode_text(tok, "Hello world")
    assert isinstance(ids, tuple) and tok.decode(list(ids)) == "Hello world"  # add_bos is False
    with pytest.raises(RequestError, match="prompt must be a string"):
        encode_text(tok, None)


def test_bos_added_once_when_the_model_wants_it(tmp_path):
    meta = {
        "tokenizer.ggml.add_bos_token": mx.array(True),
        "tokenizer.ggml.bos_token_id": mx.array(0, dtype=mx.uint32),
    }
    model = load_model(str(write_tiny_gguf(tmp_path / "bos.gguf", metadata=meta)))
    assert (model.add_bos, model.bos_token_id) == (True, 0)
    assert encode_text(model.tokenizer, "Hi")[0] == 0
    assert encode_text(model.tokenizer, "Hi", add_special_tokens=False)[0] != 0
    prompt = encode_chat(model.tokenizer, TURN1)
    assert prompt.ids[:2] == (0, 1) and prompt.ids.count(0) == 1
    assert prompt.history_boundary is not None


CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_TURNS = [
    {"role": "user", "content": "2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
]


def test_developer_renders_as_system():
    tok = tiny_model().tokenizer
    as_system = encode_chat(tok, [{"role": "system", "content": "Be brief."}, *TURN1])
    assert encode_chat(tok, [{"role": "developer", "content": "Be brief."}, *TURN1]) == as_system


def test_tool_calls_without_template_support_are_written_into_the_turn():
    tok = tiny_model().tokenizer
    messages, tools = tool_messages(validate_messages(TOOL_TURNS), None, tool_format(tok))
    text = tok.decode(list(encode_chat(tok, messages, tools=tools).ids))
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
            '<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>') in text


class ToolTemplate(NoTemplate):
    """A template that renders tool_calls itself (like Llama 3.1's or Qwen's)."""

    chat_template = "{% for m in messages %}{{ m.role }}{% for c in m.tool_calls or [] %}|{{ c.function.name }}" \
                    "({{ c.function.arguments.a }},{{ c.function.arguments.b }}){% endfor %};{% endfor %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **variables):
        import jinja2

        return jinja2.Template(self.chat_template).render(messages=messages)


def test_tool_calls_reach_a_template_that_knows_them():
    native = dataclasses.replace(tool_format(tiny_model().tokenizer), native=True)
    messages, _ = tool_messages(validate_messages(TOOL_TURNS), None, native)
    prompt = encode_chat(ToolTemplate(), messages)
    assert "".join(map(chr, prompt.ids)) == "user;assistant|add(2,3);tool;"


def test_content_may_be_null_only_with_tool_calls():
    with pytest.raises(RequestError, match=r"messages\[0\]\.content must be a string"):
        encode_chat(tiny_model().tokenizer, [{"role": "assistant", "content": None}])
