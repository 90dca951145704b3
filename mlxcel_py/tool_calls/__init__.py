"""OpenAI tool calls: validate `tools`/`tool_choice`/`parallel_tool_calls`, render them for the
model's chat template, force a valid call with a grammar, and parse (or stream) the calls.

Typical use (see docs/STRUCTURED_OUTPUT.md):
    request = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    fmt = tool_format(tokenizer)
    messages, tools = tool_messages(messages, request, fmt)
    prompt = encode_chat(tokenizer, messages, tools=tools)
    constraint = call_constraint(request, fmt)          # SamplingParams(constraint=...)
    stream = ToolCallStream(fmt, request.as_openai(), request.parallel)
    deltas = stream.feed(text) ... + stream.finish(cut);  stream.called -> finish_reason "tool_calls"
    arguments_object(call.arguments)                    # a call's input as an object, even cut short
"""

from .parse import ToolCall, ToolCallStream, new_call_id
from .partial import arguments_object, complete_json
from .render import FALLBACK_PROMPT, ToolFormat, call_constraint, tool_format, tool_messages
from .request import ToolCallError, ToolRequest, call_schema, lazy_tool_constraint, tool_constraint, tool_request

__all__ = [
    "FALLBACK_PROMPT", "ToolCall", "ToolCallError", "ToolCallStream", "ToolFormat", "ToolRequest",
    "arguments_object", "call_constraint", "call_schema", "complete_json", "lazy_tool_constraint", "new_call_id",
    "tool_constraint", "tool_format", "tool_messages", "tool_request",
]
