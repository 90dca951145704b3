"""Chat messages -> prompt token ids, with the boundary the prompt cache snapshots at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import RequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    ids: tuple[int, ...]
    # Token length of the conversation so far without the generation prompt; the next
    # turn's prompt starts with exactly these tokens. None when that prefix does not hold.
    history_boundary: Optional[int]


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(f"messages[{index}].content parts must be {{'type': 'text', 'text': str}}", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
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


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: Optional[list] = None) -> str:
    if not getattr(tokenizer, "chat_template", None):
        # No template in the model: a plain "role: content" transcript.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")
    from jinja2 import TemplateError

    try:
        extra = {"tools": tools} if tools else {}  # mlxcel_py.tool_calls decides when the template gets tools
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
    except TemplateError as exc:
        raise RequestError(f"the model's chat template rejected the messages: {exc}", param="messages") from None


def _encode_rendered(tokenizer, text: str) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    # Templates usually emit BOS themselves; add it only when the model wants one and it is absent.
    if bos is not None and getattr(tokenizer, "add_bos_token", False) and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def encode_chat(
    tokenizer, messages: list[dict], add_generation_prompt: bool = True, tools: Optional[list] = None,
    before_tokenize: Optional[Callable[[str], None]] = None,
) -> ChatPrompt:
    """Render `messages` (and OpenAI `tools`, for templates that take them) and tokenize them.

    `before_tokenize(text)` sees the rendered prompt first and may refuse it (raise) before
    the costly tokenization of a huge text. Tool calls and results in `messages` are turned
    into what the template renders by `tool_calls.tool_messages` first."""
    clean = validate_messages(messages)
    text = _render(tokenizer, clean, add_generation_prompt, tools)
    if before_tokenize is not None:
        before_tokenize(text)
    ids = _encode_rendered(tokenizer, text)
    history = _encode_rendered(tokenizer, _render(tokenizer, clean, False, tools))
    strict_prefix = len(history) < len(ids) and ids[: len(history)] == history
    return ChatPrompt(tuple(ids), len(history) if strict_prefix else None)


def render_chat(tokenizer, messages: list[dict], tools: Optional[list] = None) -> str:
    """The prompt text `messages` render to, with the generation prompt (llama-server's /apply-template)."""
    return _render(tokenizer, validate_messages(messages), True, tools)


def encode_text(tokenizer, text: str, add_special_tokens: bool = True) -> tuple[int, ...]:
    """Tokenize raw text; with add_special_tokens the model's BOS is prepended when it wants one."""
    if not isinstance(text, str):
        raise RequestError("prompt must be a string", param="prompt")
    return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))
