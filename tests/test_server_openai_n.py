"""OpenAI's n > 1: one engine request per choice, answered as one response whose choices carry
their index; usage counts the prompt once and every choice's tokens; streamed, each choice's
chunks carry its index and usage and [DONE] come once at the end."""

import pytest

from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, stream_post

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=2)
    with running.client() as client:
        yield client
    stop_server(running)


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
    assert usage[0]["usage"] == whole["usage"]
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
