"""Ollama's request bodies: POST /api/chat, /api/generate and /api/show, every field with its
JSON type (a wrong type is a 400 naming the field); these models are also what /openapi.json
publishes.

Field list: Ollama's api/types.go and the official `ollama` Python client 0.6.3 (`_types.py`).
Unlike Ollama, which ignores fields it does not know, a field declared nowhere here is a 400
naming it, so nothing a client sends is silently dropped; what each declared field does:
fields.py and docs/API_NATIVE.md.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field

from ..generation.schemas import Body, ClosedBody, KeepAlive, Object


OllamaBody = ClosedBody  # undeclared fields are refused by name (Ollama would ignore them)


class OllamaOptions(OllamaBody):
    """`options`: Ollama's model parameters (its Modelfile PARAMETERs), by what they do here."""

    # honoured: the sampler and the request's window
    num_predict: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    num_ctx: Optional[int] = None
    # refused unless set to the value that switches them off (fields.py)
    typical_p: Optional[float] = None
    tfs_z: Optional[float] = None
    mirostat: Optional[int] = None
    # ignored: load-time and tuning knobs that change nothing here (the server's flags decide)
    mirostat_tau: Optional[float] = None
    mirostat_eta: Optional[float] = None
    penalize_newline: Optional[bool] = None
    num_keep: Optional[int] = None
    num_batch: Optional[int] = None
    num_gpu: Optional[int] = None
    main_gpu: Optional[int] = None
    num_thread: Optional[int] = None
    numa: Optional[bool] = None
    low_vram: Optional[bool] = None
    f16_kv: Optional[bool] = None
    logits_all: Optional[bool] = None
    vocab_only: Optional[bool] = None
    use_mmap: Optional[bool] = None
    use_mlock: Optional[bool] = None
    embedding_only: Optional[bool] = None


class OllamaCalledFunction(OllamaBody):
    index: Optional[int] = None
    name: str
    arguments: Object  # an object, not OpenAI's JSON text


class OllamaToolCall(OllamaBody):
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: OllamaCalledFunction


class OllamaMessage(OllamaBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str] = None
    images: Optional[list[str]] = None  # base64 images after the message's text: a vision-language model
    thinking: Optional[str] = None  # an earlier turn's thinking: its reasoning_content for the template
    tool_calls: Optional[list[OllamaToolCall]] = None
    tool_name: Optional[str] = None
    tool_call_id: Optional[str] = None


class OllamaFunction(Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[Object] = None


class OllamaTool(Body):
    type: Literal["function"] = "function"
    function: OllamaFunction


# "" or "json", or a JSON schema (an object)
Format = Union[Literal["", "json"], Object, None]
# seconds, or a Go duration such as "5m"; the model stays resident whatever it says


class OllamaRequest(OllamaBody):
    """What /api/chat and /api/generate share."""

    model: Optional[str] = None
    stream: Optional[bool] = None  # Ollama's default is true
    format: Format = None
    options: Optional[OllamaOptions] = None
    keep_alive: KeepAlive = None
    think: Union[bool, str, None] = None
    truncate: Optional[bool] = None
    shift: Optional[bool] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None


class OllamaChatRequest(OllamaRequest):
    """POST /api/chat."""

    messages: list[OllamaMessage] = Field(default_factory=list)  # empty: only load the model
    tools: Optional[list[OllamaTool]] = None


class OllamaGenerateRequest(OllamaRequest):
    """POST /api/generate."""

    prompt: Optional[str] = None  # empty: only load the model
    suffix: Optional[str] = None
    system: Optional[str] = None
    template: Optional[str] = None
    context: Optional[list[int]] = None
    raw: Optional[bool] = None
    images: Optional[list[str]] = None
    width: Optional[int] = None
    height: Optional[int] = None
    steps: Optional[int] = None


class OllamaShowRequest(Body):
    """POST /api/show (`name` is the deprecated spelling of `model`)."""

    model: Optional[str] = None
    name: Optional[str] = None
    verbose: Optional[bool] = None
    system: Optional[str] = None
    template: Optional[str] = None
    options: Optional[Any] = None
