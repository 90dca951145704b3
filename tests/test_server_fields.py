"""Honour or refuse: every request field is type-checked, and one that would change the
output is either implemented or a 400 naming it; never silently ignored."""

import re
from pathlib import Path

import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsBase as OpenAIChat
from openai.types.completion_create_params import CompletionCreateParamsBase as OpenAICompletion
from openai.types.responses.response_create_params import ResponseCreateParamsBase as OpenAIResponses

from mlxcel_py.server.ollama import fields as ollama_fields
from mlxcel_py.server.ollama.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaMessage, OllamaOptions
from mlxcel_py.server.openai.schemas import ChatRequest, CompletionRequest
from mlxcel_py.server.openai.fields import NOT_SUPPORTED_YET
from mlxcel_py.server.responses import fields as responses_fields
from mlxcel_py.server.responses.schemas import ResponsesRequest
from server_helpers import GREEDY, error_of, start_server, stop_server

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
MSG = [{"role": "user", "content": "Tell me about foxes."}]
BASE = {
    CHAT: {"messages": MSG, "max_tokens": 8, **GREEDY},
    COMPLETIONS: {"prompt": "Foxes are", "max_tokens": 8, **GREEDY},
    RESPONSES: {"input": "Tell me about foxes.", "max_output_tokens": 8, **GREEDY},
}
MODELS = {CHAT: ChatRequest, COMPLETIONS: CompletionRequest, RESPONSES: ResponsesRequest}
HONOURED = {
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n_predict", "temperature", "top_p",
    "top_k", "min_p", "repetition_penalty", "repeat_penalty", "repeat_last_n", "seed", "stop", "stream",
    "stream_options", "n", "ignore_eos", "cache_prompt", "return_progress",
    # structured output, tools, logprobs, logit bias and penalties (test_server_outputs*.py)
    "response_format", "json_schema", "grammar", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "logprobs", "top_logprobs", "n_probs", "echo", "logit_bias", "presence_penalty",
    "frequency_penalty",
    "suffix",  # fill-in-the-middle (test_infill.py)
    # llama.cpp's chain (test_sampler_chain_server.py)
    "typical_p", "mirostat", "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent",
    "xtc_probability", "xtc_threshold", "top_n_sigma", "min_keep", "samplers",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
    "adapters",  # mlx_lm.server's: a loaded LoRA adapter (test_lora.py)
    # the chat template's fields (test_server_chat_templates.py)
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
    "reasoning_format",  # test_server_reasoning.py
    "n_keep", "n_discard",  # with --context-shift (test_server_context_shift.py)
    "thinking_budget_tokens",  # test_server_reasoning_budget.py
}
# A value that changes the output, per field not implemented yet: each must be a 400.
CHANGING = {
    "best_of": 2,
    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {}, "moderation": {"model": "omni-moderation-latest"}, "verbosity": "low",
    "reasoning_effort": "high", "post_sampling_probs": True,
}
# Values of those fields that change nothing, and fields that are ignored: all accepted.
INERT = {
    "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "functions": [], "function_call": "auto",
    "logprobs": False, "top_logprobs": 0, "n_probs": 0, "post_sampling_probs": False, "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0.0, "grammar": "", "modalities": ["text"], "verbosity": "medium",
    "reasoning_effort": "medium", "typical_p": 1.0, "mirostat": 0, "dynatemp_range": 0, "dry_multiplier": 0,
    "xtc_probability": 0, "user": "u-1", "metadata": {"k": "v"}, "store": True, "service_tier": "auto",
    "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit"}, "prediction": {"type": "content", "content": "x"},
    "stream_options": {"include_obfuscation": True},
}
INERT_COMPLETIONS = {"echo": False, "suffix": "", "best_of": 1, "logprobs": None}


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=1)
    with running.client() as client:
        yield client
    stop_server(running)


def _ignored_in_docs() -> set[str]:
    docs = (Path(__file__).parents[1] / "docs" / "SERVER.md").read_text()
    line = next(line for line in docs.splitlines() if line.startswith("Ignored (they change nothing here):"))
    return set(re.findall(r"`([a-z_]+)`", line))


def test_every_openai_field_is_declared():
    assert set(OpenAIChat.__annotations__) <= set(ChatRequest.model_fields)
    assert set(OpenAICompletion.__annotations__) <= set(CompletionRequest.model_fields)


