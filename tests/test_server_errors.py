"""Bad input gets OpenAI's error JSON with the right status, and never disturbs other streams."""

import threading

import openai
import pytest

from mlxcel_py.engine import build_engine
from mlxcel_py.engine.core.worker import EngineWorker
from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, stream_post, wait_for
from tiny import tiny_model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]

# (method, path, body: dict | bytes | None, status, param)
CASES = {
    "malformed json": ("POST", CHAT, b'{"messages": [', 400, None),
    "not utf-8": ("POST", CHAT, b"\xff\xfe{}", 400, None),
    "deeply nested": ("POST", CHAT, b"[" * 5000 + b"]" * 5000, 400, None),
    "body is a list": ("POST", CHAT, b"[1, 2]", 400, None),
    "empty body": ("POST", COMPLETIONS, b"", 400, None),
    "messages missing": ("POST", CHAT, {"max_tokens": 2}, 400, "messages"),
    "messages not a list": ("POST", CHAT, {"messages": "hi"}, 400, "messages"),
    "messages empty": ("POST", CHAT, {"messages": []}, 400, "messages"),
    "bad role": ("POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    "content not text": ("POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    "temperature wrong type": ("POST", CHAT, {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
    "temperature negative": ("POST", CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature"),
    "temperature nan": ("POST", CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
                        400, "temperature"),
    "temperature infinite": ("POST", CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}',
                             400, "temperature"),
    "lone surrogate": ("POST", CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400, None),
    "seed huge": ("POST", CHAT, {"messages": MSG, "seed": 10**30}, 400, "seed"),
    "stream_options not object": ("POST", CHAT, {"messages": MSG, "stream_options": 5}, 400, "stream_options"),
    "top_p zero": ("POST", CHAT, {"messages": MSG, "top_p": 0}, 400, "top_p"),
    "min_p above one": ("POST", CHAT, {"messages": MSG, "min_p": 2}, 400, "min_p"),
    "top_k huge": ("POST", CHAT, {"messages": MSG, "top_k": 10**9}, 400, "top_k"),
    "max_tokens zero": ("POST", CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens float": ("POST", CHAT, {"messages": MSG, "max_tokens": 2.5}, 400, "max_tokens"),
    "penalty zero": ("POST", CHAT, {"messages": MSG, "repeat_penalty": 0}, 400, "repetition_penalty"),
    "seed negative": ("POST", CHAT, {"messages": MSG, "seed": -5}, 400, "seed"),
    "n too many": ("POST", CHAT, {"messages": MSG, "n": 17}, 400, "n"),
    "logprobs not bool": ("POST", CHAT, {"messages": MSG, "logprobs": 5}, 400, "logprobs"),
    "stop wrong type": ("POST", CHAT, {"messages": MSG, "stop": 5}, 400, "stop"),
    "stop empty string": ("POST", CHAT, {"messages": MSG, "stop": [""]}, 400, "stop"),
    "stream not bool": ("POST", CHAT, {"messages": MSG, "stream": "yes"}, 400, "stream"),
    "prompt missing": ("POST", COMPLETIONS, {"max_tokens": 2}, 400, "prompt"),
    "prompt empty": ("POST", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    "prompt empty list": ("POST", COMPLETIONS, {"prompt": []}, 400, "prompt"),
    "prompt two strings": ("POST", COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt"),
    "prompt object": ("POST", COMPLETIONS, {"prompt": {"text": "a"}}, 400, "prompt"),
    "prompt bad token": ("POST", COMPLETIONS, {"prompt": [1, 99999]}, 400, "prompt"),
    "prompt negative token": ("POST", COMPLETIONS, {"prompt": [-1]}, 400, "prompt"),
    "prompt mixed list": ("POST", COMPLETIONS, {"prompt": [1, "a"]}, 400, "prompt"),
    "prompt too long": ("POST", COMPLETIONS, {"prompt": long_prompt(5000)}, 400, "prompt"),
    "detokenize bad id": ("POST", "/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    "detokenize not ints": ("POST", "/detokenize", {"tokens": ["a"]}, 400, "tokens"),
    "tokenize no content": ("POST", "/tokenize", {}, 400, "content"),
    "unknown route": ("GET", "/v1/nope", None, 404, None),
    "wrong method": ("GET", CHAT, None, 405, None),
}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2)
    yield running
    stop_server(running)


def _send(client, method, path, body):
    if isinstance(body, (bytes, type(None))):
        return client.request(method, path, content=body, headers={"content-type": "application/json"})
    return client.request(method, path, json=body)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_error_json(srv, name):
    method, path, body, status, param = CASES[name]
    with srv.client() as client:
        resp = _send(client, method, path, body)
    assert resp.status_code == status, resp.text
    error = error_of(resp)
    assert error["param"] == param
    if name == "prompt too long":
        assert error["code"] == "context_length_exceeded" and "5000" in error["message"]
        assert (error["n_prompt_tokens"], error["n_ctx"]) == (5000, 4096)
    if name == "temperature negative":
        assert error["message"] == "temperature must be between 0 and 100 (got -1.0)"


def test_bad_input_leaves_a_concurrent_stream_alone(srv):
    body = {"prompt": "The quick brown fox", "max_tokens": 200, "ignore_eos": True, "cache_prompt": False, **GREEDY}
    with srv.client() as client:
        reference = client.post(COMPLETIONS, json=body).json()["choices"][0]["text"]
        frames: list = []

        def run_stream():
            with srv.client() as own:
                frames.extend(stream_post(own, COMPLETIONS, body))

        stream = threading.Thread(target=run_stream)
        stream.start()
        for method, path, bad, status, _ in CASES.values():
            assert _send(client, method, path, bad).status_code == status
        stream.join(60)
    assert not stream.is_alive() and frames[-1] == "[DONE]"
    assert "".join(f["choices"][0]["text"] for f in frames[:-1]) == reference
    assert frames[-2]["choices"][0]["finish_reason"] == "length"


@pytest.fixture(scope="module")
def keyed():
    running = start_server(parallel=1, api_key="s3cret", model_alias="my-model")
    yield running
    stop_server(running)


def test_api_key_required_except_health(keyed):
    with keyed.client() as client:
        assert client.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            resp = client.get("/v1/models", headers=headers)
            assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_api_key"
        resp = client.post(CHAT, json={"messages": MSG}, headers={"Authorization": "Bearer nope"})
        assert resp.status_code == 401
        assert client.get("/slots", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/openapi.json").status_code == 401
        schema = client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()
        assert schema["security"] == [{"bearer": []}]
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0) as good:
        assert [m.id for m in good.models.list().data] == ["my-model"]
        reply = good.chat.completions.create(model="my-model", messages=MSG, max_tokens=2)
        assert reply.model == "my-model" and reply.usage.completion_tokens <= 2
    with openai.OpenAI(base_url=keyed.url + "/v1", api_key="bad", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_loading_ready_and_draining_states():
    running = start_server(loaded=False, parallel=1)
    try:
        with running.client() as client:
            resp = client.get("/health")
            assert resp.status_code == 503 and resp.json() == {"status": "loading"}
            for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("GET", "/metrics")):
                resp = client.request(method, path, json={"messages": MSG})
                assert resp.status_code == 503 and error_of(resp)["code"] == "model_loading"
                assert resp.headers["retry-after"]
            engine, calibrated = build_engine(running.config.engine, tiny_model()), threading.Event()
            engine.prepare = lambda: calibrated.wait(30)  # stands in for the ITL-budget calibration
            worker = EngineWorker(engine).start()
            running.runtime.attach(worker, tiny_model())
            resp = client.get("/health")  # loaded, still calibrating: not ready yet
            assert resp.status_code == 503 and resp.json() == {"status": "loading"}
            calibrated.set()
            wait_for(lambda: worker.prepared, 30, "the engine's prepare() to return")
            assert client.get("/health").json() == {"status": "ok"}
            assert client.post(CHAT, json={"messages": MSG, "max_tokens": 2}).status_code == 200
            worker.stop()  # the engine is gone: refused with 503, not a hang
            resp = client.post(CHAT, json={"messages": MSG, "max_tokens": 2})
            assert resp.status_code == 503 and error_of(resp)["code"] == "server_shutting_down"
            running.runtime.draining = True
            assert client.get("/health").status_code == 503
            assert error_of(client.get("/v1/models"))["code"] == "server_shutting_down"
    finally:
        stop_server(running)
