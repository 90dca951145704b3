"""Fill-in-the-middle: llama-server's /infill, OpenAI's /v1/completions `suffix` and Ollama's /api/generate
`suffix` on the committed tiny coder model (scripts/make_fim_fixture.py: the qwen2 fixture with Qwen2.5-Coder's
FIM tokens), token for token against llama-server's recorded prompts and greedy tokens; the prompt's layout
rules on their own (models/fim.py); a model without FIM tokens refused on every route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server_helpers import error_of, start_server, stop_server

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gguf"
RECORD = json.loads((FIXTURES / "qwen2fim_llama_server.json").read_text())
CASES = RECORD["cases"]


@pytest.fixture(scope="module")
def loaded():
    from mlxcel_py.models import load_model

    return load_model(str(FIXTURES / "qwen2fim-f16.gguf"))


@pytest.fixture(scope="module")
def server(loaded):
    running = start_server(model=loaded, parallel=1, ctx_size=RECORD["ctx"])  # one slot of llama-server's context
    yield running
    stop_server(running)


def _infill(case: dict, **extra) -> dict:
    return {**case["request"], "n_predict": RECORD["n_predict"], "temperature": 0, "return_tokens": True, **extra}


def test_the_fim_tokens_are_found_as_llama_cpp_finds_them(loaded):
    from mlxcel_py.models.fim import FimTokens

    vocab = loaded.tokenizer.convert_tokens_to_ids
    want = FimTokens(*(vocab(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
                                          "<|repo_name|>", "<|file_sep|>")))
    assert loaded.fim == want and not want.missing  # pre/suf/mid from the file's keys, the others by their text
    assert want.ends <= loaded.eos_token_ids  # pad, repo and file separators end a generation, as in llama.cpp


@pytest.mark.parametrize("index", range(len(CASES)), ids=["plain", "extra-and-prompt", "special-text"])
def test_infill_equals_llama_servers_prompt_and_tokens(server, index):
    case = CASES[index]
    with server.client() as client:
        got = client.post("/infill", json=_infill(case))
    assert got.status_code == 200, got.text
    reply = got.json()
    assert reply["tokens_evaluated"] == len(case["prompt_ids"]) and reply["prompt"] == case["prompt"]
    assert reply["tokens"] == case["tokens"] and reply["content"] == case["content"]


def test_the_prompt_ids_are_llama_servers(server, loaded):
    from mlxcel_py.server.generation.fim import fim_prompt

    rt = server.runtime
    for case in CASES:
        request = case["request"]
        extra = [(c.get("filename", "tmp"), c["text"]) for c in request.get("input_extra", [])]
        assert fim_prompt(rt, request["input_prefix"], request["input_suffix"], extra,
                          request.get("prompt", "")) == case["prompt_ids"]


def test_streaming_and_the_other_dialects_build_the_same_prompt(server):
    case = CASES[0]
    prefix, suffix = case["request"]["input_prefix"], case["request"]["input_suffix"]
    with server.client() as client:
        with client.stream("POST", "/infill", json=_infill(case, stream=True)) as resp:
            frames = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
        assert "".join(f["content"] for f in frames) == case["content"] and frames[-1]["stop"]
        openai = client.post("/v1/completions", json={"prompt": prefix, "suffix": suffix, "temperature": 0,
                                                       "max_tokens": RECORD["n_predict"]}).json()
        assert openai["usage"]["prompt_tokens"] == len(case["prompt_ids"])
        assert openai["choices"][0]["text"] == case["content"]
        ollama = client.post("/api/generate", json={"model": "m", "prompt": prefix, "suffix": suffix, "stream": False,
                                                    "options": {"temperature": 0,
                                                                "num_predict": RECORD["n_predict"]}}).json()
        assert ollama["response"] == case["content"]  # (its prompt_eval_count: the tokens past the cached prefix)
        for path, body, field in (
            ("/v1/completions", {"prompt": [1, 2], "suffix": "x"}, "prompt"),
            ("/v1/completions", {"prompt": "a", "suffix": "x", "echo": True}, "echo"),
            ("/api/generate", {"model": "m", "prompt": "a", "suffix": "x", "system": "s"}, "system"),
            ("/infill", {"input_prefix": "a"}, "input_suffix"),
            ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra"),
        ):
            resp = client.post(path, json=body)
            assert resp.status_code == 400 and field in json.dumps(resp.json()), (path, resp.text)


def test_a_model_without_fim_tokens_refuses_on_every_route():
    running = start_server()  # the tiny test model: no FIM tokens
    try:
        with running.client() as client:
            for path, body in (("/infill", {"input_prefix": "a", "input_suffix": "b"}),
                               ("/v1/completions", {"prompt": "a", "suffix": "b"}),
                               ("/api/generate", {"model": "m", "prompt": "a", "suffix": "b"})):
                resp = client.post(path, json=body)
                assert resp.status_code == 400, (path, resp.text)
                message = resp.json()["error"] if path.startswith("/api/") else error_of(resp)["message"]  # Ollama's
                assert "no fill-in-the-middle tokens (prefix token is missing" in message, path
            assert client.post("/completion", json={"prompt": "a", "n_predict": 2}).status_code == 200
    finally:
        stop_server(running)


def test_the_layout_rules():
    from mlxcel_py.models.fim import FimTokens, infill_ids

    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - one id per character
    fim = FimTokens(pre=1, suf=2, mid=3)
    # no repo/file tokens: chunks after the snippet line; BOS after the chunks; prefix cut to its last 3/4 batch,
    # suffix to its first quarter less the prompt and two
    got = infill_ids(fim, encode, "abcdefgh", "uvwxyz", [("f", "Q")], [9], bos=0, n_batch=8, n_predict=-1, n_ctx=64)
    assert got == encode("\n\n--- snippet ---\n\nQ") + [0, 1] + encode("cdefgh") + [9, 2, 3]
    # suffix first with spm; token ids mixed into the text; the chunks cut to the context left
    got = infill_ids(fim, encode, ["a", 7], "z", [("f", "QR")], [], bos=None, n_batch=16, n_predict=3, n_ctx=23)
    assert got == encode("R") + [1, ord("a"), 7, 2, ord("z"), 3]
    spm = infill_ids(fim, encode, "a", "z", [], [], bos=None, n_batch=16, n_predict=3, n_ctx=25, spm=True)
    assert spm == [2, ord("z"), 1, ord("a"), 3]


def test_spm_infill_puts_the_suffix_first(loaded):
    running = start_server(model=loaded, parallel=1, ctx_size=RECORD["ctx"], spm_infill=True)
    try:
        case = CASES[0]
        with running.client() as client:
            reply = client.post("/infill", json=_infill(case)).json()
        prefix, suffix = case["request"]["input_prefix"], case["request"]["input_suffix"]
        assert reply["prompt"].endswith(f"<|fim_suffix|>{suffix}<|fim_prefix|>{prefix}<|fim_middle|>")
        assert reply["tokens_evaluated"] == len(case["prompt_ids"])
    finally:
        stop_server(running)
