"""Every supported GGUF architecture through `generate`, `run` and `serve`, greedy, against the
mlx-lm reference decode of the same model (tiny.greedy_tokens)."""

import pytest
from typer.testing import CliRunner

import server_helpers
from gguf_fixtures import ARCH_FILES, FIXTURES, fixture_model
from mlxcel_py.cli.app import app
from mlxcel_py.models import encode_chat, encode_text
from server_helpers import GREEDY, start_server, stop_server
from tiny import greedy_tokens

NUM_TOKENS = 6
ARCHS = sorted(ARCH_FILES)


def expected_text(loaded, ids, same_as_decode: bool = True) -> str:
    """The greedy continuation, cut where the engine stops (an end-of-sequence token), as the
    model's streaming detokenizer spells it (for byte-level BPE that is exactly `decode`; a
    sentencepiece vocabulary's byte tokens are raw bytes, as llama.cpp streams them)."""
    tokens = greedy_tokens(loaded.model, ids, NUM_TOKENS)
    for i, token in enumerate(tokens):
        if token in loaded.eos_token_ids:
            tokens = tokens[:i]
            break
    assert tokens, "the reference stops at once: the comparison would prove nothing"
    detok = loaded.tokenizer.detokenizer
    detok.reset()
    for token in tokens:
        detok.add_token(token)
    detok.finalize()
    if same_as_decode and not loaded.add_bos:  # the byte-level GGUFs: streaming equals decode
        assert detok.text == loaded.tokenizer.decode(tokens)
    return detok.text


@pytest.fixture
def model_for(monkeypatch):
    """Serve `--model <fixture>` from the per-process cache, checking the CLI asked for that file."""

    def use(arch):
        path = str(FIXTURES / ARCH_FILES[arch])
        loaded = fixture_model(ARCH_FILES[arch])

        def load(spec, **kwargs):
            assert spec == path
            return loaded

        monkeypatch.setattr("mlxcel_py.models.load_model", load)
        return path, loaded

    return use


@pytest.mark.parametrize("arch", ARCHS)
def test_generate(arch, model_for):
    path, loaded = model_for(arch)
    result = CliRunner().invoke(app, ["generate", "--model", path, "--raw", "Hello world", "-n", str(NUM_TOKENS)])
    assert result.exit_code == 0, result.output
    want = expected_text(loaded, encode_text(loaded.tokenizer, "Hello world"))
    assert result.stdout.rstrip("\n") == want and "Generation:" in result.stderr


@pytest.mark.parametrize("arch", ARCHS)
def test_run(arch, model_for):
    path, loaded = model_for(arch)
    result = CliRunner().invoke(app, ["run", "--model", path, "-n", str(NUM_TOKENS)], input="Hello world\n/bye\n")
    assert result.exit_code == 0, result.output
    ids = encode_chat(loaded.tokenizer, [{"role": "user", "content": "Hello world"}]).ids
    assert result.stdout == expected_text(loaded, ids) + "\n"


@pytest.mark.parametrize("arch", ARCHS)
def test_serve(arch, monkeypatch):
    loaded = fixture_model(ARCH_FILES[arch])
    monkeypatch.setattr(server_helpers, "tiny_model", lambda: loaded)
    running = start_server()
    try:
        with running.client() as client:
            body = {"messages": [{"role": "user", "content": "Hello world"}], "max_tokens": NUM_TOKENS, **GREEDY}
            chat = client.post("/v1/chat/completions", json=body)
            raw = client.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": NUM_TOKENS, **GREEDY})
    finally:
        stop_server(running)
    assert chat.status_code == raw.status_code == 200, chat.text
    ids = encode_chat(loaded.tokenizer, [{"role": "user", "content": "Hello world"}]).ids
    assert chat.json()["choices"][0]["message"]["content"] == expected_text(loaded, ids)
    assert raw.json()["choices"][0]["text"] == expected_text(loaded, encode_text(loaded.tokenizer, "Hello world"))


def test_generate_from_the_hf_directory_with_llama3_rope(monkeypatch):
    """The mlx-lm path too: its Llama 3 rope table must be evaluated before the engine thread runs."""
    from mlxcel_py.models import load_model

    path = str(FIXTURES / "llama-hf")
    loaded = load_model(path)
    monkeypatch.setattr("mlxcel_py.models.load_model", lambda spec, **kwargs: loaded)
    result = CliRunner().invoke(app, ["generate", "--model", path, "--raw", "Hello world", "-n", str(NUM_TOKENS)])
    assert result.exit_code == 0, result.output
    # mlx-lm's own detokenizer for the directory trims the leading space that decode keeps.
    want = expected_text(loaded, encode_text(loaded.tokenizer, "Hello world"), same_as_decode=False)
    assert result.stdout.rstrip("\n") == want
