"""--chat-template: llama.cpp's built-in names render as llama.cpp renders them, Jinja sources
and files, kwargs, the generation prompt and continue_final_message (models/chat_template.py)."""

from datetime import datetime

import pytest

from chat_template_cases import CONVERSATION, FROM_SOURCE, GRANITE_TOOL, GRANITE_TOOL_TURNS, LLAMA_CPP
from mlxcel_py.errors import RequestError
from mlxcel_py.models.chat import ChatOptions, render_chat
from mlxcel_py.models.chat_builtin import BUILTIN
from mlxcel_py.models.chat_template import BUILTIN_NAMES, ChatTemplate, check_kwargs, probe, template_of


class NoTemplate:
    """A tokenizer stand-in: built-in names never call it."""

    chat_template = None


def test_every_builtin_name_has_an_expected_rendering():
    assert set(BUILTIN_NAMES) == set(LLAMA_CPP) | set(FROM_SOURCE)
    assert not set(LLAMA_CPP) & set(FROM_SOURCE)


@pytest.mark.parametrize("name", sorted({**LLAMA_CPP, **FROM_SOURCE}))
def test_a_builtin_name_renders_as_llama_cpp(name):
    expected = {**LLAMA_CPP, **FROM_SOURCE}[name]
    template = template_of(name, "--chat-template")
    assert template.name == name and template.source is None
    assert render_chat(NoTemplate(), CONVERSATION, template=template) == expected


def test_granite_renders_tool_call_turns_as_llama_cpp():
    # Roles the API does not send (assistant_tool_call), so the renderer is called directly.
    assert BUILTIN["granite"](CONVERSATION + GRANITE_TOOL_TURNS, True) == GRANITE_TOOL


def test_without_the_generation_prompt_the_history_ends_with_the_last_turn():
    chatml = template_of("chatml", "--chat-template")
    text = render_chat(NoTemplate(), CONVERSATION, template=chatml, options=ChatOptions(add_generation_prompt=False))
    assert text == LLAMA_CPP["chatml"].removesuffix("<|im_start|>assistant\n")


def test_qwen3_closes_an_empty_think_block_when_thinking_is_off_and_drops_old_reasoning():
    qwen3 = template_of("qwen3", "--chat-template")
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nb"},
             {"role": "user", "content": "c"}]
    on = render_chat(NoTemplate(), turns, template=qwen3)
    assert on == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n" \
                 "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    off = render_chat(NoTemplate(), turns, template=qwen3, options=ChatOptions(kwargs={"enable_thinking": False}))
    assert off == on + "<think>\n\n</think>\n\n"
    server_off = ChatTemplate(name="qwen3", defaults={"enable_thinking": False})
    assert render_chat(NoTemplate(), turns, template=server_off) == off
    # the request's kwargs are merged over the server's
    back_on = ChatOptions(kwargs={"enable_thinking": True})
    assert render_chat(NoTemplate(), turns, template=server_off, options=back_on) == on


def test_continue_final_message_leaves_the_last_turn_open():
    chatml = template_of("chatml", "--chat-template")
    turns = CONVERSATION[:2] + [{"role": "assistant", "content": "The answer is"}]
    options = ChatOptions(add_generation_prompt=False, continue_final_message=True)
    text = render_chat(NoTemplate(), turns, template=chatml, options=options)
    assert text.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nThe answer is")
    # llama3 trims the content; the cut keeps what the template kept
    llama3 = template_of("llama3", "--chat-template")
    spaced = CONVERSATION[:2] + [{"role": "assistant", "content": "  The answer is  "}]
    text = render_chat(NoTemplate(), spaced, template=llama3, options=options)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is")


def test_continue_final_message_needs_the_content_in_the_prompt():
    mistral = template_of("mistral-v7", "--chat-template")
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " "}]
    with pytest.raises(RequestError) as err:
        render_chat(NoTemplate(), turns, template=mistral,
                    options=ChatOptions(add_generation_prompt=False, continue_final_message=True))
    assert err.value.param == "continue_final_message"


def test_a_value_that_is_no_name_is_jinja():
    template = template_of("{{ messages[0].content }}!", "--chat-template")
    assert template.name is None and template.source == "{{ messages[0].content }}!"
    probe(template)  # renders the probe conversation without a tokenizer


def test_the_probe_raises_what_a_broken_template_raises():
    from jinja2 import TemplateError

    with pytest.raises(TemplateError):
        probe(template_of("{% for m in messages %}", "--chat-template"))
    with pytest.raises(TemplateError, match="no users"):
        probe(template_of("{{ raise_exception('no users') }}", "--chat-template"))


def test_date_string_and_strftime_now_are_template_variables():
    template = template_of("{{ date_string }}|{{ strftime_now('%Y') }}", "--chat-template")
    from mlxcel_py.models.chat_template import compile_jinja, context

    text = compile_jinja(template.source).render(messages=[], **context(template, {}))
    now = datetime.now()
    assert text == f"{now.strftime('%d %b %Y')}|{now.year}"


@pytest.mark.parametrize("kwargs,message", [
    ([1], "chat_template_kwargs must be a JSON object (got list)"),
    ({"messages": []}, "chat_template_kwargs may not set 'messages'"),
    ({"add_generation_prompt": False, "tools": []}, "chat_template_kwargs may not set 'add_generation_prompt', 'tools'"),
])
def test_kwargs_must_be_an_object_of_template_variables(kwargs, message):
    with pytest.raises(ValueError) as err:
        check_kwargs(kwargs, "chat_template_kwargs")
    assert str(err.value).startswith(message)
