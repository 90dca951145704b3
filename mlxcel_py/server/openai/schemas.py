"""OpenAI's request bodies: /v1/chat/completions and /v1/completions, every field with its real
JSON type (a wrong type is a 400 naming the field); these models are also what /openapi.json
publishes. Field list: openai-python 3.57 (`types/chat/completion_create_params.py`,
`types/completion_create_params.py`); what each field does here: fields.py and docs/SERVER.md.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field

from ..generation.schemas import Body, ChatMessage, GenerationRequest, Object, by_type


# -- tools (generation/structured.py validates them) ---------------------------------------------
class FunctionDefinition(Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[Object] = None
    strict: Optional[bool] = None


class FunctionTool(Body):
    type: Literal["function"]
    function: FunctionDefinition


class CustomTool(Body):
    type: Literal["custom"]
    custom: Object


Tool = by_type(FunctionTool, CustomTool)


class FunctionName(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: FunctionName


class AllowedToolsChoice(Body):
    type: Literal["allowed_tools"]
    allowed_tools: Object


class CustomToolChoice(Body):
    type: Literal["custom"]
    custom: Object


ToolChoice = Union[Literal["none", "auto", "required"], by_type(NamedToolChoice, AllowedToolsChoice, CustomToolChoice)]


class ChatRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[FunctionDefinition]] = None
    function_call: Union[Literal["none", "auto"], FunctionName, None] = None
    modalities: Optional[list[Literal["text", "audio"]]] = None
    audio: Optional[Object] = None
    prediction: Optional[Object] = None
    web_search_options: Optional[Object] = None
    reasoning_effort: Optional[str] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None
    moderation: Optional[Object] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    # the chat template's (llama-server's and vLLM's): generation/template.py
    chat_template_kwargs: Optional[Object] = None
    add_generation_prompt: Optional[bool] = None
    continue_final_message: Optional[bool] = None
    reasoning_format: Optional[str] = None  # llama-server's: this request's --reasoning-format
    thinking_budget_tokens: Optional[int] = None  # llama-server's: this request's --reasoning-budget
    prompt_cache_retention: Optional[str] = None
    prompt_cache_options: Optional[Object] = None


TokenIds = list[int]
Prompt = Union[str, list[str], TokenIds, list[TokenIds]]


class CompletionRequest(GenerationRequest):
    prompt: Prompt  # one prompt per request: a string, [string], token ids or [token ids]
    logprobs: Optional[int] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None
