"""OpenAI's n > 1: one engine request per choice, answered as one response whose choices carry
their index; usage counts the prompt once and every choice's tokens; streamed, each choice's
chunks carry its index and usage and [DONE] come once at the end."""

import json
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, stream_post, wait_for

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=2)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def http(srv):
    with srv.client() as client:
        yield client


def post(http, path, **body):
    base = {"messages": MSG} if path == CHAT else {"prompt": long_prompt(40)}
    resp = http.post(path, json={**base, "max_tokens": 6, "ignore_eos": True, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _text(choice):
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_greedy_choices_equal_the_single_reply(http, path):
    one = post(http, path, **GREEDY)
    three = post(http, path, n=3, **GREEDY)
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert {_text(c) for c in three["choices"]} == {_text(one["choices"][0])}
    assert all(c["finish_reason"] == "length" for c in three["choices"])
    u1, u3 = one["usage"], three["usage"]
    assert (u3["prompt_tokens"], u3["completion_tokens"]) == (u1["prompt_tokens"], 3 * u1["completion_tokens"])
    assert u3["total_tokens"] == u3["prompt_tokens"] + u3["completion_tokens"]


def test_seeded_choices_differ_and_the_first_is_the_single_reply(http):
    sampled = {"temperature": 1.0, "seed": 7}
    one = post(http, CHAT, **sampled)
    four = post(http, CHAT, n=4, **sampled)
    texts = [_text(c) for c in four["choices"]]
    assert texts[0] == _text(one["choices"][0]) and len(set(texts)) > 1
    assert [_text(c) for c in post(http, CHAT, n=4, **sampled)["choices"]] == texts  # reproducible


def test_each_choice_has_its_logprobs(http):
    body = post(http, COMPLETIONS, n=2, logprobs=2, **GREEDY)
    lps = [c["logprobs"] for c in body["choices"]]
    assert lps[0] == lps[1] and len(lps[0]["tokens"]) == 6


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_streamed_choices_carry_their_index(http, path):
    whole = post(http, path, n=2, **GREEDY)
    base = {"messages": MSG} if path == CHAT else {"prompt": long_prompt(40)}
    frames = stream_post(http, path, {**base, "max_tokens": 6, "ignore_eos": True, "n": 2,
                                      "stream_options": {"include_usage": True}, **GREEDY})
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    usage = [f for f in chunks if f.get("usage")]
    assert len(usage) == 1 and usage[0] is chunks[-1] and usage[0]["choices"] == []
    # the same counts; cached_tokens may differ (the streamed request can hit the prompt the first one cached)
    streamed_usage, whole_usage = dict(usage[0]["usage"]), dict(whole["usage"])
    cached = streamed_usage.pop("prompt_tokens_details")["cached_tokens"]
    whole_usage.pop("prompt_tokens_details")
    assert streamed_usage == whole_usage and 0 <= cached < streamed_usage["prompt_tokens"]
    for i, choice in enumerate(whole["choices"]):
        mine = [f["choices"][0] for f in chunks if f["choices"] and f["choices"][0]["index"] == i]
        key = "delta" if path == CHAT else None
        text = "".join((c[key].get("content") or "") if key else c["text"] for c in mine)
        assert text == _text(choice)
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
        if path == CHAT:
            assert mine[0]["delta"]["role"] == "assistant"


def test_n_out_of_range_is_a_400(http):
    for n in (0, 17):
        resp = http.post(CHAT, json={"messages": MSG, "n": n})
        assert resp.status_code == 400 and error_of(resp)["param"] == "n"
        assert error_of(resp)["message"] == f"n must be between 1 and 16 (got {n})"


def _aborts(http) -> float:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "mlxcel_requests_total" and sample.labels.get("finish_reason") == "abort":
                return sample.value
    return 0.0


def test_a_client_that_leaves_aborts_every_choice(srv, http):
    before = _aborts(http)
    body = {"messages": MSG, "n": 2, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with http.stream("POST", CHAT, json=body) as resp:
        seen = set()
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"content": "' in line:
                seen.add(line.split('"index": ', 1)[1][0])
            if seen == {"0", "1"}:
                break  # leaving the block drops the connection
    wait_for(lambda: _aborts(http) >= before + 2, 10, "both choices to be aborted")
    wait_for(lambda: srv.worker.stats().num_busy_slots == 0, 30, "the slots to be freed")


def test_a_shutdown_cuts_every_choice_and_every_prompt():
    running = start_server(parallel=4, grace_s=0.3)
    waiting: dict = {}
    body = {"max_tokens": 3000, "n_predict": 3000, "ignore_eos": True}

    def two_prompts():
        with running.client() as own:
            waiting["response"] = own.post("/completion", json={**body, "prompt": ["hello", "world"]})

    try:
        with running.client() as client, client.stream(
                "POST", COMPLETIONS, json={**body, "prompt": "hello", "n": 2, "stream": True}) as resp:
            lines = resp.iter_lines()
            frames = [next(line for line in lines if line.startswith("data: "))]
            other = threading.Thread(target=two_prompts)
            other.start()
            wait_for(lambda: running.worker.stats().num_busy_slots == 4, 10, "all four sequences to run")
            running.server.should_exit = True  # what SIGTERM does
            frames += [line for line in lines if line.startswith("data: ")]
            other.join(10)
            running.thread.join(10)
            wait_for(lambda: running.worker.stats().num_busy_slots == 0, 10, "all to be aborted")
    finally:
        stop_server(running)
    assert frames[-1] == "data: [DONE]"
    ends = [json.loads(f[6:])["choices"][0] for f in frames[-4:-2]]
    assert sorted(c["index"] for c in ends) == [0, 1] and {c["finish_reason"] for c in ends} == {"abort"}
    assert json.loads(frames[-2][6:])["error"]["code"] == "server_shutting_down"
    cut = waiting["response"]
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "server_shutting_down"


def test_the_openai_sdk_reads_n_choices(srv):
    import openai

    with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(model="m", messages=MSG, n=2, max_tokens=4, temperature=0)
        assert [c.index for c in reply.choices] == [0, 1]
        assert reply.choices[0].message.content == reply.choices[1].message.content
        streamed: dict = {}
        for part in client.chat.completions.create(model="m", messages=MSG, n=2, max_tokens=4, temperature=0,
                                                   stream=True):
            for choice in part.choices:
                streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
        assert streamed == {0: reply.choices[0].message.content, 1: reply.choices[1].message.content}
