"""The tokenizer layers and the vocabulary sizes, read the same way everywhere.

mlx-lm wraps a transformers tokenizer in a TokenizerWrapper (`._tokenizer`), and a fast
transformers tokenizer wraps the Rust `tokenizers.Tokenizer` (`.backend_tokenizer`)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional, Sequence


def hf_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer inside an mlx-lm TokenizerWrapper (or the tokenizer itself).

    Told by its `detokenizer`, not isinstance: importing mlx_lm.tokenizer_utils imports MLX, and
    a transformers fast tokenizer has a `_tokenizer` of its own (the Rust one)."""
    return tokenizer._tokenizer if hasattr(tokenizer, "detokenizer") else tokenizer


def backend_tokenizer(tokenizer: Any) -> Optional[Any]:
    """The Rust `tokenizers.Tokenizer` under any of the layers, or None for a slow tokenizer."""
    inner = hf_tokenizer(tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    return backend if hasattr(backend, "to_str") else None


def token_vocab_size(model: Any, tokenizer: Any) -> int:
    """Ids below this are safe both for the tokenizer and the model's embedding."""
    try:
        size = len(hf_tokenizer(tokenizer))
    except TypeError:
        size = int(tokenizer.vocab_size)
    width = _model_vocab(model)
    return min(size, width) if width else size


def logits_width(model: Any, tokenizer: Any) -> int:
    """The model's vocabulary as its logits see it (may exceed the tokenizer's)."""
    return _model_vocab(model) or len(tokenizer.get_vocab())


def _model_vocab(model: Any) -> int:
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    return size if isinstance(size, int) and size > 0 else 0


def decode_continuation(wrapper: Any, ids: Sequence[int]) -> str:
    """The text `ids` stream as: what /detokenize answers, equal to a completion of those ids."""
    detok = wrapper.detokenizer
    for token in ids:
        detok.add_token(token)
    detok.finalize()
    return detok.text


_plain: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_plain_lock = threading.Lock()


def plain_encoder(hf: Any) -> Callable[[str], list[int]]:
    """Text -> ids with the tokenizer's special tokens read as plain text (llama.cpp's parse_special off):
    a copy of the fast tokenizer's backend with `encode_special_tokens` set, made once per tokenizer."""
    with _plain_lock:
        backend = _plain.get(hf)
        if backend is None:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
            backend.encode_special_tokens = True
            _plain[hf] = backend
    return lambda text: backend.encode(text, add_special_tokens=False).ids if text else []
