"""The architecture table (`ARCHS`): per architecture, the rules for mapping a GGUF onto mlx-lm's
model classes, and whether the CPU decode step runs it (models/cpu/arch.py reads it from here).

Each entry says which mlx-lm module builds the model, how llama.cpp's converter changed
the Hugging Face tensors (names, the llama Q/K row permutation for its interleaved RoPE,
Gemma's `1 + weight` norms) and how to read the hyperparameters back into the config
dict mlx-lm would get from the model's config.json."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ModelLoadError
from .ranking import HEAD_TENSORS

TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
IN_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
GEMMA3_BLOCK = {
    **IN_BLOCK, "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
PHI3_BLOCK = {**IN_BLOCK, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
BERT_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_output_norm": "attention_norm", "ffn_up": "up_proj",
    "ffn_down": "down_proj", "layer_output_norm": "output_norm",
}
BERT_TOP = {"token_types": "model.token_types", "position_embd": "model.positions",
            "token_embd_norm": "model.embed_norm"}
BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
TOP_RE = re.compile(r"(\w+)\.(weight|bias)$")
# Tensors the converter adds that carry RoPE settings, not weights; read by the loader.
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Tensors the loader reads itself, outside mlx-lm's modules: those, and a reranker's classifier head.
SIDE_TENSORS = ROPE_TENSORS + HEAD_TENSORS


@dataclass(frozen=True, slots=True)
class Arch:
    name: str  # general.architecture
    model_type: str  # mlx-lm module under mlx_lm.models
    block_names: dict[str, str]
    config: Callable[["Meta"], dict[str, Any]]
    permuted_qk: bool = False  # llama.cpp's converter permuted Q/K rows (LLAMA rope type)
    norm_offset: float = 0.0  # the converter stored norm weights as 1 + w
    extra_top: dict[str, str] = field(default_factory=dict)  # top-level tensors beyond TOP_LEVEL's
    cpu_step: bool = True  # the CPU decode step (models/cpu/) runs it; else decode stays in mlx-lm
    module: str = ""  # the module that builds it, when not mlx_lm.models.<model_type> (an encoder of ours)

    def mlx_name(self, name: str, source: str) -> str:
        if match := BLOCK_RE.match(name):
            layer, part, kind = match.groups()
            if part in self.block_names:
                return f"model.layers.{layer}.{self.block_names[part]}.{kind}"
        elif (match := TOP_RE.match(name)) and match.group(1) in (top := {**TOP_LEVEL, **self.extra_top}):
            return f"{top[match.group(1)]}.{match.group(2)}"
        raise ModelLoadError(f"unsupported tensor {name!r} in {source} (not part of a {self.name} model)")


class Meta:
    """`{arch}.*` hyperparameters of one file, with errors that name the key and file."""

    def __init__(self, metadata: dict, arch: str, source: str, tensors: dict):
        self.metadata, self.arch, self.source, self.tensors = metadata, arch, source, tensors

    def get(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(f"{self.arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata key '{self.arch}.{key}' missing in {self.source}")
        return value

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.metadata

    def vocab_size(self) -> int:
        if "token_embd.weight" in self.tensors:
            return int(self.tensors["token_embd.weight"].shape[0])
        return int(self.get("vocab_size"))


def _rope_scaling(meta: Meta) -> dict | None:
    kind = meta.get("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(meta.get("rope.scaling.factor"))}
    if kind == "yarn":
        out = {"type": "yarn", "factor": float(meta.get("rope.scaling.factor")),
               "original_max_position_embeddings": int(meta.get("rope.scaling.original_context_length"))}
        for key in ("beta_fast", "beta_slow"):
            if meta.has(f"rope.scaling.yarn_{key}"):
                out[key] = float(meta.get(f"rope.scaling.yarn_{key}"))
        return out
    raise ModelLoadError(f"unsupported GGUF rope scaling {kind!r} in {meta.source} (supported: none, linear, yarn)")


def _common(meta: Meta) -> dict[str, Any]:
    hidden, heads = int(meta.get("embedding_length")), int(meta.get("attention.head_count"))
    head_dim = int(meta.get("attention.key_length", hidden // heads))
    rope_dims = int(meta.get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelLoadError(
            f"unsupported partial RoPE ({rope_dims} of {head_dim} dims) in {meta.source} ({meta.arch})"
        )
    return {
        "hidden_size": hidden, "num_hidden_layers": int(meta.get("block_count")),
        "intermediate_size": int(meta.get("feed_forward_length")), "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("attention.head_count_kv", heads)), "head_dim": head_dim,
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon")),
        "vocab_size": meta.vocab_size(), "rope_theta": float(meta.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get("context_length", 4096)),
        "rope_scaling": _rope_scaling(meta), "tie_word_embeddings": "output.weight" not in meta.tensors,
    }


def _bert(meta: Meta) -> dict[str, Any]:
    """llama.cpp's bert: a bidirectional encoder (cross-encoder rerankers, embedding models)."""
    if meta.get("attention.causal", False):
        raise ModelLoadError(f"unsupported causal bert in {meta.source}")
    return {
        "hidden_size": int(meta.get("embedding_length")), "num_hidden_layers": int(meta.get("block_count")),
        "intermediate_size": int(meta.get("feed_forward_length")),
        "num_attention_heads": int(meta.get("attention.head_count")),
        "layer_norm_eps": float(meta.get("attention.layer_norm_epsilon")), "vocab_size": meta.vocab_size(),
        "max_position_embeddings": int(meta.get("context_length")),
        "type_vocab_size": int(meta.metadata.get("tokenizer.ggml.token_type_count", 2)),
    }


