"""--chat-template on the server: /apply-template, the chat and Anthropic routes render with it,
request fields (chat_template_kwargs, add_generation_prompt, continue_final_message) and their
errors, and the startup checks (models/chat_template.py, server/generation/template.py)."""

from datetime import datetime

import pytest

from chat_template_cases import CONVERSATION, LLAMA_CPP
from mlxcel_py.config import resolve
from mlxcel_py.errors import ConfigError
from mlxcel_py.server.generation.template import BOTH
from mlxcel_py.server.runtime import Runtime
from config_helpers import flags_for
from server_helpers import GREEDY, error_of, start_server, stop_server
from tiny import tiny_model

# A file template that shows what a Jinja template is given: special tokens, kwargs, the date.
FILE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}|{{ greeting }}|{{ who }}|{{ date_string }}|"
    "{{ strftime_now('%Y') }}"
)


@pytest.fixture(scope="module")
def llama3():
    running = start_server(parallel=1, chat_template="llama3")
    with running.client() as client:
        yield client
    stop_server(running)


@pytest.fixture(scope="module")
def from_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "t.jinja"
    path.write_text(FILE_TEMPLATE)
    running = start_server(parallel=1, chat_template_file=str(path), chat_template_kwargs='{"greeting": "hello"}')
    with running.client() as client:
        yield client
    stop_server(running)


def _apply(client, messages, **fields):
    return client.post("/apply-template", json={"messages": messages, **fields})


def test_apply_template_renders_the_builtin_name_as_llama_cpp(llama3):
    resp = _apply(llama3, CONVERSATION)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"prompt": LLAMA_CPP["llama3"]}
    without = _apply(llama3, CONVERSATION, add_generation_prompt=False).json()["prompt"]
    assert without == LLAMA_CPP["llama3"].removesuffix("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_every_chat_route_renders_with_the_builtin_name(llama3):
    prompt = _apply(llama3, CONVERSATION[:2]).json()["prompt"]
    ids = llama3.post("/tokenize", json={"content": prompt}).json()["tokens"]
    # Ollama's count leaves out prompt-cache hits, so it goes first, before the prompt is cached.
    ollama = llama3.post("/api/chat", json={"model": "m", "messages": CONVERSATION[:2], "stream": False,
                                            "options": {"num_predict": 1}})
    assert ollama.json()["prompt_eval_count"] == len(ids)
    chat = llama3.post("/v1/chat/completions", json={"messages": CONVERSATION[:2], "max_tokens": 1, **GREEDY})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)
    count = llama3.post("/v1/messages/count_tokens", json={
        "model": "m", "system": CONVERSATION[0]["content"], "messages": [CONVERSATION[1]]})
    assert count.json() == {"input_tokens": len(ids)}
    responses = llama3.post("/v1/responses", json={"instructions": CONVERSATION[0]["content"],
                                                   "input": CONVERSATION[1]["content"], "max_output_tokens": 1})
    assert responses.json()["usage"]["input_tokens"] == len(ids)


def test_props_and_api_show_report_the_chosen_template(llama3):
    assert llama3.get("/props").json()["chat_template"] == "llama3"
    assert llama3.post("/api/show", json={"model": "m"}).json()["template"] == "llama3"


def test_continue_final_message_leaves_the_assistant_turn_open(llama3):
    turns = CONVERSATION[:2] + [{"role": "assistant", "content": "I think"}]
    expected = "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI think"
    for extra in ({"add_generation_prompt": False}, {}):  # continuing implies no generation prompt
        resp = _apply(llama3, turns, continue_final_message=True, **extra)
        assert resp.json()["prompt"].endswith(expected), resp.text
    prompt = resp.json()["prompt"]
    ids = llama3.post("/tokenize", json={"content": prompt}).json()["tokens"]
    chat = llama3.post("/v1/chat/completions", json={"messages": turns, "continue_final_message": True,
                                                      "max_tokens": 1, **GREEDY})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("path", ["/apply-template", "/v1/chat/completions"])
def test_continue_final_message_and_the_generation_prompt_exclude_each_other(llama3, path):
    turns = CONVERSATION[:2] + [{"role": "assistant", "content": "I think"}]
    body = {"messages": turns, "max_tokens": 1, "continue_final_message": True, "add_generation_prompt": True}
    resp = llama3.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["param"] == "continue_final_message" and error_of(resp)["message"] == BOTH


def test_a_file_template_gets_special_tokens_kwargs_and_the_date(from_file):
    now = datetime.now()
    tail = f"|{now.strftime('%d %b %Y')}|{now.year}"
    resp = _apply(from_file, [{"role": "user", "content": "Hi"}])
    assert resp.json() == {"prompt": f"<|im_start|>[user]Hi<|im_end|>[assistant]|hello|{tail}"}
    # the request's kwargs merge over --chat-template-kwargs
    merged = _apply(from_file, [{"role": "user", "content": "Hi"}], chat_template_kwargs={"who": "you", "greeting": "yo"})
    assert merged.json() == {"prompt": f"<|im_start|>[user]Hi<|im_end|>[assistant]|yo|you{tail}"}
    override = _apply(from_file, [{"role": "user", "content": "Hi"}], chat_template_kwargs={"date_string": "26 Jul 2024"})
    assert override.json()["prompt"].endswith(f"|hello||26 Jul 2024|{now.year}")


@pytest.mark.parametrize("kwargs,message", [
    ("x", "invalid 'chat_template_kwargs'"),
    ({"messages": []}, "chat_template_kwargs may not set 'messages'"),
])
def test_bad_kwargs_are_a_400_naming_the_field(from_file, kwargs, message):
    for path in ("/apply-template", "/v1/chat/completions"):
        resp = from_file.post(path, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                          "chat_template_kwargs": kwargs})
        assert resp.status_code == 400, resp.text
        assert error_of(resp)["param"] == "chat_template_kwargs"
        assert error_of(resp)["message"].startswith(message), error_of(resp)["message"]


def test_kwargs_the_template_chokes_on_are_a_400_naming_the_field():
    # `n + 1` with a string n: the template raises a TypeError, which is the kwargs' fault
    running = start_server(parallel=1, chat_template="{{ messages[0].content }}{{ (n or 0) + 1 }}")
    try:
        with running.client() as client:
            assert _apply(client, [{"role": "user", "content": "a"}]).json() == {"prompt": "a1"}
            assert _apply(client, [{"role": "user", "content": "a"}], chat_template_kwargs={"n": 2}).json() == {"prompt": "a3"}
            resp = _apply(client, [{"role": "user", "content": "a"}], chat_template_kwargs={"n": "two"})
            assert resp.status_code == 400, resp.text
            assert error_of(resp)["param"] == "chat_template_kwargs"
            assert "--chat-template rejected chat_template_kwargs" in error_of(resp)["message"]
    finally:
        stop_server(running)


def test_a_template_that_fails_with_the_models_tokens_stops_the_start():
    bad = "{% if bos_token %}{{ raise_exception('no bos here') }}{% endif %}"
    cfg = resolve("serve", flags_for("serve", port=0, chat_template=bad), env={})
    with pytest.raises(ConfigError) as err:
        Runtime(cfg)._check_template(tiny_model())
    assert str(err.value) == "--chat-template: the chat template does not render with this model: no bos here"
    assert err.value.flag == "--chat-template"
