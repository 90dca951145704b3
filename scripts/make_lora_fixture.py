"""Make tests/fixtures/gguf/lora/llama-lora-f32.gguf, a random LoRA adapter for the llama fixture in llama.cpp's
GGUF LoRA layout (as convert_lora_to_gguf.py writes one: general.type adapter, adapter.type lora,
adapter.lora.alpha; blk.N.<tensor>.weight.lora_a (rank x in) and .lora_b (out x rank), in the base file's Q/K row
order), and record llama-server's greedy tokens with it (--lora and --lora-scaled) in llama_lora_llama_server.json.

    .venv/bin/python scripts/make_lora_fixture.py [--server PATH] [--record-only]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_gguf import finish, fixture_main, llama_server  # noqa: E402
from llama_server_tokens import _post  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
BASE = FIXTURES / "llama-f16.gguf"
OUT = FIXTURES / "lora" / "llama-lora-f32.gguf"
RECORD = FIXTURES / "lora" / "llama_lora_llama_server.json"
RANK, ALPHA = 4, 8.0
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")
PROMPT = "The quick brown fox jumps over"
N_PREDICT = 12
SCALES = (1.0, 0.5)


def write(seed: int = 41) -> None:
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(BASE)
    writer = GGUFWriter(OUT, "llama")
    writer.add_name("tiny-lora")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", ALPHA)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in TARGETS:
            continue
        out_dim, in_dim = (int(n) for n in reversed(tensor.shape.tolist()))
        writer.add_tensor(tensor.name + ".lora_a", (rng.standard_normal((RANK, in_dim)) * 0.5).astype(np.float32))
        writer.add_tensor(tensor.name + ".lora_b", (rng.standard_normal((out_dim, RANK)) * 0.5).astype(np.float32))
    finish(writer, OUT)


def record(server: str) -> None:
    runs = []
    for scale in SCALES:
        flags = ("--lora-scaled", f"{OUT}:{scale}") if scale != 1.0 else ("--lora", str(OUT))
        with llama_server(server, BASE, *flags, "-c", "1024", "-np", "1", "-t", "2", "--no-warmup") as (port, cmd):
            got = _post(port, "/completion", {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0,
                                              "return_tokens": True, "cache_prompt": False})
            adapters = __import__("httpx").get(f"http://127.0.0.1:{port}/lora-adapters").json()
            runs.append({"scale": scale, "tokens": got["tokens"], "content": got["content"],
                         "command": cmd.replace(str(OUT), OUT.name),
                         "lora_adapters": [{k: a[k] for k in ("id", "scale")} for a in adapters]})
    RECORD.write_text(json.dumps({"prompt": PROMPT, "n_predict": N_PREDICT, "runs": runs}, indent=1) + "\n")
    print(f"recorded {RECORD.name}: {[r['tokens'] for r in runs]}")


if __name__ == "__main__":
    fixture_main(__doc__, write, record, "llama-server's tokens")
