"""Make tests/fixtures/gguf/qwen3emb-f16.gguf, a tiny Qwen3-Embedding-style model, and record llama-server's
embeddings of it in qwen3emb_llama_server.json.

The model is the qwen3 fixture's shapes and vocabulary with new random weights, written by the `gguf` package,
plus what a converted Qwen3-Embedding GGUF says: `qwen3.pooling_type` last and `tokenizer.ggml.add_eos_token`
with `<|endoftext|>` as the eos, so llama.cpp appends it to every text input and pools its hidden state.

    .venv/bin/python scripts/make_embedding_fixture.py [--server PATH]  (default $LLAMA_SERVER, else llama-server on PATH)

Without a llama-server binary only the GGUF is (re)written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_gguf import copy_metadata, finish, fixture_main, numpy_shape, random_weights  # noqa: E402
from llama_server_tokens import _free_port, _post, _wait_ready  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
SOURCE = FIXTURES / "qwen3-f16.gguf"
OUT = FIXTURES / "qwen3emb-f16.gguf"
RECORD = FIXTURES / "qwen3emb_llama_server.json"
ENDOFTEXT = "<|endoftext|>"
INPUTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "hello",
    "What is 12345 + 678? def main():\n    return 42\n",
    "Tokenizers split text into pieces, and models predict the next piece. " * 6,
]
# Weights large enough that the pooled state depends on the whole input, not only on the appended token.
WEIGHT_SCALE = 1.0


def write_gguf(seed: int = 23) -> None:
    """The embedding GGUF: the qwen3 fixture's metadata and tensor shapes, new random weights."""
    from gguf import GGUFReader, GGUFWriter, PoolingType

    reader = GGUFReader(SOURCE)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    writer = GGUFWriter(OUT, "qwen3")
    copy_metadata(reader, writer, ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "general.name"))
    writer.add_name("tiny-embedding")
    writer.add_pooling_type(PoolingType.LAST)
    writer.add_eos_token_id(tokens.index(ENDOFTEXT))
    writer.add_pad_token_id(tokens.index(ENDOFTEXT))
    writer.add_add_eos_token(True)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, random_weights(numpy_shape(tensor), tensor.name, rng, WEIGHT_SCALE))
    finish(writer, OUT)


def record(server: str) -> None:
    """llama-server's tokens and embeddings of INPUTS: /v1/embeddings (L2-normalised) and /embedding."""
    import subprocess

    port = _free_port()
    cmd = [server, "-m", str(OUT), "--embeddings", "--pooling", "last", "-c", "1024", "-np", "1", "-t", "2",
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        oai = _post(port, "/v1/embeddings", {"input": INPUTS, "encoding_format": "float"})["data"]
        native = [_post(port, "/embedding", {"content": text})[0]["embedding"][0] for text in INPUTS]
        ids = [_post(port, "/tokenize", {"content": text, "add_special": True})["tokens"] for text in INPUTS]
    finally:
        proc.terminate()
        proc.wait(30)
    version = subprocess.run([server, "--version"], capture_output=True, text=True)
    entries = [{"input": text, "tokens": tok, "v1_embeddings": d["embedding"], "embedding": vec}
               for text, tok, d, vec in zip(INPUTS, ids, sorted(oai, key=lambda d: d["index"]), native)]
    body = {"model": OUT.name, "server": (version.stdout + version.stderr).strip().splitlines()[-2:],
            "command": " ".join(["llama-server", "-m", OUT.name, *cmd[3:-4]]),
            "inputs": entries}
    RECORD.write_text(json.dumps(body, indent=1) + "\n")
    print(f"recorded {len(entries)} embeddings in {RECORD.name}")


if __name__ == "__main__":
    fixture_main(__doc__, write_gguf, record, "embeddings")
