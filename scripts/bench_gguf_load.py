"""Time GGUF loading on real-size files: the default model, and a 0.4B llama stored with each
quantization type (random blocks of that type: the load work is the same as for real
weights). Prints median seconds; run with the project's venv:

    .venv/bin/python scripts/bench_gguf_load.py [--types Q4_K Q6_K Q8_0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


# A 0.4B llama whose every row is whole K-quant blocks (the default model's 576 is not).
DIMS = {"embedding_length": 1024, "feed_forward_length": 2816, "block_count": 24,
        "attention.head_count": 16, "attention.head_count_kv": 8}


def _shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    hidden, ffn, kv = DIMS["embedding_length"], DIMS["feed_forward_length"], hidden_kv()
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,), "output.weight": (vocab, hidden)}
    for i in range(DIMS["block_count"]):
        shapes.update({
            f"blk.{i}.attn_q.weight": (hidden, hidden), f"blk.{i}.attn_k.weight": (kv, hidden),
            f"blk.{i}.attn_v.weight": (kv, hidden), f"blk.{i}.attn_output.weight": (hidden, hidden),
            f"blk.{i}.ffn_gate.weight": (ffn, hidden), f"blk.{i}.ffn_up.weight": (ffn, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ffn), f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.ffn_norm.weight": (hidden,),
        })
    return shapes


def hidden_kv() -> int:
    return DIMS["embedding_length"] // DIMS["attention.head_count"] * DIMS["attention.head_count_kv"]


def synthetic_model(source: Path, out: Path, qtype_name: str) -> Path:
    """A llama of DIMS with `source`'s tokenizer, every matrix random `qtype` blocks."""
    from gguf import GGUFWriter
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from mlxcel_py.models.gguf_file import read_gguf

    qtype = GGMLQuantizationType[qtype_name]
    block, size = GGML_QUANT_SIZES[qtype]
    src = read_gguf(source)
    writer = GGUFWriter(str(out), "llama")
    for key, value in src.metadata.items():
        if key.startswith("tokenizer."):
            writer.add_key_value(key, value, _value_type(value))
    for key, value in {**DIMS, "context_length": 8192, "attention.layer_norm_rms_epsilon": 1e-5}.items():
        writer.add_key_value(f"llama.{key}", value, _value_type(value))
    rng = np.random.default_rng(0)
    for name, shape in _shapes(len(src.metadata["tokenizer.ggml.tokens"])).items():
        if len(shape) == 1:
            writer.add_tensor(name, np.ones(shape, np.float32))
            continue
        data = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
        writer.add_tensor(name, data.reshape(shape[0], -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _value_type(value):
    from gguf.constants import GGUFValueType

    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return GGUFValueType.get_type(value)


def median_load_s(path: Path, dense: bool, repeat: int) -> float:
    from mlxcel_py.models import load_model

    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        load_model(str(path), dense=dense)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="*", default=["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from mlxcel_py.models.cpu.blas import preload_blas

    preload_blas("auto")
    from mlxcel_py.models import default_model_path

    default = Path(default_model_path())
    rows = [("default model (Q4_1 + Q8_0)", default)]
    folder = Path(tempfile.mkdtemp())
    for name in args.types:
        rows.append((f"0.4B llama, {name}", synthetic_model(default, folder / f"llama-{name}.gguf", name)))
    print(f"{'file':32} {'MB':>6} {'dense s':>8} {'quantized s':>12}   (median of {args.repeat})")
    for label, path in rows:
        dense = median_load_s(path, True, args.repeat)
        kept = median_load_s(path, False, args.repeat)
        print(f"{label:32} {path.stat().st_size / 1e6:6.1f} {dense:8.2f} {kept:12.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
