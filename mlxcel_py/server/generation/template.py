"""A request's chat-template fields, for every dialect that renders chat: `add_generation_prompt`,
`continue_final_message` and `chat_template_kwargs` (merged over --chat-template-kwargs)."""

from __future__ import annotations

from typing import Any, Optional

from ...errors import FieldError
from ...models.chat import DEFAULT_OPTIONS, ChatOptions
from ...models.chat_template import check_kwargs

# vLLM's check and words: llama-server has no continue_final_message (it continues a trailing
# assistant turn by itself).
BOTH = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."


def chat_options(add_generation_prompt: Optional[bool], continue_final_message: Optional[bool],
                 kwargs: Optional[dict[str, Any]]) -> ChatOptions:
    """The request's template choices (None = not given); a FieldError naming the field at fault."""
    if add_generation_prompt is None and continue_final_message is None and kwargs is None:
        return DEFAULT_OPTIONS
    cont = bool(continue_final_message)
    if cont and add_generation_prompt:  # both given true; continuing alone implies no generation prompt
        raise FieldError(BOTH, param="continue_final_message")
    add = not cont if add_generation_prompt is None else add_generation_prompt
    try:
        checked = check_kwargs(kwargs, "chat_template_kwargs") if kwargs is not None else {}
    except ValueError as exc:
        raise FieldError(str(exc), param="chat_template_kwargs") from None
    return ChatOptions(add, cont, checked)


def without_thinking(options: ChatOptions) -> ChatOptions:
    """`options` with the template's thinking switched off (`enable_thinking: false`)."""
    return ChatOptions(options.add_generation_prompt, options.continue_final_message,
                       {**options.kwargs, "enable_thinking": False})
