"""Anthropic's Messages API request bodies (POST /v1/messages and /v1/messages/count_tokens),
with their JSON types, and what this server does with each field.

Field list: the official `anthropic` Python client 2.14 (`types/message_create_params.py`,
`message_count_tokens_params.py`), plus `temperature`, `top_p` and `top_k`, which that
release no longer declares but the API still takes (older clients send them). A content
block or tool this server cannot render is a 400 that names its type; what is done with
each field: fields.py.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, model_validator
from typing_extensions import Annotated

from ..generation.schemas import Body

Object = dict[str, Any]
SUPPORTED_BLOCKS = ("text", "image", "thinking", "tool_use", "tool_result")


class TextBlock(Body):
    type: Literal["text"]
    text: str
    cache_control: Optional[Object] = None  # a caching hint: ignored
    citations: Optional[list[Object]] = None  # accepted as sent; citations are not generated


class ImageSource(Body):
    type: Literal["base64", "url"]  # a url is refused: this server fetches nothing (generation/images.py)
    media_type: Optional[str] = None
    data: Optional[str] = None
    url: Optional[str] = None


class ImageBlock(Body):
    """An image in a user turn; needs a vision-language model."""

    type: Literal["image"]
    source: ImageSource
    cache_control: Optional[Object] = None


class ThinkingBlock(Body):
    """An earlier reply's thinking, sent back: the assistant turn's reasoning (prepare.py)."""

    type: Literal["thinking"]
    thinking: str
    signature: Optional[str] = None  # ours are empty: nothing is verified
    cache_control: Optional[Object] = None


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: Object
    cache_control: Optional[Object] = None


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[TextBlock], None] = None
    is_error: Optional[bool] = None  # rendered as an "Error: " prefix on the result, unless it starts with one
    cache_control: Optional[Object] = None


class UnsupportedBlock(Body):
    """Any other block type (image, document, thinking, server tool results, ...): refused by name."""

    model_config = {"extra": "allow", "strict": True}
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> "UnsupportedBlock":
        raise ValueError(f"'{self.type}' content blocks are not supported by this server "
                         f"(it takes {', '.join(SUPPORTED_BLOCKS)})")


# Capitalised: body.py drops them.
_TAGS = {"text": "Text", "image": "Image", "thinking": "Thinking", "tool_use": "ToolUse", "tool_result": "ToolResult"}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _TAGS.get(kind, "Unsupported") if isinstance(kind, str) else "Unsupported"


Block = Annotated[
    Union[Annotated[TextBlock, Tag("Text")], Annotated[ImageBlock, Tag("Image")],
          Annotated[ThinkingBlock, Tag("Thinking")],
          Annotated[ToolUseBlock, Tag("ToolUse")],
          Annotated[ToolResultBlock, Tag("ToolResult")], Annotated[UnsupportedBlock, Tag("Unsupported")]],
    Discriminator(_block_tag),
]


class Message(Body):
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[Block]]


class CustomTool(Body):
    name: str
    input_schema: Object
    description: Optional[str] = None
    type: Optional[Literal["custom"]] = None
    strict: Optional[bool] = None
    input_examples: Optional[list[Object]] = None
    cache_control: Optional[Object] = None
    defer_loading: Optional[bool] = None
    allowed_callers: Optional[list[Any]] = None
    eager_input_streaming: Optional[bool] = None



class ServerTool(Body):
    """Anthropic's server tools (web_search_..., bash_..., text_editor_...): refused by name."""

    model_config = {"extra": "allow", "strict": True}
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> "ServerTool":
        raise ValueError(f"server tools ('{self.type}') are not supported by this server; define client tools "
                         "with name, description and input_schema")


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "Custom" if kind in (None, "custom") else "Server"


Tool = Annotated[Union[Annotated[CustomTool, Tag("Custom")], Annotated[ServerTool, Tag("Server")]],
                 Discriminator(_tool_tag)]


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None

    @model_validator(mode="after")
    def _named(self) -> "ToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('"name" is required with type "tool" and only there')
        return self


class Thinking(Body):
    type: str
    budget_tokens: Optional[int] = None
    display: Optional[str] = None


class OutputConfig(Body):
    effort: Optional[str] = None
    format: Optional[Object] = None


class CountTokensRequest(Body):
    """POST /v1/messages/count_tokens: what the prompt would be."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: Union[str, list[TextBlock], None] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None
    cache_control: Optional[Object] = None
    speed: Optional[str] = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    stream: Optional[bool] = None
    metadata: Optional[Object] = None
    service_tier: Optional[str] = None
    container: Union[str, Object, None] = None
    diagnostics: Optional[Object] = None
    inference_geo: Optional[str] = None
    user_profile_id: Optional[str] = None
    workspace_id: Optional[str] = None
