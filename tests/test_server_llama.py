"""llama-server's native routes against a real server on the tiny model: /completion (and
/completions), /props, /apply-template, the overflow error's fields, any model name."""

import pytest

from mlxcel_py.server.llama.fields import HONOURED, IGNORED, NOT_SUPPORTED
from mlxcel_py.server.llama.schemas import NativeCompletionRequest
from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, stream_post

PROMPT = "The quick brown fox"
# llama-server 0c1e570's keys, read from the running binary on the default model.
SETTINGS_KEYS = {
    "adaptive_decay", "adaptive_target", "backend_sampling", "chat_format", "dry_allowed_length", "dry_base",
    "dry_multiplier", "dry_penalty_last_n", "dry_sequence_breakers", "dynatemp_exponent", "dynatemp_range",
    "frequency_penalty", "generation_prompt", "grammar", "grammar_lazy", "grammar_triggers", "ignore_eos",
    "logit_bias", "lora", "max_tokens", "min_keep", "min_p", "mirostat", "mirostat_eta", "mirostat_tau",
    "n_discard", "n_keep", "n_predict", "n_probs", "post_sampling_probs", "presence_penalty", "preserved_tokens",
    "reasoning_format", "reasoning_in_content", "repeat_last_n", "repeat_penalty", "samplers", "seed",
    "speculative.types", "stop", "stream", "temperature", "timings_per_token", "top_k", "top_n_sigma", "top_p",
    "typical_p", "xtc_probability", "xtc_threshold",
}
PROPS_PARAMS_KEYS = SETTINGS_KEYS - {"dry_sequence_breakers", "grammar", "grammar_lazy", "grammar_triggers",
                                     "logit_bias", "preserved_tokens", "stop"}
PROPS_KEYS = {  # less chat_template_caps, model_ftype, ui_settings
    "bos_token", "build_info", "chat_template", "cors_proxy_enabled", "default_generation_settings",
    "endpoint_metrics", "endpoint_props", "endpoint_slots", "eos_token", "is_sleeping", "media_marker", "modalities",
    "model_alias", "model_path", "total_slots", "ui",
}
FINAL_KEYS = {
    "index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
    "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word", "tokens_cached",
    "timings",
}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2, model_alias="local-model,second-name", tags="chat, test,,chat")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def http(srv):
    with srv.client() as client:
        yield client


