"""Make tests/fixtures/gguf/qwen3rank-f16.gguf, a tiny Qwen3-Reranker-style model, and record llama-server's
reranking of it in qwen3rank_llama_server.json.

The model is the qwen3 fixture's shapes and vocabulary with new random weights, written by the `gguf` package,
plus what llama.cpp's converter writes for a Qwen3-Reranker (conversion/qwen.py): `qwen3.pooling_type` rank,
`qwen3.classifier.output_labels` ["yes", "no"], a `cls.output.weight` of two rows (random here: in a real file
the LM head's "yes" and "no" rows) and the `rerank` chat template with {query} and {document}.

    .venv/bin/python scripts/make_rerank_fixture.py [--server PATH]  (default $LLAMA_SERVER, else llama-server on PATH)

Without a llama-server binary only the GGUF is (re)written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_gguf import copy_metadata, finish, fixture_main, llama_server, numpy_shape, random_weights  # noqa: E402
from llama_server_tokens import _post, record_tokens, version  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
SOURCE = FIXTURES / "qwen3-f16.gguf"
OUT = FIXTURES / "qwen3rank-f16.gguf"
RECORD = FIXTURES / "qwen3rank_llama_server.json"
TOKENS = FIXTURES / "llama_server_tokens.json"  # every fixture's greedy continuation (tests/test_models_gguf_archs.py)
# The template llama.cpp's converter writes for Qwen3-Reranker (conversion/qwen.py).
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
QUERIES = [
    {"query": "What is the capital of France?",
     "documents": ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog.",
                   "Berlin is the capital of Germany.", "hello",
                   "France is a country in Europe; its capital, Paris, sits on the Seine. " * 6]},
    {"query": "def main(): return 42",
     "documents": ["What is 12345 + 678?", "def main():\n    return 42\n", "Tokenizers split text into pieces."]},
]


def write_gguf(seed: int = 29) -> None:
    """The reranking GGUF: the qwen3 fixture's metadata and tensor shapes, new random weights, the head."""
    from gguf import GGUFReader, GGUFWriter, PoolingType

    reader = GGUFReader(SOURCE)
    writer = GGUFWriter(OUT, "qwen3")
    copy_metadata(reader, writer, ("general.name",))
    writer.add_name("tiny-reranker")
    writer.add_pooling_type(PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, random_weights(numpy_shape(tensor), tensor.name, rng))
    hidden = numpy_shape(next(t for t in reader.tensors if t.name == "token_embd.weight"))[-1]
    writer.add_tensor("cls.output.weight", random_weights((2, hidden), "cls.output.weight", rng))
    finish(writer, OUT)


def record(server: str) -> None:
    """llama-server's /v1/rerank of QUERIES (every document, unsorted by top_n), and the prompts' tokens."""
    entries = []
    with llama_server(server, OUT, "--rerank", "-c", "1024", "-np", "1", "-t", "2", "--no-warmup") as (port, command):
        for case in QUERIES:
            got = _post(port, "/v1/rerank", {**case, "top_n": len(case["documents"])})
            prompts = [RERANK_TEMPLATE.replace("{query}", case["query"]).replace("{document}", d)
                       for d in case["documents"]]
            tokens = [_post(port, "/tokenize", {"content": p, "add_special": False, "parse_special": True})["tokens"]
                      for p in prompts]
            entries.append({**case, "results": got["results"], "usage": got["usage"], "tokens": tokens})
    body = {"model": OUT.name, "server": version(server), "command": command, "cases": entries}
    RECORD.write_text(json.dumps(body, indent=1) + "\n")
    print(f"recorded {sum(len(c['documents']) for c in entries)} scores in {RECORD.name}")


def _record_all(server: str) -> None:
    record(server)
    record_tokens(server, [OUT], TOKENS, json.loads(TOKENS.read_text())["prompt"])


if __name__ == "__main__":
    fixture_main(__doc__, write_gguf, _record_all, "scores")
