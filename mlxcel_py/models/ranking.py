"""A reranker's classifier head and prompt format, as llama.cpp reads them from a GGUF.

A reranking GGUF says `{arch}.pooling_type` = 4 (rank) and carries the classifier tensors llama.cpp's
converter writes: `cls.weight`/`cls.bias` (a dense layer, then tanh: BERT/RoBERTa's head),
`cls.output.weight`/`cls.output.bias` (the projection to the labels). A causal reranker (Qwen3-Reranker)
has only `cls.output`: the "yes" and "no" rows of its LM head, softmaxed (llama-graph.cpp's
build_pooling, case RANK). The score llama-server reports is the first output.

The prompt: the file's `tokenizer.chat_template.rerank` with `{query}` and `{document}` replaced,
tokenized without added specials (special tokens parsed); without one, llama-server's
`[BOS] query [EOS] [SEP] document [EOS]` (each added as the vocabulary's add_* flags say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import ModelLoadError
from .wordpiece import special_id

RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
HEAD_TENSORS = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")
SOFTMAX_ARCHS = ("qwen3", "qwen3vl")  # llama.cpp softmaxes these heads' outputs


@dataclass(frozen=True, slots=True)
class RankHead:
    """The classifier over one pooled hidden state (float32 numpy arrays, rows = outputs)."""

    dense: Optional[np.ndarray] = None  # cls.weight (hidden, hidden), then tanh
    dense_bias: Optional[np.ndarray] = None
    out: Optional[np.ndarray] = None  # cls.output.weight (labels, hidden)
    out_bias: Optional[np.ndarray] = None
    softmax: bool = False
    labels: tuple[str, ...] = ()
    template: Optional[str] = None  # tokenizer.chat_template.rerank, with {query} and {document}
    add_sep: bool = False  # without a template: a SEP between the query's EOS and the document
    sep_token_id: Optional[int] = None
    first_token: bool = False  # an encoder's head reads the first position ([CLS]); a causal one the last

    def scores(self, hidden: np.ndarray) -> np.ndarray:
        """The head's outputs for one pooled state (hidden,): what llama.cpp's rank pooling returns."""
        x = np.asarray(hidden, dtype=np.float32)
        if self.dense is not None:
            x = self.dense @ x
            if self.dense_bias is not None:
                x = x + self.dense_bias
            x = np.tanh(x)
        if self.out is not None:
            x = self.out @ x
            if self.out_bias is not None:
                x = x + self.out_bias
        if self.softmax:
            x = np.exp(x - x.max())
            x = x / x.sum()
        return x.astype(np.float32)

    def prompt(self, query: str, document: str) -> Optional[str]:
        """The templated text (None without a template: the caller joins the token ids)."""
        if self.template is None:
            return None
        return self.template.replace("{query}", query).replace("{document}", document)


def rank_head(metadata: dict, arch: str, tensors: dict[str, np.ndarray], source: str) -> Optional[RankHead]:
    """The file's head when it is a reranker (pooling_type rank), else None; `tensors` are the
    HEAD_TENSORS present, as float32. A rank file without a head cannot score: an error."""
    if metadata.get(f"{arch}.pooling_type") != RANK_POOLING:
        if tensors:
            raise ModelLoadError(f"{source} has classifier tensors ({', '.join(sorted(tensors))}) but its "
                                 f"{arch}.pooling_type is not rank; it is not a model this server can run")
        return None
    if "cls.weight" not in tensors and "cls.output.weight" not in tensors:
        raise ModelLoadError(f"{source} says it is a reranker ({arch}.pooling_type rank) but has no classifier "
                             "head (cls.weight or cls.output.weight)")
    labels = tuple(str(v) for v in metadata.get(f"{arch}.classifier.output_labels", ()) or ())
    wordpiece = metadata.get("tokenizer.ggml.model") == "bert"  # llama.cpp adds a SEP there by default
    sep = special_id(metadata, "sep") if wordpiece else metadata.get("tokenizer.ggml.seperator_token_id")
    return RankHead(
        dense=tensors.get("cls.weight"), dense_bias=tensors.get("cls.bias"),
        out=tensors.get("cls.output.weight"), out_bias=tensors.get("cls.output.bias"),
        softmax=arch in SOFTMAX_ARCHS, labels=labels,
        template=metadata.get("tokenizer.chat_template.rerank"),
        add_sep=bool(metadata.get("tokenizer.ggml.add_sep_token", wordpiece)),
        sep_token_id=None if sep is None else int(sep),
        first_token=not metadata.get(f"{arch}.attention.causal", True),
    )
