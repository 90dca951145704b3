"""A completion keeps its leading space for every tokenizer family: the
engine's text stream, /detokenize and the prompt + completion concatenation agree, as
llama-server streams token pieces (" 100" after "boils at", not "100")."""

from pathlib import Path

import pytest

from mlxcel_py.engine.core.text_stream import stream_factory
from mlxcel_py.models import load_tokenizer
from mlxcel_py.models.vocab import decode_continuation

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
# Byte-level BPE (gpt2-style) and sentencepiece vocabularies, as GGUF files and as the
# mlx-lm/transformers directories they were converted from (fast and slow tokenizers).
FAMILIES = ["llama-f16.gguf", "qwen3-f16.gguf", "gemma3spm-f16.gguf", "llamaspm-f16.gguf",
            "llama-hf", "qwen3-hf", "gemma3spm-hf", "llamaspm-hf"]
PROMPT = "Water boils at a temperature of"
TEXT = PROMPT + " 100 degrees"


@pytest.mark.parametrize("name", FAMILIES)
def test_a_completion_keeps_its_leading_space(name):
    tokenizer, _ = load_tokenizer(str(FIXTURES / name))
    full = tokenizer.encode(TEXT, add_special_tokens=False)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    assert full[: len(prompt)] == prompt  # the completion starts at a token boundary
    completion = full[len(prompt):]
    stream = stream_factory(tokenizer)(())
    streamed = "".join(stream.push(token) for token in completion) + stream.finish()
    assert streamed == " 100 degrees"
    assert decode_continuation(tokenizer, completion) == streamed  # what /detokenize answers
    assert PROMPT + streamed == TEXT