def _gemma3(meta: Meta) -> dict[str, Any]:
    config = _common(meta)
    window = int(meta.get("attention.sliding_window", 0))
    pattern = meta.get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per-layer flags: mlx-lm takes only "every n-th layer is global"
        n = pattern.index(False) + 1 if False in pattern else len(pattern) + 1
        if pattern != [(i + 1) % n != 0 for i in range(len(pattern))]:
            raise ModelLoadError(f"unsupported gemma3 sliding-window layer pattern in {meta.source}")
        pattern = n
    if meta.get("final_logit_softcapping", 0.0):
        raise ModelLoadError(f"unsupported gemma3 final logit softcapping in {meta.source}")
    layers = config["num_hidden_layers"]
    # llama.cpp's rule: the 27B (62 layers) scales queries by hidden/heads, the others by head_dim.
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == 62 else config["head_dim"]
    config.update(
        sliding_window=window or config["max_position_embeddings"],
        sliding_window_pattern=int(pattern) if window else 1,
        rope_local_base_freq=float(meta.get("rope.freq_base_swa", 10000.0)), query_pre_attn_scalar=scalar,
    )
    return config


def _phi3(meta: Meta) -> dict[str, Any]:
    """Phi-3.5/Phi-4-mini's LongRoPE: the converter stores its factors as two tensors."""
    from .gguf_tensors import dense

    config = _common(meta)
    config["original_max_position_embeddings"] = int(
        meta.get("rope.scaling.original_context_length", config["max_position_embeddings"])
    )
    if "rope_factors_long.weight" in meta.tensors:
        factors = {k: dense(meta.tensors[f"rope_factors_{k}.weight"]).tolist() for k in ("long", "short")}
        config["rope_scaling"] = {"type": "longrope", "long_factor": factors["long"], "short_factor": factors["short"]}
    return config


ARCHS = {
    "llama": Arch("llama", "llama", IN_BLOCK, _common, permuted_qk=True),
    "qwen2": Arch("qwen2", "qwen2", IN_BLOCK, _common),
    "qwen3": Arch("qwen3", "qwen3", IN_BLOCK, _common),
    "gemma3": Arch("gemma3", "gemma3_text", GEMMA3_BLOCK, _gemma3, norm_offset=1.0),
    "phi3": Arch("phi3", "phi3", PHI3_BLOCK, _phi3),
    "bert": Arch("bert", "bert", BERT_BLOCK, _bert, extra_top=BERT_TOP, cpu_step=False,
                 module="mlxcel_py.models.bert"),
}
SUPPORTED_ARCHS = ", ".join(ARCHS)


def arch_for(metadata: dict, source: str) -> Arch:
    name = metadata.get("general.architecture")
    if name not in ARCHS:
        raise ModelLoadError(f"unsupported GGUF architecture {name!r} in {source} (supported: {SUPPORTED_ARCHS})")
    return ARCHS[name]
