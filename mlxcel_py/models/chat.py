"""Chat messages -> prompt token ids, with the boundary the prompt cache snapshots at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..errors import RequestError
from .chat_template import ChatTemplate, continue_final, render_builtin, render_jinja

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    ids: tuple[int, ...]
    # Token length of the conversation so far without the generation prompt; the next
    # turn's prompt starts with exactly these tokens. None when that prefix does not hold.
    history_boundary: Optional[int]


def _content_text(content: Any, index: int) -> Any:
    """The text of a message; a list with {'type': 'image'} parts (a vision model's prompt, the images
    already taken out by the route) stays a list of text and image parts, as such templates take it."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if part == {"type": "image"}:
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            else:
                raise RequestError(f"messages[{index}].content parts must be {{'type': 'text', 'text': str}}", param="messages")
        if any(p["type"] == "image" for p in parts):
            return parts
        return "\n".join(p["text"] for p in parts)
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts", param="messages")


def validate_messages(messages: Any) -> list[dict]:
    """Check chat messages and flatten list contents to strings; raises RequestError."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    clean = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", param="messages")
        role = msg.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)} (got {role!r})", param="messages")
        calls = _tool_calls(msg) if role == "assistant" else []
        if "content" not in msg and not calls:
            raise RequestError(f"messages[{i}] has no 'content'", param="messages")
        content = msg.get("content")
        text = "" if content is None and calls else _content_text(content, i)
        # OpenAI's "developer" is the system turn of newer models; templates know "system".
        clean.append({**msg, "role": "system" if role == "developer" else role, "content": text})
    return clean


def _tool_calls(msg: dict) -> list:
    calls = msg.get("tool_calls") or []
    if msg.get("function_call"):  # the deprecated single-call form
        calls = [*calls, {"type": "function", "function": msg["function_call"]}]
    return calls


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """A request's template choices: the generation prompt, continuing the final (assistant)
    message instead, and its chat_template_kwargs (merged over the server's)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)


DEFAULT_OPTIONS = ChatOptions()
MODEL_TEMPLATE = ChatTemplate()


def _apply(tokenizer, template: ChatTemplate, messages: list[dict], add: bool, tools: Optional[list],
           kwargs: Mapping[str, Any]) -> str:
    if template.name is not None:
        return render_builtin(template.name, messages, add, {**template.defaults, **kwargs})
    if template.source is None and not getattr(tokenizer, "chat_template", None):
        # No template in the model: a plain "role: content" transcript.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add else "")
    return render_jinja(tokenizer, template, messages, add, tools, kwargs)


def _render(tokenizer, messages: list[dict], add: bool, tools: Optional[list],
            template: ChatTemplate, kwargs: Mapping[str, Any]) -> str:
    try:
        return _apply(tokenizer, template, messages, add, tools, kwargs)
    except Exception as exc:  # noqa: BLE001 - a template is user code: whatever it raises is the input's fault
        if kwargs:
            try:  # the template takes the messages without the request's kwargs: the kwargs are at fault
                _apply(tokenizer, template, messages, add, tools, {})
            except Exception:  # noqa: BLE001
                pass
            else:
                raise RequestError(f"{template.origin} rejected chat_template_kwargs: {exc}",
                                   param="chat_template_kwargs") from None
        raise RequestError(f"{template.origin} rejected the messages: {exc}", param="messages") from None


def render_prompt(tokenizer, messages: list[dict], tools: Optional[list] = None,
                  template: ChatTemplate = MODEL_TEMPLATE, options: ChatOptions = DEFAULT_OPTIONS,
                  with_prompt: bool = True) -> str:
    """The prompt text of validated `messages`; `with_prompt=False`: the history alone (no
    generation prompt, the final message closed), as the next turn's prompt starts."""
    if not with_prompt:
        return _render(tokenizer, messages, False, tools, template, options.kwargs)
    if options.continue_final_message:
        text = _render(tokenizer, messages, False, tools, template, options.kwargs)
        return continue_final(text, messages)
    return _render(tokenizer, messages, options.add_generation_prompt, tools, template, options.kwargs)


def _encode_rendered(tokenizer, text: str) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    # Templates usually emit BOS themselves; add it only when the model wants one and it is absent.
    if bos is not None and getattr(tokenizer, "add_bos_token", False) and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def encode_chat(
    tokenizer, messages: list[dict], tools: Optional[list] = None,
    before_tokenize: Optional[Callable[[str], None]] = None,
    template: ChatTemplate = MODEL_TEMPLATE, options: ChatOptions = DEFAULT_OPTIONS,
) -> ChatPrompt:
    """Render `messages` (and OpenAI `tools`, for templates that take them) with `template` and
    tokenize them.

    `before_tokenize(text)` sees the rendered prompt first and may refuse it (raise) before
    the costly tokenization of a huge text. Tool calls and results in `messages` are turned
    into what the template renders by `tool_calls.tool_messages` first."""
    clean = validate_messages(messages)
    text = render_prompt(tokenizer, clean, tools, template, options)
    if before_tokenize is not None:
        before_tokenize(text)
    ids = _encode_rendered(tokenizer, text)
    history = _encode_rendered(tokenizer, render_prompt(tokenizer, clean, tools, template, options, False))
    strict_prefix = len(history) < len(ids) and ids[: len(history)] == history
    return ChatPrompt(tuple(ids), len(history) if strict_prefix else None)


def render_chat(tokenizer, messages: list[dict], tools: Optional[list] = None,
                template: ChatTemplate = MODEL_TEMPLATE, options: ChatOptions = DEFAULT_OPTIONS) -> str:
    """The prompt text `messages` render to (llama-server's /apply-template)."""
    return render_prompt(tokenizer, validate_messages(messages), tools, template, options)


def encode_text(tokenizer, text: str, add_special_tokens: bool = True) -> tuple[int, ...]:
    """Tokenize raw text; with add_special_tokens the model's BOS is prepended when it wants one."""
    if not isinstance(text, str):
        raise RequestError("prompt must be a string", param="prompt")
    return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))
