"""Several models behind one server (server/registry): routing by `model`, load on first use,
--models-max and keep-alive unloads, a corrupt file failing its own requests only."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from typing import Any

import httpx
import pytest

from gguf_fixtures import FIXTURES
from mlxcel_py.config import resolve
from mlxcel_py.server.app import create_app
from mlxcel_py.server.http.serving import bind_socket, make_server
from config_helpers import flags_for
from server_helpers import GREEDY, START_TIMEOUT_S, error_of, start_server, stop_server, wait_for

LLAMA, QWEN = str(FIXTURES / "llama-f16.gguf"), str(FIXTURES / "qwen2-f16.gguf")
PROMPT = {"prompt": "The quick brown fox", "max_tokens": 8, **GREEDY}


class Many:
    """A server with several models, uvicorn on a thread (the registry lives on its loop)."""

    def __init__(self, *models: str, **kwargs: Any):
        self.config = resolve("serve", flags_for("serve", port=0, model=models[0], extra_models=models[1:], **kwargs),
                              env={})
        self.app = create_app(None, None, self.config)
        self.registry = self.app.state.registry
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = make_server(self.app, self.config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, START_TIMEOUT_S, "uvicorn to start")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120.0)

    def state(self, name: str) -> str:
        return self.registry.hosted[name].state

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(START_TIMEOUT_S)
        for hosted in self.registry.hosted.values():
            worker = hosted.runtime.detach()
            if worker is not None:
                worker.stop()


@pytest.fixture
def many():
    servers: list[Many] = []

    def make(*models: str, **kwargs: Any) -> Many:
        servers.append(Many(*models, **kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def _alone(path: str) -> str:
    """The greedy completion of PROMPT by the model at `path` served alone."""
    from mlxcel_py.models import load_model

    running = start_server(model=load_model(path))
    try:
        with running.client() as client:
            return client.post("/v1/completions", json=PROMPT).json()["choices"][0]["text"]
    finally:
        stop_server(running)


def _complete(client: httpx.Client, model: str) -> httpx.Response:
    return client.post("/v1/completions", json={**PROMPT, "model": model})


def test_two_models_concurrently_each_answers_as_alone(many):
    alone = {"a": _alone(LLAMA), "q": _alone(QWEN)}
    server = many(f"a={LLAMA}", f"q={QWEN}")
    with server.client() as client:
        listed = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["status"]["value"]) for m in listed] == [("a", "unloaded"), ("q", "unloaded")]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda name: (name, _complete(client, name)), ["a", "q", "a", "q"]))
        for name, response in answers:
            assert response.status_code == 200, response.text
            assert response.json()["model"] == name
            assert response.json()["choices"][0]["text"] == alone[name]
        assert alone["a"] != alone["q"]  # two different models, so the routing is what made them equal
        listed = client.get("/v1/models").json()["data"]
        assert [m["status"]["value"] for m in listed] == ["loaded", "loaded"]
        assert all(m["status"]["memory_bytes"] > 0 for m in listed)
        # each engine is its own: the Ollama and Anthropic routes reach the same two models
        chat = client.post("/api/chat", json={"model": "q", "messages": [{"role": "user", "content": "hi"}],
                                              "stream": False, "options": {"temperature": 0, "num_predict": 3}})
        assert chat.status_code == 200 and chat.json()["model"] == "q"
        tags = client.get("/api/tags").json()["models"]
        assert [(t["name"], t["state"]["value"]) for t in tags] == [("a", "loaded"), ("q", "loaded")]
        slots = client.get("/slots").json()
        assert {s["model"] for s in slots} == {"a", "q"}
        metrics = client.get("/metrics").text
        assert 'mlxcel_generated_tokens_total{model="a"}' in metrics
        assert 'mlxcel_generated_tokens_total{model="q"}' in metrics


def test_unknown_model_is_a_404_listing_the_models(many):
    server = many(f"a={LLAMA}", f"q={QWEN}")
    with server.client() as client:
        response = _complete(client, "nope")
        assert response.status_code == 404
        error = error_of(response)
        assert (error["code"], error["param"]) == ("model_not_found", "model")
        assert error["message"] == "model 'nope' not found; the models are: a, q"
        ollama = client.post("/api/generate", json={"model": "nope", "prompt": "x"})
        assert ollama.status_code == 404 and ollama.json() == {"error": error["message"]}
    assert (server.state("a"), server.state("q")) == ("unloaded", "unloaded")  # nothing was loaded for it


def test_keep_alive_unloads_an_idle_model(many):
    server = many(f"a={LLAMA}", f"q={QWEN}", keep_alive="0.2s")
    with server.client() as client:
        assert _complete(client, "a").status_code == 200
        wait_for(lambda: server.state("a") == "unloaded", 10.0, "the keep-alive unload")
        assert _complete(client, "a").status_code == 200  # and it comes back on its next request
        # an Ollama request's keep_alive overrides --keep-alive: -1 keeps it resident
        body = {"model": "q", "prompt": "hi", "stream": False, "keep_alive": -1, "options": {"num_predict": 2}}
        assert client.post("/api/generate", json=body).status_code == 200
        wait_for(lambda: server.state("a") == "unloaded", 10.0, "the keep-alive unload")
        assert server.state("q") == "loaded" and client.get("/api/ps").json()["models"][0]["name"] == "q"
        # keep_alive 0 with no prompt: Ollama's way to unload now
        unload = client.post("/api/generate", json={"model": "q", "keep_alive": 0})
        assert (unload.status_code, unload.json()["done_reason"]) == (200, "unload")
        wait_for(lambda: server.state("q") == "unloaded", 10.0, "the keep_alive 0 unload")


def test_corrupt_file_fails_its_own_requests_only(many, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes((FIXTURES / "qwen2-f16.gguf").read_bytes()[:50_000])
    server = many(f"a={LLAMA}", str(broken))
    with server.client() as client:
        for _ in range(2):  # the next request retries the load, and fails the same way
            response = _complete(client, "broken")
            assert response.status_code == 500
            error = error_of(response)
            assert error["code"] == "model_load_failed"
            assert error["message"].startswith("model 'broken' failed to load: truncated GGUF file: broken.gguf")
        assert _complete(client, "a").status_code == 200
        listed = {m["id"]: m["status"] for m in client.get("/v1/models").json()["data"]}
        assert listed["a"]["value"] == "loaded"
        assert listed["broken"]["value"] == "unloaded" and "truncated GGUF" in listed["broken"]["last_error"]
        assert client.get("/health").json() == {"status": "ok"}


def test_load_and_unload_routes(many):
    server = many(f"a={LLAMA}", f"q={QWEN}")
    with server.client() as client:
        assert client.post("/models/load", json={"model": "q"}).json() == {"success": True, "model": "q"}
        assert server.state("q") == "loaded" and server.state("a") == "unloaded"
        answer = client.post("/models/unload", json={"model": "q"}).json()
        assert answer == {"success": True, "model": "q", "unloaded": True}
        assert server.state("q") == "unloaded"
        assert client.post("/models/unload", json={"model": "zz"}).status_code == 404
        missing = client.post("/models/load", json={})
        assert missing.status_code == 400 and error_of(missing)["message"] == "missing required field 'model'"


def test_one_model_load_and_unload_routes():
    running = start_server()
    try:
        with running.client() as client:
            assert client.post("/models/load", json={"model": "any"}).json() == {"success": True, "model": "any"}
            refused = client.post("/models/unload", json={"model": "any"})
            assert refused.status_code == 400 and error_of(refused)["message"].startswith("this server serves one model")
    finally:
        stop_server(running)


def test_models_max_1_swaps_when_idle_and_resident_memory_drops(many):
    from mlxcel_py.models import default_model_path
    from mlxcel_py.models.footprint import resident_bytes

    server = many(f"big={default_model_path()}", f"q={QWEN}", models_max=1)
    with server.client() as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert _complete(client, "big").status_code == 200
        with_big = resident_bytes()
        long = {"model": "big", "prompt": "Count:", "stream": True, "ignore_eos": True, **GREEDY}  # for minutes
        with client.stream("POST", "/v1/completions", json=long) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the stream
            next(line for line in lines if line.startswith("data: "))
            other = pool.submit(_complete, server.client(), "q")
            wait_for(lambda: server.state("q") == "loading", 30.0, "q's load to start")
            # big has a request in flight: q's load waits for it rather than unload big under it
            big = server.registry.hosted["big"]
            assert server.state("big") == "loaded" and not big.idle
            assert not other.done()
        # the stream is closed: big's request is aborted, big goes idle, and q takes its place
        assert other.result(120.0).status_code == 200
        assert (server.state("big"), server.state("q")) == ("unloaded", "loaded")
        without_big = resident_bytes()
        # SmolLM2-135M's float32 weights and engine are some hundreds of MiB; the tiny q is under one
        assert without_big < with_big - 64 * 2**20, (with_big >> 20, without_big >> 20)
        assert _complete(client, "big").status_code == 200  # and big comes back, unloading q
        assert (server.state("big"), server.state("q")) == ("loaded", "unloaded")


def test_memory_budget_unloads_the_least_recently_used(many):
    server = many(f"a={LLAMA}", f"q={QWEN}", models_memory=1.0)  # 1 GiB
    sizes = {LLAMA: 700 << 20, QWEN: 400 << 20}  # as if the files said so: 700 + 400 MiB > 1 GiB
    server.registry.estimate = lambda spec: sizes[spec]
    with server.client() as client:
        assert _complete(client, "a").status_code == 200
        assert _complete(client, "q").status_code == 200
        assert (server.state("a"), server.state("q")) == ("unloaded", "loaded")
        listed = {m["id"]: m["status"] for m in client.get("/v1/models").json()["data"]}
        assert listed["q"]["estimated_bytes"] == 400 << 20 and listed["q"]["memory_bytes"] >= 400 << 20


def test_a_model_over_the_budget_is_refused_before_loading(many):
    server = many(f"a={LLAMA}", f"q={QWEN}", models_memory=0.5)
    server.registry.estimate = lambda spec: 600 << 20 if spec == LLAMA else 1 << 20
    with server.client() as client:
        response = _complete(client, "a")
        assert response.status_code == 503
        assert error_of(response)["message"] == ("model 'a' needs about 0.59 GiB, more than --models-memory "
                                                 "0.5 GiB")
        assert server.state("a") == "unloaded" and _complete(client, "q").status_code == 200


def _held_load(server: Many) -> threading.Event:
    """Make the registry's loads wait until the returned event is set (a slow load, on demand)."""
    go, build = threading.Event(), server.registry.build

    def held(hosted):
        assert go.wait(30.0), "the test never let the load go"
        return build(hosted)

    server.registry.build = held
    return go


