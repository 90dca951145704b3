"""The OpenAI surface against a real server: the official client and raw SSE, usage, metrics, slots."""

import re

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import GREEDY, long_prompt, start_server, stop_server, stream_post

CHAT = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def oai(srv):
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def http(srv):
    with srv.client() as client:
        yield client


def test_chat_non_streaming(oai, srv):
    resp = oai.chat.completions.create(model="tiny-0", messages=CHAT, max_tokens=8, **GREEDY)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert resp.model == "tiny-0"
    assert re.fullmatch(r"fp_[0-9a-f]{12}", resp.system_fingerprint) and resp.system_fingerprint == srv.runtime.fingerprint
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0
    timings = resp.model_extra["timings"]
    assert timings["predicted_n"] == 8 and timings["predicted_per_second"] > 0
    assert timings["prompt_n"] + timings["cache_n"] == resp.usage.prompt_tokens


def test_chat_streaming_matches_non_streaming(oai):
    whole = oai.chat.completions.create(model="tiny-0", messages=CHAT, max_tokens=12, **GREEDY)
    chunks = list(oai.chat.completions.create(
        model="tiny-0", messages=CHAT, max_tokens=12, stream=True, stream_options={"include_usage": True}, **GREEDY
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.id.startswith("chatcmpl-") for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    # timings ride on the last chunk (here the usage chunk), as llama-server sends them
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].model_extra["timings"]["predicted_n"] == 12 and "timings" not in finish[0].model_extra
    assert {c.system_fingerprint for c in chunks} == {whole.system_fingerprint}


def test_raw_chat_stream_shape(http):
    frames = stream_post(http, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, **GREEDY})
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # no usage chunk without include_usage
    assert chunks[-1]["timings"]["predicted_n"] == 4  # so the finish chunk is the last one, with timings
    assert not any("usage" in c for c in chunks) and not any("prompt_progress" in c for c in chunks)


def test_completions_streaming_and_not(oai):
    whole = oai.completions.create(model="tiny-0", prompt="The quick brown fox", max_tokens=10, **GREEDY)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    chunks = list(oai.completions.create(
        model="tiny-0", prompt="The quick brown fox", max_tokens=10, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    ))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completion_prompt_forms_agree(http):
    def text(prompt):
        body = {"prompt": prompt, "max_tokens": 6, "cache_prompt": False, **GREEDY}
        resp = http.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["text"]

    ids = http.post("/tokenize", json={"content": "Paris is the capital"}).json()["tokens"]
    assert text("Paris is the capital") == text(["Paris is the capital"]) == text(ids) == text([ids])


def test_stop_string_and_length(http):
    body = {"prompt": "Hello world! What is", "max_tokens": 24, "ignore_eos": True, **GREEDY}
    full = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = next(full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].isalnum())
    resp = http.post("/v1/completions", json={**body, "stop": [stop]}).json()
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert resp["choices"][0]["text"] == full[: full.index(stop)]
    one = http.post("/v1/completions", json={**body, "stop": stop}).json()  # a bare string works too
    assert one["choices"][0]["text"] == resp["choices"][0]["text"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n_predict"])
def test_token_limit_spellings(http, field):
    body = {"messages": CHAT, field: 3, "ignore_eos": True, "repeat_penalty": 1.1, "seed": -1, "top_k": 5}
    resp = http.post("/v1/chat/completions", json=body).json()
    assert resp["usage"]["completion_tokens"] == 3 and resp["choices"][0]["finish_reason"] == "length"


def test_prompt_cache_reports_cached_tokens(http):
    body = {"prompt": long_prompt(200), "max_tokens": 2, **GREEDY}
    http.post("/v1/completions", json=body)
    again = http.post("/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["timings"]["cache_n"] == again["usage"]["prompt_tokens_details"]["cached_tokens"]
    off = http.post("/v1/completions", json={**body, "cache_prompt": False}).json()
    assert off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_models_health_and_slots(oai, http, srv):
    assert [m.id for m in oai.models.list().data] == ["tiny-0"]
    assert http.get("/health").json() == {"status": "ok"}
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert set(slots[0]) >= {"id", "state", "request_id", "prompt_tokens", "processed", "generated"}
    assert slots[0]["n_ctx"] == 4096


def test_tokenize_detokenize_round_trip(http):
    text = "Tokenizers split text into pieces."
    tokens = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == text


def test_metrics_exposition(http):
    http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    finished = {s.labels["finish_reason"]: s.value for s in families["mlxcel_requests"].samples}
    assert finished["length"] >= 1
    for name in ("mlxcel_prompt_tokens", "mlxcel_generated_tokens", "mlxcel_decode_steps",
                 "mlxcel_cached_prompt_tokens"):
        assert families[name].type == "counter"
    assert families["mlxcel_generated_tokens"].samples[0].value >= 3
    pieces = families["mlxcel_prefill_pieces"].samples
    assert pieces and all(int(s.labels["chunk"]) > 0 for s in pieces)
    assert families["mlxcel_queue_depth"].samples[0].value == 0
    assert families["mlxcel_busy_slots"].type == "gauge"
    for name in ("mlxcel_time_to_first_token_seconds", "mlxcel_inter_token_latency_seconds"):
        assert families[name].type == "histogram"
        count = next(s.value for s in families[name].samples if s.name == name + "_count")
        assert count >= 1


def test_openapi_schema_declares_the_bodies(http):
    schema = http.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    components = schema["components"]["schemas"]
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            refs.update([node["$ref"]] if "$ref" in node else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert refs and all(ref.removeprefix("#/components/schemas/") in components for ref in refs)
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatRequest"}
    assert {"400", "413", "415", "429", "503"} <= set(chat["responses"])
    body = components["ChatRequest"]
    assert body["required"] == ["messages"] and "frequency_penalty" in body["properties"]
    assert components["CompletionRequest"]["required"] == ["prompt"]
    assert set(components["ChatMessage"]["properties"]["role"]["enum"]) >= {"developer", "tool"}
