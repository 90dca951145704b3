"""llama-server's native request bodies: /completion, /apply-template, /tokenize, /detokenize
(what /completion does with each field: fields.py).

Field list: llama-server's README ("POST /completion", llama.cpp 0c1e570).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from ..generation.schemas import Body, ChatMessage, GenerationRequest, Object

Piece = Union[int, str]  # a token id or text, in a mixed prompt


class PromptObject(Body):
    """llama-server's {"prompt_string", "multimodal_data"} prompt: base64 images, one <__media__> marker
    in the text where each goes (a vision-language model; server/generation/images.py)."""

    prompt_string: str
    multimodal_data: Optional[list[str]] = None


NativePrompt = Union[str, PromptObject, list[Piece], list[Union[str, PromptObject, list[Piece]]]]


class NativeCompletionRequest(GenerationRequest):
    """POST /completion: GenerationRequest's fields plus llama-server's own."""

    prompt: NativePrompt
    return_tokens: Optional[bool] = None
    response_fields: Optional[list[str]] = None
    id_slot: Optional[int] = None
    n_indent: Optional[int] = None
    n_cmpl: Optional[int] = None
    n_cache_reuse: Optional[int] = None
    t_max_predict_ms: Optional[int] = None
    timings_per_token: Optional[bool] = None
    post_sampling_probs: Optional[bool] = None
    lora: Optional[list[dict[str, Any]]] = None
    sse_ping_interval: Optional[float] = None
    # llama-server takes [[token, bias], ...] as well as OpenAI's {"token": bias}
    logit_bias: Union[dict[str, Union[float, bool]], list[list[Any]], None] = None  # type: ignore[assignment]


class ExtraChunk(Body):
    """An /infill `input_extra` chunk: another file's text, for the repo-level FIM prompt."""

    text: str
    filename: Optional[str] = None


class InfillRequest(NativeCompletionRequest):
    """POST /infill: /completion's fields, with the code before and after the cursor (text or token ids,
    mixed), other files' chunks, and `prompt`, text that follows the prefix."""

    prompt: Optional[str] = None  # type: ignore[assignment]
    input_prefix: Union[str, list[Piece]]
    input_suffix: Union[str, list[Piece]]
    input_extra: Optional[list[ExtraChunk]] = None


class ApplyTemplateRequest(Body):
    """POST /apply-template: the chat messages to render, and the template's fields of the chat
    route (other chat fields are ignored, as there)."""

    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: Optional[Object] = None
    add_generation_prompt: Optional[bool] = None
    continue_final_message: Optional[bool] = None


class TokenizeRequest(Body):
    content: str
    add_special: Optional[bool] = None
    with_pieces: Optional[bool] = None


class DetokenizeRequest(Body):
    tokens: list[int]
