"""The tiny Hugging Face models behind tests/fixtures/gguf (used by make_gguf_fixtures.py).

Each is built by transformers from its own config class, so config.json, tensor names
and tied heads are exactly what a real checkpoint of that family has."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VOCAB_SIZE = 400
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello world! What is the capital of France? "
    "Paris is the capital of France. The year 2024 had 366 days; 12345 + 678 = 13023. "
    "Tokenizers split text into pieces, and models predict the next piece. "
    "user assistant system: hello, how are you today? I am fine, thank you.\n"
    "def main():\n    return 42\n"
) * 4
PROMPT = "The quick brown fox jumps over the lazy dog. What is 12345 + 678?"
# llama.cpp's split regexes for the pre-tokenizers used here (src/llama-vocab.cpp).
SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


@dataclass(frozen=True)
class Spec:
    config_class: str  # transformers class name
    model_class: str
    config: dict
    pre: str  # llama.cpp tokenizer.ggml.pre
    tokenizer_class: str = "PreTrainedTokenizerFast"
    outtypes: tuple[str, ...] = ("f16",)
    kquants: tuple[str, ...] = ()
    requants: tuple[str, ...] = ()  # types llama-quantize makes from the f16 file (--allow-requantize)
    norm_center: float = 1.0  # gemma norms are stored as w with 1 + w applied
    sentencepiece: bool = False  # a tokenizer.model (SPM BPE, byte fallback) instead of tokenizer.json


ARCHS = {
    "llama": Spec(
        "LlamaConfig", "LlamaForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256}},
        pre="llama-bpe", outtypes=("f16", "q8_0"),
    ),
    "mistral": Spec(
        "MistralConfig", "MistralForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
        pre="smollm", outtypes=("f16", "bf16"),
    ),
    "qwen2": Spec(
        "Qwen2Config", "Qwen2ForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
        pre="qwen2", requants=("Q8_0",),  # the fused CPU step over blocks, with a q/k/v bias
    ),
    # Qwen2.5's long-context setting: YaRN over a 4x longer window.
    "qwen2yarn": Spec(
        "Qwen2Config", "Qwen2ForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 4096,
         "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 1024}},
        pre="qwen2",
    ),
    "qwen3": Spec(
        "Qwen3Config", "Qwen3ForCausalLM",
        {**SMALL, "head_dim": 32, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
        pre="qwen2", outtypes=("f16", "q8_0"),
    ),
    "gemma3": Spec(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        {**SMALL, "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-6,
         "sliding_window": 8, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
         "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
         "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None, "attn_logit_softcapping": None},
        pre="smollm", norm_center=0.0,
    ),
    # Gemma 3 as Google ships it: a sentencepiece vocabulary without a dummy prefix.
    "gemma3spm": Spec(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        {**SMALL, "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-6,
         "sliding_window": 8, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
         "hidden_activation": "gelu_pytorch_tanh",
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
         "final_logit_softcapping": None, "attn_logit_softcapping": None},
        pre="default", norm_center=0.0, tokenizer_class="GemmaTokenizer", sentencepiece=True,
    ),
    "phi3": Spec(
        "Phi3Config", "Phi3ForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "original_max_position_embeddings": 4096,
         "sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        pre="gpt-2", tokenizer_class="GPT2Tokenizer",
    ),
    # Mistral v0.1-v0.3, Gemma and Phi-3 GGUFs carry a sentencepiece vocabulary (tokenizer.ggml.model "llama").
    "llamaspm": Spec(
        "LlamaConfig", "LlamaForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        pre="default", tokenizer_class="LlamaTokenizer", sentencepiece=True,
    ),
    # Phi-3.5-mini / Phi-4-mini: LongRoPE over a 4x longer window.
    "phi3long": Spec(
        "Phi3Config", "Phi3ForCausalLM",
        {**SMALL, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "original_max_position_embeddings": 1024,
         "sliding_window": None, "rope_parameters": {
             "rope_type": "longrope", "rope_theta": 10000.0,
             "long_factor": [1.0, 1.2, 1.6, 2.4, 4.0, 7.0, 11.0, 16.0],
             "short_factor": [1.0, 1.0, 1.1, 1.2, 1.4, 1.6, 1.9, 2.2]}},
        pre="gpt-2", tokenizer_class="GPT2Tokenizer",
    ),
    # K-quant blocks are 256 wide: a model whose every matrix row is a multiple of 256.
    "llamaq": Spec(
        "LlamaConfig", "LlamaForCausalLM",
        {**SMALL, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        pre="llama-bpe", outtypes=(), kquants=("Q4_K_M", "Q5_K_M", "Q6_K"),
    ),
}


def _tokenizer(pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:  # gpt-2
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, want {VOCAB_SIZE}")
    return tok


def _save_sentencepiece(out: Path, tokenizer_class: str) -> None:
    """A sentencepiece BPE model with byte fallback, as Llama 2 / Mistral ship (unk 0, bos 1, eos 2)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT.splitlines()), model_writer=model, vocab_size=VOCAB_SIZE, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        add_dummy_prefix=tokenizer_class != "GemmaTokenizer",
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    config = {"tokenizer_class": tokenizer_class, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False, "chat_template": CHAT_TEMPLATE, "legacy": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _save_tokenizer(spec: Spec, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    if spec.sentencepiece:
        return _save_sentencepiece(out, spec.tokenizer_class)
    hf = PreTrainedTokenizerFast(tokenizer_object=_tokenizer(spec.pre), bos_token=SPECIALS[1],
                                 eos_token=SPECIALS[2], pad_token=SPECIALS[0], unk_token=SPECIALS[0])
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class=spec.tokenizer_class, add_bos_token=False, chat_template=CHAT_TEMPLATE)
    config_path.write_text(json.dumps(config, indent=2))


def _randomize(model, spec: Spec, seed: int) -> None:
    """Weights with O(1) activations, so greedy tokens are not decided by float noise."""
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            if name.endswith("norm.weight"):
                value = spec.norm_center + 0.1 * rng.standard_normal(shape)
            elif name.endswith(".bias"):
                value = 0.1 * rng.standard_normal(shape)
            else:
                value = rng.standard_normal(shape) / np.sqrt(shape[-1])
            param.copy_(torch.from_numpy(value.astype(np.float32)))


def _add_legacy_rope_keys(path: Path) -> None:
    """Also write `rope_theta`/`rope_scaling` as transformers 4 did: real checkpoints carry
    them, and mlx-lm's llama/qwen2/gemma3/phi3 configs read only these."""
    config = json.loads(path.read_text())
    params = config.get("rope_parameters") or {}
    local = params.get("sliding_attention")
    params = params.get("full_attention", params)
    config["rope_theta"] = params["rope_theta"]
    if params.get("rope_type", "default") != "default":
        config["rope_scaling"] = {"type": params["rope_type"], **{k: v for k, v in params.items() if k != "rope_theta"}}
    if local:
        config["rope_local_base_freq"] = local["rope_theta"]
    path.write_text(json.dumps(config, indent=2) + "\n")


def make_hf_dir(spec: Spec, out: Path, seed: int) -> Path:
    """Write the tiny model `spec` in Hugging Face format to `out` (replacing it)."""
    import torch
    import transformers

    if out.exists():
        shutil.rmtree(out)
    config = getattr(transformers, spec.config_class)(
        **spec.config, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32"
    )
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(config).to(torch.float32)
    _randomize(model, spec, seed)
    # float16 on disk: half the size, and the converter's f16 GGUF holds the very same values.
    model = model.to(torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    _add_legacy_rope_keys(out / "config.json")
    _save_tokenizer(spec, out)
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)
    return out
