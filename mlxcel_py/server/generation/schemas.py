"""What every dialect's request bodies share: the strict `Body` base, OpenAI-form chat messages
(the chat templates' input), the output formats, and `GenerationRequest`, the sampling fields
(OpenAI's, then llama-server's) that generation/sampling.py reads for every route.

Declaring a field here does not mean it is implemented: each dialect's fields.py refuses the
ones that would change the output and are not implemented, and docs/SERVER.md lists the ones
that are ignored. Field list: OpenAI's API reference as shipped in openai-python 3.57
(`types/chat/completion_create_params.py`, `types/completion_create_params.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

Object = dict[str, Any]  # a JSON object whose inside we do not interpret


class Body(BaseModel):
    """The base of every request body of every dialect."""

    # Strict: JSON types must match (no "0.5" -> 0.5); unknown fields are ignored like OpenAI's.
    model_config = ConfigDict(extra="ignore", strict=True)


class ClosedBody(Body):
    """A body whose undeclared fields are refused by name (Ollama's bodies: Ollama itself would ignore them)."""

    model_config = ConfigDict(extra="forbid", strict=True)


KeepAlive = Union[str, float, int, None]  # Ollama's keep_alive: a duration string or seconds


class StreamOptions(Body):
    include_usage: Optional[bool] = None
    include_obfuscation: Optional[bool] = None


# -- messages ------------------------------------------------------------------------------------
class TextPart(Body):
    type: Literal["text"]
    text: str


class ImageURL(Body):
    url: str  # a data: URL (data:image/png;base64,...); http(s) URLs are refused (never fetched)
    detail: Optional[Literal["auto", "low", "high"]] = None  # accepted; the model's processor sets the size


class ImageURLPart(Body):
    """An image in a user turn (OpenAI's form); needs a vision-language model (server/generation/images.py)."""

    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextPart, ImageURLPart], Field(discriminator="type")]


class CalledFunction(Body):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Body):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None  # assistant turns
    function_call: Optional[CalledFunction] = None  # assistant turns, deprecated form of tool_calls
    tool_call_id: Optional[str] = None  # tool turns
    refusal: Optional[str] = None  # assistant turns
    reasoning_content: Optional[str] = None  # assistant turns: the thinking, for templates that render it

    @model_validator(mode="after")
    def _needs_content(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and (self.tool_calls or self.function_call)):
            raise ValueError("content is required (it may be null only in an assistant turn with tool_calls)")
        return self


# -- output formats (generation/structured.py) -----------------------------------------------
def by_type(*models: type[BaseModel]) -> Any:
    """A union picked by the object's "type"; error locations name the branch "type=<value>"."""
    tags = [m.model_fields["type"].annotation.__args__[0] for m in models]  # each model's Literal

    def pick(value: Any) -> str:
        return f"type={value.get('type') if isinstance(value, dict) else getattr(value, 'type', None)}"

    expected = ", ".join(repr(t) for t in tags)
    return Annotated[
        Union[tuple(Annotated[m, Tag(f"type={t}")] for m, t in zip(models, tags))],
        Discriminator(pick, custom_error_type="invalid_type", custom_error_message=f"type must be one of {expected}"),
    ]


class TextFormat(Body):
    type: Literal["text"]


class JSONObjectFormat(Body):
    type: Literal["json_object"]
    schema_: Optional[Object] = Field(default=None, alias="schema")  # llama-server's: a schema here too


class JSONSchemaSpec(Body):
    name: Optional[str] = None  # OpenAI requires it; llama-server does not, and it changes nothing
    description: Optional[str] = None
    schema_: Optional[Object] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class JSONSchemaFormat(Body):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = by_type(TextFormat, JSONObjectFormat, JSONSchemaFormat)
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# A bias, or llama-server's `false`: never this token.
Bias = Union[float, Literal[False]]
# OpenAI's {"token id": bias}, or llama-server's [[token id, bias], ...]; either keyed by text too,
# as llama-server ({" the": -5}, [[" the", false]]; pairs checked in sampling.py).
LogitBias = Union[dict[str, Bias], list[Annotated[list[Union[int, str, Bias]], Field(min_length=2, max_length=2)]]]


# -- the two generation bodies -------------------------------------------------------------------
class GenerationRequest(Body):
    """Fields the chat and completions bodies share (OpenAI's, then llama-server's)."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    logit_bias: Optional[LogitBias] = None
    user: Optional[str] = None
    # llama-server's
    n_predict: Optional[int] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    repeat_penalty: Optional[float] = None
    repeat_last_n: Optional[int] = None
    ignore_eos: Optional[bool] = None
    cache_prompt: Optional[bool] = None
    return_progress: Optional[bool] = None
    grammar: Optional[str] = None
    json_schema: Optional[Object] = None
    n_probs: Optional[int] = None
    post_sampling_probs: Optional[bool] = None  # llama-server's; honoured on /completion only
    # llama.cpp's sampler chain (engine/runner/sampler_chain.py), as llama-server takes it on every route
    typical_p: Optional[float] = None
    mirostat: Optional[int] = None
    mirostat_tau: Optional[float] = None
    mirostat_eta: Optional[float] = None
    dynatemp_range: Optional[float] = None
    dynatemp_exponent: Optional[float] = None
    xtc_probability: Optional[float] = None
    xtc_threshold: Optional[float] = None
    top_n_sigma: Optional[float] = None
    min_keep: Optional[int] = None
    samplers: Union[list[str], str, None] = None
    adapters: Optional[str] = None  # mlx_lm.server's: a loaded LoRA adapter by path or name (--lora)
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None
    response_format: Optional[ResponseFormat] = None  # OpenAI's is on chat only; llama-server's on both
    n_keep: Optional[int] = None  # llama-server's context shift (--context-shift); generation/keep.py
    n_discard: Optional[int] = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)
