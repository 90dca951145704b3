"""Split a loaded model over the ranks of a distributed group with mlx-lm's own sharding.

Tensor parallelism is the model's `shard(group)` (llama, qwen2/3, deepseek, ...): every
rank keeps every layer with 1/N of its attention heads and MLP columns, and two
all-reduces per layer join the halves. Pipeline parallelism is `model.model.pipeline(group)`
where mlx-lm has it (qwen2/3, deepseek, ...; not llama): each rank keeps a run of layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx.utils import tree_flatten

from ..errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What one rank holds after sharding, for the startup log."""

    mode: str  # "tensor" | "pipeline"
    holds: str
    param_bytes: int


def _args(model) -> Any:
    return getattr(model, "args", None)


def _tensor_blocker(model, size: int) -> str | None:
    """Why `model.shard` cannot split over `size` ranks, or None when it can."""
    if not hasattr(model, "shard"):
        return f"mlx-lm has no tensor-parallel shard() for {type(model).__module__.rsplit('.', 1)[-1]} models"
    args = _args(model)
    counts = {
        "attention heads": getattr(args, "num_attention_heads", None),
        "key/value heads": getattr(args, "num_key_value_heads", None) or getattr(args, "num_attention_heads", None),
        "MLP columns": getattr(args, "intermediate_size", None),
    }
    uneven = [f"{count} {what}" for what, count in counts.items() if isinstance(count, int) and count % size]
    if uneven:
        return f"the model has {', '.join(uneven)}, not divisible by {size} ranks"
    return None


def _has_pipeline(model) -> bool:
    return hasattr(getattr(model, "model", None), "pipeline")


def choose_mode(model, requested: str, size: int) -> str:
    """The concrete mode for `--distributed auto|tensor|pipeline`; ModelLoadError when it cannot work."""
    tensor_blocker = _tensor_blocker(model, size)
    if requested == "tensor" or (requested == "auto" and tensor_blocker is None):
        if tensor_blocker is not None:
            raise ModelLoadError(f"--distributed tensor: {tensor_blocker}" + _pipeline_hint(model))
        return "tensor"
    if not _has_pipeline(model):
        kind = type(model).__module__.rsplit(".", 1)[-1]
        why = f"mlx-lm has no pipeline split for {kind} models (it has one for qwen2, qwen3, deepseek, ...)"
        if requested == "auto":
            why = f"{tensor_blocker}, and {why}"
        raise ModelLoadError(f"--distributed {requested}: {why}")
    layers = len(model.model.layers)
    if layers < size:
        raise ModelLoadError(f"--distributed pipeline: {layers} layers cannot be split over {size} ranks")
    return "pipeline"


def _pipeline_hint(model) -> str:
    return "; try --distributed pipeline" if _has_pipeline(model) else ""


def shard_model(model, group, mode: str) -> ShardInfo:
    """Shard `model` in place for this rank of `group`; evaluates the kept weights."""
    import mlx.core as mx

    size, rank = group.size(), group.rank()
    num_layers = len(model.model.layers) if hasattr(model, "model") else len(model.layers)
    if mode == "tensor":
        model.shard(group)
        args = _args(model)
        heads = getattr(args, "num_attention_heads", 0)
        kv = getattr(args, "num_key_value_heads", None) or heads
        holds = (f"all {num_layers} layers with {heads // size} of {heads} query heads, {kv // size} of {kv} "
                 f"key/value heads and 1/{size} of the MLP; embeddings and LM head whole")
    else:
        model.model.pipeline(group)
        start, end = model.model.start_idx, model.model.end_idx
        holds = f"layers {start}-{end - 1} of {num_layers}; embeddings, final norm and LM head whole"
    mx.eval(model.parameters())
    nbytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    return ShardInfo(mode, f"rank {rank}/{size}: {holds}", nbytes)


def fingerprint(model) -> tuple[int, ...]:
    """Numbers every rank's copy of the model must agree on (the same file loaded everywhere)."""
    args = _args(model)
    names = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")
    return tuple(int(getattr(args, name, 0) or 0) for name in names)
