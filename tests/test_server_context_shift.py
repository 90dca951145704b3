"""--context-shift over HTTP: llama-server's n_keep / n_discard on /completion and the OpenAI
routes, a reply that runs past its slot (truncated, counted in timings, /slots and /metrics),
and the 400s: a bad n_keep, and n_keep on a server without --context-shift."""

import pytest

from mlxcel_py.config import resolve
from mlxcel_py.errors import ConfigError
from config_helpers import flags_for
from server_helpers import GREEDY, error_of, start_server, stop_server, wait_for

PROMPT = [5 + (i * 7) % 290 for i in range(40)]  # token ids: no BOS, so n_keep counts from the first


@pytest.fixture(scope="module")
def shifting():
    running = start_server(parallel=1, ctx_size=64, context_shift=True)
    with running.client() as client:
        yield client
    stop_server(running)


@pytest.fixture(scope="module")
def plain():
    running = start_server(parallel=1, ctx_size=64)
    with running.client() as client:
        yield client
    stop_server(running)


def completion(client, **fields):
    body = {"prompt": PROMPT, "n_predict": 100, "ignore_eos": True, **GREEDY, **fields}
    return client.post("/completion", json=body)


def test_a_reply_past_the_slot_keeps_generating(shifting):
    resp = completion(shifting, n_keep=4)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["tokens_predicted"], body["stop_type"], body["truncated"]) == (100, "limit", True)
    timings = body["timings"]
    # 40 + 100 tokens through a 64-token slot: shifts at KV 63, keeping 4 and discarding half the rest.
    assert timings["context_shifts"] == 3 and timings["discarded_n"] == 29 + 29 + 29
    assert body["tokens_cached"] == 40 + 100 - 1 - 87
    assert (body["generation_settings"]["n_keep"], body["generation_settings"]["n_discard"]) == (4, 0)


def test_n_discard_and_the_whole_prompt_kept(shifting):
    body = completion(shifting, n_keep=-1, n_discard=8).json()
    assert body["tokens_predicted"] == 100 and body["timings"]["discarded_n"] == 8 * body["timings"]["context_shifts"]


def test_the_openai_routes_take_n_keep(shifting):
    resp = shifting.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 90, "ignore_eos": True,
                                                   "n_keep": 2, **GREEDY})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 90 and body["choices"][0]["finish_reason"] == "length"
    assert body["timings"]["context_shifts"] >= 1


def test_slots_and_metrics_count_the_shifts(shifting):
    completion(shifting, n_predict=80)
    # the reply is sent on its last token; the slot is retired on the engine's next tick
    wait_for(lambda: not shifting.get("/slots").json()[0]["is_processing"], what="the slot to be idle")
    assert shifting.get("/slots").json()[0]["context_shifts"] == 0  # idle again
    metrics = shifting.get("/metrics").text
    shifts = next(line for line in metrics.splitlines() if line.startswith("mlxcel_context_shifts_total "))
    assert float(shifts.split()[1]) >= 2


@pytest.mark.parametrize("field, value", [("n_keep", -2), ("n_discard", -1)])
def test_a_bad_value_is_a_400(shifting, field, value):
    resp = completion(shifting, **{field: value})
    assert resp.status_code == 400 and error_of(resp)["param"] == field


def test_without_context_shift_the_slot_ends_the_reply(plain):
    body = completion(plain).json()
    assert (body["tokens_predicted"], body["stop_type"], body["truncated"]) == (64 - 40, "limit", True)
    assert "context_shifts" not in body["timings"]
    assert completion(plain, n_keep=0).status_code == 200


@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_without_context_shift_n_keep_is_refused(plain, path):
    body = {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "n_keep": 4, "max_tokens": 2}
    if path == "/v1/chat/completions":
        del body["prompt"]
    else:
        del body["messages"]
    resp = plain.post(path, json=body)
    assert resp.status_code == 400
    error = error_of(resp)
    assert error["param"] == "n_keep" and "--context-shift" in error["message"]


def test_the_flag_and_its_environment_variable():
    assert resolve("serve", env={}).engine.context_shift is False
    assert resolve("serve", env={"LLAMA_ARG_CONTEXT_SHIFT": "1"}).engine.context_shift is True
    assert resolve("serve", flags_for("serve", context_shift=False),
                   env={"LLAMA_ARG_CONTEXT_SHIFT": "1"}).engine.context_shift is False
    with pytest.raises(ConfigError, match="LLAMA_ARG_CONTEXT_SHIFT"):
        resolve("serve", env={"LLAMA_ARG_CONTEXT_SHIFT": "maybe"})


def _runtime(shift: bool, bos=1):
    from types import SimpleNamespace

    engine = SimpleNamespace(context_shift=shift)
    return SimpleNamespace(config=SimpleNamespace(engine=engine),
                           loaded=SimpleNamespace(tokenizer=SimpleNamespace(bos_token_id=bos)))


@pytest.mark.parametrize("n_keep, ids, want", [
    (None, (1, 7, 8), 1),  # llama-server's n_keep does not count BOS, and keeps it
    (4, (1, 7, 8), 5),
    (4, (7, 8), 4),  # no BOS at the start (token ids sent as the prompt)
    (-1, (1, 7, 8), -1),
])
def test_n_keep_counts_as_llama_server(n_keep, ids, want):
    from types import SimpleNamespace

    from mlxcel_py.server.generation.keep import keep_fields

    got = keep_fields(SimpleNamespace(n_keep=n_keep, n_discard=None), _runtime(True), ids)
    assert got == {"n_keep": want, "n_discard": 0}
    assert keep_fields(SimpleNamespace(), _runtime(False), ids) == {}  # routes without the fields


def ollama(client, **fields):
    body = {"model": "m", "prompt": "Hello there", "raw": True, "stream": False,
            "options": {"num_predict": 100, "temperature": 0}, **fields}
    return client.post("/api/generate", json=body)


def test_ollama_shift(shifting, plain):
    long = ollama(shifting)
    assert long.status_code == 200, long.text
    assert long.json()["eval_count"] == 100  # shifted past the 64-token slot (EOS aside: tiny model)
    stopped = ollama(shifting, shift=False).json()
    assert stopped["done_reason"] == "length" and stopped["eval_count"] < 64
    refused = ollama(plain, shift=True)
    assert refused.status_code == 400 and "--context-shift" in refused.text
    assert ollama(plain, shift=False).status_code == 200


def test_a_conversation_past_the_slot_keeps_generating(shifting):
    messages = [{"role": "user", "content": "Tell me a long story about a fox."}]
    body = {"messages": messages, "max_tokens": 120, "ignore_eos": True, **GREEDY}
    resp = shifting.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    reply = resp.json()
    assert reply["usage"]["completion_tokens"] == 120 and reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] + 120 > 64 and reply["timings"]["context_shifts"] >= 2
    assert reply["choices"][0]["message"]["content"]