def test_every_field_is_honoured_refused_or_documented_as_ignored():
    refused = {row.field for row in NOT_SUPPORTED_YET}
    declared = set(ChatRequest.model_fields) | set(CompletionRequest.model_fields)
    assert declared == HONOURED | refused | _ignored_in_docs()
    assert not HONOURED & refused and set(CHANGING) == refused


def _docs_table(routes: tuple[str, ...] = ("both", "chat", "compl.")) -> dict[str, tuple[str, str]]:
    """The field tables of docs/SERVER.md and docs/API_RESPONSES.md: field -> (route, status), for the rows of `routes`."""
    docs = "\n".join((Path(__file__).parents[1] / "docs" / page).read_text() for page in ("SERVER.md", "API_RESPONSES.md"))
    rows = {}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] in ("honoured", "refused", "ignored") and cells[1] in routes:
            rows.update({name: (cells[1], cells[2]) for name in re.findall(r"`([a-z_]+)`", cells[0])})
    return rows


def test_every_responses_field_is_declared_and_documented():
    declared = set(ResponsesRequest.model_fields)
    assert set(OpenAIResponses.__annotations__) <= declared
    f = responses_fields
    statuses = {"honoured": f.HONOURED, "refused": f.REFUSED, "ignored": f.IGNORED}
    assert f.HONOURED | f.REFUSED | f.IGNORED == declared and sum(map(len, statuses.values())) == len(declared)
    table = _docs_table(("responses",))
    assert {status: {k for k, (_, s) in table.items() if s == status} for status in statuses} == statuses


def test_the_docs_table_is_exact():
    table = _docs_table()
    declared = set(ChatRequest.model_fields) | set(CompletionRequest.model_fields)
    assert set(table) == declared
    statuses = ("honoured", "refused", "ignored")
    by_status = {status: {f for f, (_, s) in table.items() if s == status} for status in statuses}
    assert by_status == {"honoured": HONOURED, "refused": {row.field for row in NOT_SUPPORTED_YET},
                         "ignored": _ignored_in_docs()}
    for field, (route, _) in table.items():
        chat, completions = field in ChatRequest.model_fields, field in CompletionRequest.model_fields
        assert route == {(True, True): "both", (True, False): "chat", (False, True): "compl."}[chat, completions], field


def _kind(field):
    return COMPLETIONS if field not in ChatRequest.model_fields else CHAT


@pytest.mark.parametrize("field", sorted(CHANGING))
def test_a_meaning_changing_field_is_refused(http, field):
    path = _kind(field)
    resp = http.post(path, json={**BASE[path], field: CHANGING[field]})
    assert resp.status_code == 400, resp.text
    error = error_of(resp)
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert error["message"].startswith(f"'{field}' is not supported yet")


def test_values_that_change_nothing_are_accepted(http):
    for path, inert in ((CHAT, INERT), (COMPLETIONS, {**INERT_COMPLETIONS, "presence_penalty": 0})):
        plain = http.post(path, json=BASE[path]).json()["choices"][0]
        resp = http.post(path, json={**BASE[path], **{k: v for k, v in inert.items() if k in _fields(path)}})
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0] == plain


def _fields(path):
    return MODELS[path].model_fields


def _wrong_value(schema: dict):
    """A JSON value of a type the field's schema does not allow."""
    types, stack = set(), [schema]
    while stack:
        node = stack.pop()
        types |= {node["type"]} if isinstance(node.get("type"), str) else set(node.get("type", []))
        types |= {"object"} if "$ref" in node else set()
        stack += node.get("anyOf", []) + node.get("oneOf", [])
    for value, kind in (("x", "string"), (True, "boolean"), (7, "integer"), ({"a": 1}, "object")):
        if kind not in types and not (kind == "integer" and "number" in types):
            return value
    raise AssertionError(f"no wrong type for {schema}")


@pytest.mark.parametrize("path,field", [(p, f) for p in MODELS for f in sorted(_fields(p))])
def test_every_field_is_type_checked(http, path, field):
    schema = MODELS[path].model_json_schema(by_alias=True)["properties"][field]
    resp = http.post(path, json={**BASE[path], field: _wrong_value(schema)})
    assert resp.status_code == 400, (field, resp.text)
    assert error_of(resp)["param"] == field


