"""The committed cross-implementation GGUF fixtures (scripts/make_gguf_fixtures.py), loaded once per process.

Not a test module. Each `<arch>-hf/` is a tiny random model saved by transformers; each
`<arch>-<type>.gguf` is llama.cpp's convert_hf_to_gguf.py output for it (or llama-quantize's, from
the f16 file or an f32 one: the K-quant files and qwen2-q8_0);
llama_server_tokens.json holds llama-server's tokenization and greedy tokens of PROMPT."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
PROMPT = "The quick brown fox jumps over the lazy dog. What is 12345 + 678?"
# One float16 GGUF per architecture: its values are the HF checkpoint's own.
ARCH_FILES = {
    "llama": "llama-f16.gguf", "mistral": "mistral-f16.gguf", "qwen2": "qwen2-f16.gguf",
    "qwen3": "qwen3-f16.gguf", "gemma3": "gemma3-f16.gguf", "phi3": "phi3-f16.gguf",
    "llamaspm": "llamaspm-f16.gguf",  # a sentencepiece vocabulary (tokenizer.ggml.model "llama")
    "qwen2yarn": "qwen2yarn-f16.gguf",  # YaRN rope scaling
    "phi3long": "phi3long-f16.gguf",  # Phi-3.5's LongRoPE (rope_factors_long/short tensors)
    "gemma3spm": "gemma3spm-f16.gguf",  # Gemma's sentencepiece vocabulary
}
# Converted with a lossy type: compared with llama-server and with their own quantized path.
LOSSY_FILES = ("llama-q8_0.gguf", "qwen2-q8_0.gguf", "qwen3-q8_0.gguf", "mistral-bf16.gguf")
KQUANT_FILES = ("llamaq-q4_k_m.gguf", "llamaq-q5_k_m.gguf", "llamaq-q6_k.gguf")


def arch_of(filename: str) -> str:
    return filename.split("-", 1)[0]


@functools.lru_cache(maxsize=None)
def fixture_model(filename: str, dense: bool = True):
    """The fixture loaded through `load_model` (dense float32 unless dense=False)."""
    from mlxcel_py.models import load_model

    return load_model(str(FIXTURES / filename), dense=dense)


@functools.lru_cache(maxsize=None)
def hf_reference(arch: str):
    """mlx-lm's own model for the Hugging Face directory, in float32."""
    import mlx.core as mx
    from mlx_lm.utils import load_model as mlx_lm_load_model

    model, _ = mlx_lm_load_model(FIXTURES / f"{arch}-hf")
    model.set_dtype(mx.float32)
    return model


@functools.lru_cache(maxsize=None)
def hf_tokenizer(arch: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURES / f"{arch}-hf"))


def llama_server_record() -> Optional[dict]:
    path = FIXTURES / "llama_server_tokens.json"
    return json.loads(path.read_text()) if path.exists() else None


# Encoders generate nothing: tests/test_rerank_bert.py checks them against llama-server's scores instead.
ENCODER_FIXTURES = ("bertrank-f16.gguf",)


def fixture_files(generative: bool = False) -> list[str]:
    """Every committed GGUF fixture (`generative`: the ones that generate text)."""
    return sorted(p.name for p in FIXTURES.glob("*.gguf") if not (generative and p.name in ENCODER_FIXTURES))


def write_split(source: Path, out: Path, max_tensors: int) -> list[Path]:
    """`source` rewritten by the `gguf` package's writer as llama.cpp's split files
    (`out`'s stem + -0000i-of-0000N.gguf, at most `max_tensors` tensors each); returns the parts."""
    from gguf import GGUFReader, GGUFWriter, GGUFValueType

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch, split_max_tensors=max_tensors)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))
