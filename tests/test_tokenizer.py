"""The GGUF tokenizer rebuilt with `tokenizers`: round trips, digits, specials, streaming."""

import pytest

from mlxcel_py.models import default_model_path
from mlxcel_py.models.tokenizer import ByteLevelDetokenizer, gguf_tokenizer
from tiny import tiny_model

TEXTS = [
    "Hello, world!",
    " leading space and trailing space ",
    "naïve café, Straße, façade — “quotes” … ",
    "日本語のテキスト、中文文本, 한국어",
    "emoji 🤖🚀 family 👨‍👩‍👧 flags 🇫🇷 ok",
    "tabs\tand\nnewlines\n\n  indented\r\n",
    "numbers 3.14159 and 1,000,000 and 2024-01-01",
    "code: def f(x):\n    return x ** 2  # square",
    "<|im_start|>user\nhi<|im_end|>\n",
    "nul\x00byte and \x7f del",
    "",
]


@pytest.fixture(scope="module")
def real():
    from pathlib import Path

    from mlxcel_py.models.gguf_file import read_gguf

    return gguf_tokenizer(read_gguf(Path(default_model_path())).metadata, "SmolLM2")


def stream(tokenizer, ids):
    detok = tokenizer.detokenizer
    pieces = []
    for token in ids:
        detok.add_token(token)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    return "".join(pieces)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_real_round_trip_and_streaming(real, text):
    tok = real.wrapper
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert stream(tok, ids) == text


@pytest.mark.slow
def test_real_digits_specials_and_ids(real):
    tok = real.wrapper
    ids = tok.encode("12345", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]
    assert tok.encode("<|im_start|><|im_end|><|endoftext|>", add_special_tokens=False) == [1, 2, 0]
    assert tok.encode("Hi there", add_special_tokens=True) == tok.encode("Hi there", add_special_tokens=False)
    # 4 is <reponame>, llama.cpp's FIM repo token: an end of generation there too (its log lists EOG 0, 2, 4)
    assert (real.bos_token_id, real.eos_token_ids, real.add_bos) == (1, frozenset({0, 2, 4}), False)
    assert len(tok) == 49152 and isinstance(tok._detokenizer, ByteLevelDetokenizer)
    # Known SmolLM2 ids: "Hello" 19556, " world" 905.
    assert tok.encode("Hello world", add_special_tokens=False) == [19556, 905]


@pytest.mark.slow
def test_real_chat_template_is_chatml(real):
    messages = [{"role": "user", "content": "hi"}]
    text = real.wrapper.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_round_trip_and_streaming(text):
    tok = tiny_model().tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert stream(tok, ids) == text


def test_tiny_vocab_is_byte_level_bpe_with_merges():
    tok = tiny_model().tokenizer
    assert len(tok) == 400
    ids = tok.encode("the capital of France", add_special_tokens=False)
    assert len(ids) < len("the capital of France")  # merges apply
    assert len(tok.encode("12345", add_special_tokens=False)) == 5
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_a_lone_space_token_is_released_at_once(real):
    ids = real.wrapper.encode("in 2024", add_special_tokens=False)
    detok = real.wrapper.detokenizer
    released = []
    for token in ids:
        detok.add_token(token)
        released.append(detok.last_segment)
    # smollm splits digits one per token, so " 2024" is " ", "2", "0", "2", "4": the space
    # must not wait for the next token.
    assert released == ["in", " ", "2", "0", "2", "4"]
