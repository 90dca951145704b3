"""The loaded-model record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any  # an mlx_lm nn.Module: model(inputs, cache=...) -> logits
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    eos_token_ids: frozenset[int]
    context_length: int
    name: str  # model id for /v1/models
    description: str  # one line for logs
    source: str  # "gguf" | "mlx"
    weights: str  # "dense-float32" | "quantized" | "float16" | ...
    blas: str
    bos_token_id: Optional[int] = None
    add_bos: bool = False
