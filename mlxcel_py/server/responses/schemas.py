"""OpenAI's Responses API request body (POST /v1/responses), every field with its JSON type.

Field list: the `openai` Python SDK 3.57 (`types/responses/response_create_params.py`), plus
`stream`. Input items this server cannot render (images, files, built-in tool calls,
item references) and tools other than functions are a 400 that names their type; what is
done with each field: fields.py.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator
from typing_extensions import Annotated

from ..generation.schemas import Body, Object, by_type

ITEMS = ("message", "reasoning", "function_call", "function_call_output")


def _kind(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


def _by_kind(kinds: dict[Optional[str], type[BaseModel]], other: type[BaseModel]) -> Any:
    """A union picked by the object's `type` through `kinds`; any other type is `other`."""
    models = list(dict.fromkeys([*kinds.values(), other]))

    def pick(value: Any) -> str:
        kind = _kind(value)
        return (kinds.get(kind, other) if kind is None or isinstance(kind, str) else other).__name__

    return Annotated[Union[tuple(Annotated[m, Tag(m.__name__)] for m in models)], Discriminator(pick)]


class Refused(Body):
    """Matches any other `type` and refuses it by name (a 400 on its path)."""

    model_config = {"extra": "allow", "strict": True}
    type: str
    refusal: ClassVar[str] = ""

    @model_validator(mode="after")
    def _refuse(self) -> "Refused":
        raise ValueError(f"'{self.type}' {self.refusal}")


# -- content parts -------------------------------------------------------------------------------
class ContentTextPart(Body):
    """input_text, or output_text when an earlier reply is sent back."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: Optional[list[Object]] = None  # output_text's; accepted as sent
    logprobs: Optional[list[Object]] = None
    prompt_cache_breakpoint: Optional[Object] = None  # a caching hint


class InputImagePart(Body):
    """An image in a user message (a data: URL); needs a vision-language model (generation/images.py)."""

    type: Literal["input_image"]
    image_url: Optional[str] = None
    file_id: Optional[str] = None  # refused: this server keeps no files
    detail: Optional[Literal["auto", "low", "high"]] = None  # accepted; the model's processor sets the size


class RefusalPart(Body):
    type: Literal["refusal"]
    refusal: str


class UnsupportedPart(Refused):
    refusal: ClassVar[str] = ("content parts are not supported by this server (it takes input_text, input_image, "
                              "output_text and refusal)")


Part = _by_kind({"input_text": ContentTextPart, "output_text": ContentTextPart, "refusal": RefusalPart,
                 "input_image": InputImagePart}, UnsupportedPart)


# -- input items ---------------------------------------------------------------------------------
class MessageItem(Body):
    type: Optional[Literal["message"]] = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[Part]]
    id: Optional[str] = None
    status: Optional[str] = None
    phase: Optional[str] = None


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[Part]]
    id: Optional[str] = None
    status: Optional[str] = None


class ReasoningText(Body):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Body):
    """An earlier reply's thinking, sent back: the next assistant turn's reasoning_content."""

    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: Optional[list[ReasoningText]] = None
    encrypted_content: Optional[str] = None  # ours is null; another server's cannot be read here
    status: Optional[str] = None


class UnsupportedItem(Refused):
    refusal: ClassVar[str] = f"input items are not supported by this server (it takes {', '.join(ITEMS)})"


# A message may leave out its type.
Item = _by_kind({None: MessageItem, "message": MessageItem, "reasoning": ReasoningItem,
                 "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem}, UnsupportedItem)


# -- tools ---------------------------------------------------------------------------------------
class ResponsesFunctionTool(Body):
    type: Literal["function"]
    name: str
    description: Optional[str] = None
    parameters: Optional[Object] = None
    strict: Optional[bool] = None
    # Tool search's, programmatic calling's and the caller's hints: change nothing here.
    defer_loading: Optional[bool] = None
    allowed_callers: Optional[list[str]] = None
    async_: Optional[bool] = Field(default=None, alias="async")
    output_schema: Optional[Object] = None


class BuiltinTool(Refused):
    refusal: ClassVar[str] = ("tools are not supported by this server (only function tools: built-in tools run "
                              "on OpenAI's side)")


Tool = _by_kind({"function": ResponsesFunctionTool}, BuiltinTool)


class FunctionChoice(Body):
    type: Literal["function"]
    name: str


class OtherChoice(Refused):
    refusal: ClassVar[str] = ('tool choices are not supported by this server (it takes "none", "auto", "required" '
                              'or {"type": "function", "name": ...})')
ToolChoice = Annotated[
    Union[Annotated[Literal["none", "auto", "required"], Tag("Mode")], Annotated[FunctionChoice, Tag("Function")],
          Annotated[OtherChoice, Tag("Other")]],
    Discriminator(lambda v: "Mode" if isinstance(v, str) else "Function" if _kind(v) == "function" else "Other"),
]


# -- text output ---------------------------------------------------------------------------------
class PlainTextFormat(Body):
    type: Literal["text"]


class TextJSONObjectFormat(Body):
    type: Literal["json_object"]


class TextJSONSchemaFormat(Body):
    type: Literal["json_schema"]
    name: str
    schema_: Object = Field(alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None  # the schema is always enforced


class TextConfig(Body):
    format: Optional[by_type(PlainTextFormat, TextJSONObjectFormat, TextJSONSchemaFormat)] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


class Reasoning(Body):
    effort: Optional[str] = None
    summary: Optional[str] = None
    generate_summary: Optional[str] = None
    mode: Optional[str] = None
    context: Optional[str] = None  # which turns' reasoning to keep: there is none here


class ResponsesStreamOptions(Body):
    include_obfuscation: Optional[bool] = None


class ResponsesRequest(Body):
    """POST /v1/responses."""

    model: Optional[str] = None
    input: Union[str, list[Item], None] = None
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    store: Optional[bool] = None
    stream: Optional[bool] = None
    stream_options: Optional[ResponsesStreamOptions] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    # refused unless inert (fields.py)
    background: Optional[bool] = None
    conversation: Union[str, Object, None] = None
    include: Optional[list[str]] = None
    reasoning: Optional[Reasoning] = None
    top_logprobs: Optional[int] = None
    prompt: Optional[Object] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    context_management: Optional[list[Object]] = None
    moderation: Optional[Object] = None
    image: Optional[Object] = None
    # ignored (fields.py)
    max_tool_calls: Optional[int] = None
    background_options: Optional[Object] = None
    access_programs: Optional[Object] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_options: Optional[Object] = None
    prompt_cache_retention: Optional[Literal["in_memory", "24h"]] = None
    safety_identifier: Optional[str] = None
    service_tier: Optional[str] = None
