"""A prompt's token ids and the limits they must fit, for every dialect: a prompt that certainly
cannot fit a slot is refused from its length in characters, before tokenizing.

Everything here blocks (tokenizing) and runs off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ...errors import FieldError, PromptTooLongError
from ...models import encode_text
from ...models.vocab import backend_tokenizer

if TYPE_CHECKING:
    from ..runtime import Runtime


@dataclass(frozen=True, slots=True)
class PromptLimit:
    """What a prompt must fit: a slot's context, and how many characters one token can cover."""

    slot_context: int
    chars_per_token: int  # no token stands for more characters than this

    def check_chars(self, num_chars: int, param: str) -> None:
        at_least = -(-num_chars // self.chars_per_token)
        if at_least >= self.slot_context:
            raise PromptTooLongError(
                f"the prompt has at least {at_least} tokens ({num_chars} characters, at most "
                f"{self.chars_per_token} per token), but a slot's context holds {self.slot_context}; "
                "shorten it or raise --ctx-size",
                n_prompt_tokens=at_least, n_ctx=self.slot_context, param=param,
            )


def content_chars(messages: list[dict]) -> int:
    """The characters of chat messages' text: string contents and the text of content parts."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return total


def max_token_chars(tokenizer: Any, vocab_size: int) -> int:
    """The most characters any single token decodes to, plus one for a leading space that
    a SentencePiece decoder strips from a lone token."""
    fast = backend_tokenizer(tokenizer)
    ids = [[i] for i in range(vocab_size)]
    if fast is not None:
        texts = fast.decode_batch(ids, skip_special_tokens=False)
    else:
        texts = [tokenizer.decode(i) for i in ids]
    return max(map(len, texts), default=1) + 1


def completion_prompt_ids(prompt: Any, rt: "Runtime") -> tuple[int, ...]:
    """A completions `prompt` (string, [string], token ids or [token ids]) -> token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise FieldError("prompt must not be empty", param="prompt")
        rt.prompt_limit.check_chars(len(prompt), "prompt")
        return encode_text(rt.loaded.tokenizer, prompt)
    if not prompt:
        raise FieldError("prompt must not be empty", param="prompt")
    if all(type(t) is int for t in prompt):
        check_token_ids(prompt, rt.vocab_size, "prompt")
        return tuple(prompt)
    raise FieldError("only one prompt per request is supported", param="prompt")


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Every id must be in the vocabulary; a 400 naming `param` and the first one that is not."""
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise FieldError(f"{param}[{i}] = {t} is not a token id (the vocabulary has {vocab_size})", param=param)
