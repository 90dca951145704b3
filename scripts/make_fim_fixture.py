"""Make tests/fixtures/gguf/qwen2fim-f16.gguf, a tiny Qwen2.5-Coder-style model with fill-in-the-middle tokens,
and record llama-server's /infill of it in qwen2fim_llama_server.json.

The model is the qwen2 fixture (its metadata, vocabulary and weights) with the six tokens Qwen2.5-Coder adds
for FIM appended as control tokens (their embedding and output rows random): <|fim_prefix|>, <|fim_middle|>,
<|fim_suffix|> named by the `tokenizer.ggml.fim_{pre,mid,suf}_token_id` keys, <|fim_pad|>, <|repo_name|> and
<|file_sep|> left for the loader to find by their text, as llama.cpp does.

    .venv/bin/python scripts/make_fim_fixture.py [--server PATH] [--record-only]

Without a llama-server binary only the GGUF is (re)written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_gguf import copy_metadata, finish, fixture_main, llama_server  # noqa: E402
from llama_server_tokens import _post, record_tokens, version  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
SOURCE = FIXTURES / "qwen2-f16.gguf"
OUT = FIXTURES / "qwen2fim-f16.gguf"
RECORD = FIXTURES / "qwen2fim_llama_server.json"
TOKENS = FIXTURES / "llama_server_tokens.json"  # every fixture's greedy continuation (tests/test_models_gguf_archs.py)
FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
N_PREDICT = 10
CTX = 4096  # one slot: llama-server keeps input_extra when the context exceeds its batch (2048)
CASES = [
    {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n"},
    {"input_prefix": "import os\n\ndef main():\n", "input_suffix": "    return 0\n", "prompt": "    path = ",
     "input_extra": [{"filename": "util.py", "text": "def helper(x):\n    return x * 2\n"},
                     {"text": "CONSTANT = 42\n"}]},
    {"input_prefix": "x = '<|fim_suffix|>'\n", "input_suffix": "y = 1\n"},  # special text read as plain text
]


def write_gguf(seed: int = 31) -> None:
    from gguf import GGUFReader, GGUFWriter, TokenType

    reader = GGUFReader(SOURCE)
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    kinds = list(reader.fields["tokenizer.ggml.token_type"].contents())
    base = len(tokens)
    writer = GGUFWriter(OUT, "qwen2")
    copy_metadata(reader, writer, ("general.name", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"))
    writer.add_name("tiny-coder")
    writer.add_token_list(tokens + list(FIM))
    writer.add_token_types(kinds + [int(TokenType.CONTROL)] * len(FIM))
    writer.add_uint32("tokenizer.ggml.fim_pre_token_id", base)
    writer.add_uint32("tokenizer.ggml.fim_mid_token_id", base + 1)
    writer.add_uint32("tokenizer.ggml.fim_suf_token_id", base + 2)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if tensor.name in ("token_embd.weight", "output.weight"):
            rows = (rng.standard_normal((len(FIM), data.shape[1])) * data.astype(np.float32).std())
            data = np.concatenate([data, rows.astype(data.dtype)])
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    finish(writer, OUT)


def _ids(port: int, text: str, special: bool = False) -> list[int]:
    """llama-server's tokens of `text` (no BOS; special tokens read only when `special`)."""
    body = {"content": text, "add_special": False, "parse_special": special}
    return _post(port, "/tokenize", body)["tokens"] if text else []


def expected_ids(port: int, case: dict, base: int) -> list[int]:
    """The prompt llama-server's format_prompt_infill builds for `case` (tools/server/server-common.cpp, one slot
    of CTX, -b 2048, -n -1), from its own tokens of each piece: what the recorded prompt text and count check."""
    pre, mid, suf, rep, sep = base, base + 1, base + 2, base + 4, base + 5
    extra = [rep] + _ids(port, "myproject\n")
    for chunk in case.get("input_extra", []):
        extra += [sep] + _ids(port, chunk.get("filename", "tmp") + "\n") + _ids(port, chunk["text"])
    extra += [sep] + _ids(port, "filename\n")
    prompt = _ids(port, case.get("prompt", ""), special=True)
    prefix, suffix = _ids(port, case["input_prefix"]), _ids(port, case["input_suffix"])
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (2048 // 4)):]
    suffix = suffix[:min(len(suffix), max(0, 2048 // 4 - (2 + len(prompt))))]
    extra = extra[len(extra) - min(max(0, CTX - 2048 + 2), len(extra)):]  # the qwen2 vocabulary adds no BOS
    return extra + [pre] + prefix + prompt + [suf] + suffix + [mid]


def record(server: str) -> None:
    """llama-server's /infill of CASES (greedy, N_PREDICT tokens): the prompt it built (its text, and its ids as
    its own pieces' tokens laid out by its rule, checked against that text and its count), the tokens, the text."""
    from gguf import GGUFReader

    base = len(GGUFReader(SOURCE).fields["tokenizer.ggml.tokens"].contents())
    entries = []
    flags = ("-c", str(CTX), "-np", "1", "-t", "2", "--no-warmup")
    with llama_server(server, OUT, *flags) as (port, command):
        for case in CASES:
            got = _post(port, "/infill", {**case, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True,
                                          "cache_prompt": False})
            ids = expected_ids(port, case, base)
            assert len(ids) == got["tokens_evaluated"], (len(ids), got["tokens_evaluated"])
            assert _post(port, "/detokenize", {"tokens": ids})["content"] == got["prompt"]
            entries.append({"request": case, "prompt": got["prompt"], "prompt_ids": ids, "tokens": got["tokens"],
                            "content": got["content"]})
    body = {"model": OUT.name, "server": version(server), "command": command, "n_predict": N_PREDICT,
            "ctx": CTX, "cases": entries}
    RECORD.write_text(json.dumps(body, indent=1) + "\n")
    print(f"recorded {len(entries)} infills in {RECORD.name}")


def _record_all(server: str) -> None:
    record(server)
    record_tokens(server, [OUT], TOKENS, json.loads(TOKENS.read_text())["prompt"])


if __name__ == "__main__":
    fixture_main(__doc__, write_gguf, _record_all, "infills")
