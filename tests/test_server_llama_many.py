"""Several prompts in one /completion (and n_cmpl): independent sequences answered as
llama-server does, a JSON array in `index` order, streamed with each frame's `index`; copies
of one prompt adopt the first one's prefill from the prompt cache."""

import pytest

from server_helpers import GREEDY, error_of, long_prompt, start_server, stop_server, stream_post

BODY = {"n_predict": 5, "ignore_eos": True, "return_tokens": True, **GREEDY}
PROMPTS = ["Paris is the", "Hello world", "The quick brown fox"]


@pytest.fixture(scope="module")
def http():
    running = start_server(parallel=2)
    with running.client() as client:
        yield client
    stop_server(running)


def post(http, **body):
    resp = http.post("/completion", json={**BODY, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_list_of_prompts_is_an_array_of_their_replies(http):
    alone = [post(http, prompt=p, cache_prompt=False) for p in PROMPTS]
    many = post(http, prompt=PROMPTS)
    assert isinstance(many, list) and [r["index"] for r in many] == [0, 1, 2]
    assert [(r["content"], r["tokens"], r["prompt"]) for r in many] == [
        (a["content"], a["tokens"], a["prompt"]) for a in alone]
    ids = [http.post("/tokenize", json={"content": p}).json()["tokens"] for p in PROMPTS[:2]]
    forms = (ids, [{"prompt_string": PROMPTS[0]}, ids[1]], [PROMPTS[0], {"prompt_string": PROMPTS[1]}])
    for form in forms:
        assert [r["content"] for r in post(http, prompt=form)] == [a["content"] for a in alone[:2]]
    single = post(http, prompt=[PROMPTS[0]])  # a list of one is one prompt: an object, as llama-server
    assert isinstance(single, dict) and single["content"] == alone[0]["content"]


def test_streamed_frames_carry_their_index(http):
    whole = post(http, prompt=PROMPTS[:2])
    frames = stream_post(http, "/completion", {**BODY, "prompt": PROMPTS[:2]})
    assert "[DONE]" not in frames
    for i, reply in enumerate(whole):
        mine = [f for f in frames if f["index"] == i]
        assert "".join(f["content"] for f in mine) == reply["content"]
        assert [t for f in mine[:-1] for t in f["tokens"]] == reply["tokens"]
        assert [f["stop"] for f in mine].count(True) == 1 and mine[-1]["stop"] is True
    assert {f["index"] for f in frames} == {0, 1}


def test_n_cmpl_copies_share_the_prompts_prefill(http):
    prompt = long_prompt(60)
    copies = post(http, prompt=prompt, n_cmpl=3, cache_prompt=True)
    assert [r["index"] for r in copies] == [0, 1, 2] and len({r["content"] for r in copies}) == 1
    assert [r["timings"]["cache_n"] for r in copies[1:]] == [59, 59]  # the last token is evaluated again
    assert post(http, prompt=prompt, cache_prompt=False)["content"] == copies[0]["content"]
    assert [r["content"] for r in post(http, prompt=prompt, n=2)] == [copies[0]["content"]] * 2
    two_by_two = post(http, prompt=PROMPTS[:2], n_cmpl=2)
    assert [r["index"] for r in two_by_two] == [0, 1, 2, 3]
    assert two_by_two[0]["content"] == two_by_two[1]["content"] != two_by_two[2]["content"]


def test_count_errors_name_their_field(http):
    resp = http.post("/completion", json={"prompt": PROMPTS, "n_cmpl": 6})
    assert resp.status_code == 400 and error_of(resp)["param"] == "prompt"
    assert error_of(resp)["message"] == "3 prompts x 6 completions is more than 16 sequences in one request"
    resp = http.post("/completion", json={"prompt": "x", "n": 2, "n_cmpl": 3})
    assert error_of(resp)["message"] == "n_cmpl (3) and n (2) ask for different counts; send one"