def complete(http, path="/completion", **body):
    resp = http.post(path, json={"prompt": PROMPT, "n_predict": 8, "cache_prompt": False, **GREEDY, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_completion_shape(http):
    body = complete(http, return_tokens=True, ignore_eos=True)
    assert set(body) == FINAL_KEYS
    assert body["stop"] is True and body["stop_type"] == "limit" and body["stopping_word"] == ""
    assert body["model"] == "local-model" and body["prompt"] == PROMPT and body["index"] == 0
    assert body["tokens_predicted"] == len(body["tokens"]) == 8
    ids = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    assert body["tokens_evaluated"] == len(ids) == body["timings"]["prompt_n"]
    assert body["tokens_cached"] == len(ids) + 8 - 1  # the last token was sampled, never run
    assert http.post("/detokenize", json={"tokens": body["tokens"]}).json()["content"] == body["content"]
    assert body["id_slot"] in (0, 1) and body["truncated"] is False
    assert body["has_new_line"] == ("\n" in body["content"])
    settings = body["generation_settings"]
    assert set(settings) == SETTINGS_KEYS
    assert (settings["n_predict"], settings["temperature"], settings["stream"]) == (8, 0.0, False)
    assert settings["seed"] == 4294967295  # llama-server's "random seed"
    assert complete(http)["tokens"] == []  # without return_tokens


def test_completions_without_v1_is_the_native_route(http):
    assert complete(http, "/completions")["content"] == complete(http)["content"]


def test_stream_frames_add_up_to_the_reply(http):
    whole = complete(http, return_tokens=True, ignore_eos=True)
    frames = stream_post(http, "/completion", {"prompt": PROMPT, "n_predict": 8, "cache_prompt": False,
                                               "ignore_eos": True, **GREEDY})
    assert "[DONE]" not in frames  # llama-server's native stream ends with the stop frame
    partial, final = frames[:-1], frames[-1]
    assert all(set(f) == {"index", "content", "tokens", "stop", "id_slot", "tokens_predicted", "tokens_evaluated"}
               and f["stop"] is False for f in partial)
    assert "".join(f["content"] for f in partial) == whole["content"]
    assert [t for f in partial for t in f["tokens"]] == whole["tokens"]
    assert [f["tokens_predicted"] for f in partial][-1] == 8
    assert set(final) == FINAL_KEYS and final["stop"] is True and final["content"] == ""
    assert final["generation_settings"]["stream"] is True and final["timings"]["predicted_n"] == 8


def test_progress_frames(http):
    frames = stream_post(http, "/completion", {"prompt": long_prompt(40), "n_predict": 2, "return_progress": True,
                                               "cache_prompt": False})
    progress = [f["prompt_progress"] for f in frames if "prompt_progress" in f]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] == 40
    assert all(f["content"] == "" and f["tokens"] == [] for f in frames if "prompt_progress" in f)


def test_prompt_forms_agree(http):
    ids = http.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    head, tail = PROMPT.split(" ", 1)
    tail_ids = http.post("/tokenize", json={"content": " " + tail}).json()["tokens"]
    mixed = http.post("/tokenize", json={"content": head}).json()["tokens"] + [" " + tail]
    forms = (PROMPT, [PROMPT], ids, [ids], mixed, {"prompt_string": PROMPT}, [{"prompt_string": PROMPT}])
    texts = {complete(http, prompt=p)["content"] for p in forms}
    assert len(texts) == 1
    assert complete(http, prompt=ids)["prompt"] == PROMPT and tail_ids


def test_stop_word(http):
    full = complete(http, n_predict=24, ignore_eos=True)["content"]
    stop = next(full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].isalnum())
    body = complete(http, n_predict=24, ignore_eos=True, stop=[stop])
    assert (body["stop_type"], body["stopping_word"], body["content"]) == ("word", stop, full[: full.index(stop)])


def test_response_fields(http):
    body = complete(http, response_fields=["content", "generation_settings/n_predict", "timings/predicted_n", "nope"])
    assert set(body) == {"content", "generation_settings/n_predict", "timings/predicted_n"}
    assert body["generation_settings/n_predict"] == body["timings/predicted_n"] == 8


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": [["one", "two"], "three"]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": {"prompt_string": "x <__media__>", "multimodal_data": ["AAAA"]}}, "prompt"),
    ({"prompt": "x", "n": 2, "n_cmpl": 3}, "n_cmpl"),
    ({"prompt": "x", "n_cmpl": 17}, "n_cmpl"),
    ({"prompt": ["x"] * 9, "n": 2}, "prompt"),
    ({"prompt": "x", "n_predict": 0}, "n_predict"),
    ({"prompt": "x", "n_probs": 21}, "n_probs"),
    ({"prompt": "x", "samplers": ["top_k", "tempurature"]}, "samplers"),
    ({"prompt": "x", "logit_bias": [[999_999, -1.0]]}, "logit_bias"),
    ({"prompt": "x", "grammar": "root ::= foo"}, "grammar"),
    ({"prompt": "x", "presence_penalty": 3.0}, "presence_penalty"),
    ({"prompt": "x", "mirostat": 3}, "mirostat"),
    ({"prompt": "x", "typical_p": 1.5}, "typical_p"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
])
def test_bad_completion_requests(http, body, param):
    resp = http.post("/completion", json=body)
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["param"] == param


def test_every_field_is_honoured_refused_or_ignored():
    refused = {row.field for row in NOT_SUPPORTED}
    assert set(NativeCompletionRequest.model_fields) == HONOURED | refused | IGNORED
    assert not (HONOURED & refused or HONOURED & IGNORED or refused & IGNORED)


