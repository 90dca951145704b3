"""Model loading: GGUF files, mlx-lm directories and Hugging Face ids, tokenizers, chat prompts.

Importing this package does not import mlx.core (the BLAS preload must come first)."""

from .chat import ChatPrompt, encode_chat, encode_text, render_chat
from .loader import default_model_path, load_model, load_tokenizer
from .draft import load_draft
from ..errors import ModelLoadError
from .types import LoadedModel

__all__ = [
    "load_draft",
    "ChatPrompt", "LoadedModel", "ModelLoadError", "default_model_path",
    "encode_chat", "encode_text", "load_model", "load_tokenizer", "render_chat",
]