def test_repeat_last_n_is_honoured(http):
    body = {**BASE[COMPLETIONS], "max_tokens": 24, "ignore_eos": True, "cache_prompt": False}

    def text(**extra):
        return http.post(COMPLETIONS, json={**body, **extra}).json()["choices"][0]["text"]

    plain, penalised = text(), text(repeat_penalty=1.8)
    assert plain != penalised  # the penalty changes this continuation
    assert text(repeat_penalty=1.8, repeat_last_n=0) == plain  # llama-server's 0: the penalty is off
    assert text(repeat_penalty=1.8, repeat_last_n=64) == penalised  # 64 is the default window
    assert error_of(http.post(COMPLETIONS, json={**body, "repeat_last_n": -2}))["param"] == "repeat_last_n"


OLLAMA_MODELS = {"chat": OllamaChatRequest, "generate": OllamaGenerateRequest, "options": OllamaOptions,
                 "message": OllamaMessage}
# The Route column of Ollama's table -> the parts of OLLAMA_MODELS it covers.
OLLAMA_ROUTES = {"/api/chat": ["chat"], "/api/generate": ["generate"], "/api/chat+generate": ["chat", "generate"],
                 "options": ["options"], "message": ["message"]}


def _ollama_rows() -> list[tuple[str, str, str]]:
    """(field, route, status) of every row of Ollama's field table (a field may be in two parts)."""
    docs = (Path(__file__).parents[1] / "docs" / "API_NATIVE.md").read_text()
    rows = []
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] in ("honoured", "refused", "ignored") and cells[1] in OLLAMA_ROUTES:
            rows += [(name, cells[1], cells[2]) for name in re.findall(r"`([a-z0-9_]+)`", cells[0])]
    return rows


def test_the_ollama_table_is_exact():
    """Ollama's table: every field of each body, option and message once, with fields.py's status."""
    table: dict[tuple[str, str], str] = {}
    for field, route, status in _ollama_rows():
        for where in OLLAMA_ROUTES[route]:
            assert (where, field) not in table, (where, field)
            table[where, field] = status
    for where, model in OLLAMA_MODELS.items():
        assert {f for w, f in table if w == where} == set(model.model_fields), where
    f = ollama_fields
    expected = {
        "chat": (f.CHAT_HONOURED, f.CHAT_REFUSED, f.IGNORED),
        "generate": (f.GENERATE_HONOURED, f.GENERATE_REFUSED, f.IGNORED),
        "options": (f.OPTIONS_HONOURED, f.OPTIONS_REFUSED, f.OPTIONS_IGNORED),
        "message": (f.MESSAGE_HONOURED, f.MESSAGE_REFUSED, f.MESSAGE_IGNORED),
    }
    for where, (honoured, refused, ignored) in expected.items():
        got = {s: {fl for (w, fl), st in table.items() if w == where and st == s}
               for s in ("honoured", "refused", "ignored")}
        assert got == {"honoured": honoured, "refused": refused, "ignored": ignored}, where
    assert {r.field for r in f.CHAT_NOT_SUPPORTED} == f.CHAT_REFUSED
    assert {r.field for r in f.GENERATE_NOT_SUPPORTED} == f.GENERATE_REFUSED
    assert {r.field for r in f.OPTIONS_NOT_SUPPORTED} == f.OPTIONS_REFUSED


def test_every_ollama_client_field_is_declared():
    from ollama import _types

    pairs = ((_types.ChatRequest, OllamaChatRequest), (_types.GenerateRequest, OllamaGenerateRequest),
             (_types.Options, OllamaOptions), (_types.Message, OllamaMessage))
    for client, ours in pairs:
        assert set(client.model_fields) <= set(ours.model_fields), client.__name__


def test_the_embeddings_table_is_exact():
    """The embedding routes' table: every field of each body once, with embeddings/fields.py's status."""
    from mlxcel_py.server.embeddings.fields import FIELDS
    from mlxcel_py.server.embeddings.schemas import (EmbeddingRequest, NativeEmbeddingRequest,
                                                     OllamaEmbeddingsRequest, OllamaEmbedRequest)

    models = {"/v1/embeddings": EmbeddingRequest, "/embedding": NativeEmbeddingRequest,
              "/api/embed": OllamaEmbedRequest, "/api/embeddings": OllamaEmbeddingsRequest}
    docs = (Path(__file__).parents[1] / "docs" / "EMBEDDINGS.md").read_text()
    table: dict[str, dict[str, str]] = {route: {} for route in models}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] in ("honoured", "refused", "ignored") and cells[1] in models:
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                assert name not in table[cells[1]], (cells[1], name)
                table[cells[1]][name] = cells[2]
    assert table == FIELDS
    for route, model in models.items():
        assert set(table[route]) == set(model.model_fields), route