def test_inert_values_and_ignored_fields_change_nothing(http):
    inert = {"n": 1, "n_cmpl": 1, "presence_penalty": 0, "logit_bias": [], "grammar": "", "n_probs": 0,
             "typical_p": 1, "top_n_sigma": -1, "samplers": ["penalties", "top_p", "min_p", "top_k", "temperature"],
             "id_slot": 1, "n_keep": 0, "n_cache_reuse": 256, "dry_base": 2.0, "post_sampling_probs": True,
             "timings_per_token": False, "lora": [], "t_max_predict_ms": 0, "sse_ping_interval": 5}
    assert complete(http, **inert)["content"] == complete(http)["content"]


def test_overflow_error_fields(http):
    resp = http.post("/completion", json={"prompt": long_prompt(5000), "n_predict": 2})
    assert resp.status_code == 400
    error = error_of(resp)
    assert (error["code"], error["n_prompt_tokens"], error["n_ctx"]) == ("context_length_exceeded", 5000, 4096)


def test_props(http, srv):
    props = http.get("/props").json()
    assert set(props) == PROPS_KEYS and set(props["default_generation_settings"]["params"]) == PROPS_PARAMS_KEYS
    assert props["total_slots"] == 2 and props["model_alias"] == "local-model"
    assert props["default_generation_settings"]["n_ctx"] == 4096
    params = props["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["n_predict"]) == (0.8, 40, -1)
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert props["chat_template"].startswith("{% for message in messages %}")
    assert (props["bos_token"], props["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert props["build_info"].startswith("mlxcel-py ") and props["model_path"]


def test_apply_template_is_what_chat_feeds_the_model(http):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello there"}]
    prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n" \
                     "<|im_start|>assistant\n"
    chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "cache_prompt": False,
                                                   "ignore_eos": True, **GREEDY}).json()
    native = complete(http, prompt=prompt, n_predict=6, ignore_eos=True)
    assert native["content"] == chat["choices"][0]["message"]["content"]
    assert native["tokens_evaluated"] == chat["usage"]["prompt_tokens"]
    assert error_of(http.post("/apply-template", json={}))["param"] == "messages"


def test_any_model_name_is_served_and_reported_as_the_first_alias(http):
    chat = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 2})
    legacy = http.post("/v1/completions", json={"model": "text-davinci-003", "prompt": "hi", "max_tokens": 2})
    native = http.post("/completion", json={"model": "whatever", "prompt": "hi", "n_predict": 2})
    assert [r.status_code for r in (chat, legacy, native)] == [200, 200, 200]
    assert chat.json()["model"] == legacy.json()["model"] == native.json()["model"] == "local-model"
    models = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["local-model"] and models[0]["aliases"] == ["local-model", "second-name"]
    assert models[0]["tags"] == ["chat", "test"]  # --tags, as llama-server's get_res_model_info


def test_models_have_no_tags_without_the_flag():
    running = start_server(parallel=1)
    try:
        with running.client() as client:
            assert client.get("/v1/models").json()["data"][0]["tags"] == []
    finally:
        stop_server(running)


def test_completion_honours_grammar_logit_bias_and_penalties(http):
    """/completion goes through the OpenAI routes' machinery for these fields: same answers."""
    base = {"prompt": "The quick brown fox", "n_predict": 6, "temperature": 0, "cache_prompt": False}
    grammar = http.post("/completion", json={**base, "grammar": 'root ::= " yes" | " no"'}).json()
    assert grammar["content"] in (" yes", " no")
    for extra in ({"logit_bias": [[15, -100]]}, {"presence_penalty": 1.5, "frequency_penalty": 1.0}):
        native = http.post("/completion", json={**base, **extra}).json()["content"]
        oai_extra = {"logit_bias": {"15": -100}} if "logit_bias" in extra else extra
        oai = http.post("/v1/completions", json={"prompt": base["prompt"], "max_tokens": 6, "temperature": 0,
                                                  "cache_prompt": False, **oai_extra}).json()
        assert native == oai["choices"][0]["text"]
