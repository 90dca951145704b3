"""Make tests/fixtures/gguf/bertrank-f16.gguf, a tiny BERT cross-encoder (the form llama.cpp's converter writes
for a BertForSequenceClassification reranker such as the ms-marco MiniLM cross-encoders), and record
llama-server's reranking and tokenization of it in bertrank_llama_server.json.

The model: `bert` architecture, 2 layers of width 64, random weights, a WordPiece vocabulary in llama.cpp's
phantom-space form (tokenizer.ggml.model "bert"), pooling_type rank, `cls` + `cls.output` (one label).

    .venv/bin/python scripts/make_bert_rerank_fixture.py [--server PATH]  (default $LLAMA_SERVER, else llama-server)

Without a llama-server binary only the GGUF is (re)written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_gguf import finish, fixture_main, llama_server, random_weights  # noqa: E402
from llama_server_tokens import _post, version  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
OUT = FIXTURES / "bertrank-f16.gguf"
RECORD = FIXTURES / "bertrank_llama_server.json"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the of and is in to a capital france paris berlin germany city river what where which how "
         "library harbor near town market bridge quick brown fox jumps over lazy dog hello world "
         "token split text into pieces model predict next piece cafe").split()
PIECES = list("abcdefghijklmnopqrstuvwxyz0123456789") + ["ing", "ed", "er", "ly", "ion"]
PUNCT = list(".,?!;:'\"()-+=<>/")
HIDDEN, FF, LAYERS, HEADS, CONTEXT = 64, 128, 2, 4, 512
QUERIES = [
    {"query": "What is the capital of France?",
     "documents": ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog.",
                   "Berlin is the capital of Germany.", "hello", "Where is the library near the harbor? " * 8,
                   "Café au lait, naïve résumé: ÀÉÎ!"]},
    {"query": "how do models split text?",
     "documents": ["Tokenizers split text into pieces, and models predict the next piece.", "world", "xyzzy qqq"]},
]


def vocabulary() -> tuple[list[str], list[int]]:
    """WordPiece tokens in llama.cpp's stored form: "\u2581word" starts a word, "piece" continues one."""
    tokens = SPECIAL + ["\u2581" + w for w in dict.fromkeys(WORDS + PIECES + PUNCT)] + PIECES
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    return tokens, types


def write_gguf(seed: int = 31) -> None:
    from gguf import GGUFWriter, PoolingType

    tokens, types = vocabulary()
    writer = GGUFWriter(OUT, "bert")
    writer.add_name("tiny-bert-reranker")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FF)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType.RANK)
    writer.add_classifier_output_labels(["LABEL_0"])
    writer.add_file_type(1)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(2)
    writer.add_bos_token_id(SPECIAL.index("[CLS]"))
    writer.add_sep_token_id(SPECIAL.index("[SEP]"))
    writer.add_unk_token_id(SPECIAL.index("[UNK]"))
    writer.add_pad_token_id(SPECIAL.index("[PAD]"))
    writer.add_mask_token_id(SPECIAL.index("[MASK]"))
    rng = np.random.default_rng(seed)

    def add(name: str, shape: tuple[int, ...]) -> None:
        values = random_weights(shape, name, rng)  # f16 matrices; vectors and token types f32, as the converter
        keep = len(shape) == 2 and name != "token_types.weight"
        writer.add_tensor(name, values if keep else values.astype(np.float32))

    add("token_embd.weight", (len(tokens), HIDDEN))
    add("token_types.weight", (2, HIDDEN))
    add("position_embd.weight", (CONTEXT, HIDDEN))
    for part in ("weight", "bias"):
        add(f"token_embd_norm.{part}", (HIDDEN,))
    for i in range(LAYERS):
        for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_up", (FF, HIDDEN)), ("ffn_down", (HIDDEN, FF))):
            add(f"blk.{i}.{name}.weight", shape)
            add(f"blk.{i}.{name}.bias", (shape[0],))
        for norm in ("attn_output_norm", "layer_output_norm"):
            add(f"blk.{i}.{norm}.weight", (HIDDEN,))
            add(f"blk.{i}.{norm}.bias", (HIDDEN,))
    add("cls.weight", (HIDDEN, HIDDEN))
    add("cls.bias", (HIDDEN,))
    add("cls.output.weight", (1, HIDDEN))
    add("cls.output.bias", (1,))
    finish(writer, OUT)


def record(server: str) -> None:
    """llama-server's /v1/rerank of QUERIES and /tokenize of every query and document."""
    entries = []
    with llama_server(server, OUT, "--rerank", "-c", "1024", "-np", "1", "-t", "2", "--no-warmup") as (port, command):
        for case in QUERIES:
            got = _post(port, "/v1/rerank", {**case, "top_n": len(case["documents"])})
            texts = [case["query"], *case["documents"]]
            tokens = [_post(port, "/tokenize", {"content": t, "add_special": False})["tokens"] for t in texts]
            special = [_post(port, "/tokenize", {"content": t, "add_special": True})["tokens"] for t in texts]
            entries.append({**case, "results": got["results"], "usage": got["usage"], "tokens": tokens,
                            "tokens_with_special": special})
    body = {"model": OUT.name, "server": version(server), "command": command, "cases": entries}
    RECORD.write_text(json.dumps(body, indent=1) + "\n")
    print(f"recorded {sum(len(c['documents']) for c in entries)} scores in {RECORD.name}")


if __name__ == "__main__":
    fixture_main(__doc__, write_gguf, record, "scores")
