"""The loaded-model record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

from .fim import FimTokens
from .vocab import logits_width, token_vocab_size


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
    # The CPU fast path the loader chose (docs/CPU_FAST_PATH.md); None: mlx-lm's own code.
    cpu_decode: Optional[Callable[[list[int], list], Any]] = None  # models/cpu/decoder.CpuDecoder
    cpu_kernels: Optional[ContextManager[Any]] = None  # models/cpu/prefill_kernels.PrefillKernels, entered per forward
    pooling: Optional[str] = None  # the GGUF's pooling_type (mean, cls, last, none, rank), when it names one
    rank_head: Optional[Any] = None  # a reranker's classifier head and prompt format (models/ranking.RankHead)
    vision: Optional[Any] = None  # a vision-language model's image side (models/vision.Vision)
    appended_eos: Optional[int] = None  # the eos a GGUF's add_eos_token appends to tokenized text (llama.cpp's)
    fim: FimTokens = FimTokens()  # fill-in-the-middle tokens (models/fim.py); all None: no infill
    adapters: tuple = ()  # LoRA adapters loaded with the model (models/lora.Adapter)
    lora: Optional[Any] = None  # their scales' state (models/lora.LoraState), which the runner sets per forward

    @property
    def adapter_scales(self) -> tuple[float, ...]:
        """The LoRA adapters' loaded scales, in id order."""
        return tuple(a.scale for a in self.adapters)

    @property
    def causal(self) -> bool:
        """False for an encoder (models/bert.py): its prompt runs as one piece."""
        return getattr(self.model, "causal", True)

    @property
    def generates(self) -> bool:
        """False for a reranker (its outputs are scores) and an encoder (embeddings only)."""
        return self.causal and self.rank_head is None

    def no_text(self, name: Optional[str] = None) -> str:
        """What to use instead, for a model that does not generate (`name`: the id it is served as)."""
        if self.rank_head is not None:
            return f"{name or self.name} is a reranking model; use /v1/rerank"
        return f"{name or self.name} is an encoder (embeddings only); use /v1/embeddings"

    @property
    def vocab_size(self) -> int:
        """Ids below this are safe both for the tokenizer and the model's embedding."""
        return token_vocab_size(self.model, self.tokenizer)

    @property
    def logits_width(self) -> int:
        """The model's vocabulary as its logits see it (may exceed the tokenizer's)."""
        return logits_width(self.model, self.tokenizer)