def test_a_stream_gets_keep_alive_frames_while_its_model_loads(many, monkeypatch):
    from mlxcel_py.server.registry import loading
    from server_helpers import sse_payloads

    monkeypatch.setattr(loading, "KEEP_ALIVE_S", 0.05)
    server = many(f"a={LLAMA}", f"q={QWEN}")
    with server.client() as client:
        assert client.post("/models/load", json={"model": "q"}).status_code == 200
        whole = _complete(client, "a").json()["choices"][0]["text"]
        assert client.post("/models/unload", json={"model": "a"}).json()["unloaded"] is True
        go = _held_load(server)
        with client.stream("POST", "/v1/completions", json={**PROMPT, "model": "a", "stream": True}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert [next(lines), next(lines), next(lines), next(lines)] == [": loading model a", ""] * 2
            # a's load is under way; q is resident, and its requests do not wait for a's
            with server.client() as other:
                assert _complete(other, "q").status_code == 200
            go.set()
            rest = list(lines)
        payloads = sse_payloads(rest)
        assert payloads[-1] == "[DONE]"
        assert "".join(p["choices"][0]["text"] for p in payloads[:-1]) == whole
        ollama = {"model": "a", "prompt": "hi", "options": {"temperature": 0, "num_predict": 2}}
        assert client.post("/models/unload", json={"model": "a"}).json()["unloaded"] is True
        go = _held_load(server)
        with client.stream("POST", "/api/generate", json=ollama) as response:
            lines = response.iter_lines()
            first = json.loads(next(lines))
            assert (first["model"], first["response"], first["done"]) == ("a", "", False)
            go.set()
            chunks = [json.loads(line) for line in lines if line]
        assert chunks[-1]["done"] is True and chunks[-1]["model"] == "a"


def test_a_stream_whose_model_fails_to_load_gets_the_error_in_band(many, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes((FIXTURES / "qwen2-f16.gguf").read_bytes()[:50_000])
    server = many(f"a={LLAMA}", str(broken))
    with server.client() as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "model": "broken", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as response:
            assert response.status_code == 200
            frames = [line for line in response.iter_lines() if line.startswith("data: ")]
        error = json.loads(frames[-1].removeprefix("data: "))["error"]
        assert error["code"] == "model_load_failed" and "truncated GGUF file" in error["message"]


def test_serve_command_lists_the_models_and_preloads():
    from pathlib import Path

    from server_helpers import spawn_server

    child = spawn_server(Path(LLAMA), "-m", f"q={QWEN}", "--models-preload", "q", "--log-level", "info")
    try:
        log = child.log()
        assert f"model llama-f16: {LLAMA}" in log and f"model q: {QWEN}" in log
        assert "models_max 4 models_memory no budget keep_alive never preload q" in log
        assert "ready: serving 2 models (llama-f16, q)" in log
        wait_for(lambda: "model q: loaded in" in child.log(), 60.0, "the preload")
        listed = httpx.get(child.url + "/v1/models", timeout=30).json()["data"]
        assert [(m["id"], m["status"]["value"]) for m in listed] == [("llama-f16", "unloaded"), ("q", "loaded")]
        answer = httpx.post(child.url + "/v1/completions", json={**PROMPT, "model": "llama-f16"}, timeout=120)
        assert answer.status_code == 200 and answer.json()["model"] == "llama-f16"
        child.proc.terminate()  # SIGTERM: both engines stop, the process exits 0
        assert child.proc.wait(60) == 0
    finally:
        child.kill()


def test_ollama_embed_keep_alive_with_several_models(many):
    server = many(f"a={LLAMA}", f"q={QWEN}")
    with server.client() as client:
        body = {"model": "q", "input": "hello", "keep_alive": 0}
        assert client.post("/api/embed", json=body).status_code == 200
        wait_for(lambda: server.state("q") == "unloaded", 10.0, "the keep_alive 0 unload")
        bad = client.post("/api/embed", json={**body, "keep_alive": "soon"})
        assert bad.status_code == 400 and bad.json()["error"].startswith("keep_alive must be seconds or a duration")
