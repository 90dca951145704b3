"""The embedding routes' request bodies (what /openapi.json publishes); a wrong type is a 400 naming the field."""

from __future__ import annotations

from typing import Literal, Optional, Union

from ..generation.schemas import Body, ClosedBody, KeepAlive, Object

# A string, several strings, one prompt's token ids, or several prompts' token ids.
Inputs = Union[str, list[str], list[int], list[list[int]]]


class EmbeddingRequest(Body):
    """OpenAI's POST /v1/embeddings."""

    input: Inputs
    model: Optional[str] = None  # any name: the served model answers
    encoding_format: Optional[Literal["float", "base64"]] = None
    dimensions: Optional[int] = None  # refused: the model's width is the only one
    user: Optional[str] = None  # ignored


class NativeEmbeddingRequest(Body):
    """llama-server's POST /embedding and /embeddings: `input` or `content`."""

    input: Optional[Inputs] = None
    content: Optional[Inputs] = None
    embd_normalize: Optional[int] = None  # -1 none, 0 max absolute (int16 range), 1 taxicab, 2 L2 (default), p > 2
    model: Optional[str] = None


class OllamaEmbedRequest(ClosedBody):
    """Ollama's POST /api/embed."""

    model: Optional[str] = None
    input: Union[str, list[str]] = ""
    truncate: Optional[bool] = None  # default true: a long input is cut to the slot's context
    dimensions: Optional[int] = None  # refused
    options: Optional[Object] = None  # refused unless empty: nothing samples here
    keep_alive: KeepAlive = None  # accepted: the model stays loaded for the server's lifetime


class OllamaEmbeddingsRequest(ClosedBody):
    """Ollama's older POST /api/embeddings."""

    model: Optional[str] = None
    prompt: str = ""
    options: Optional[Object] = None
    keep_alive: KeepAlive = None
