"""Fill-in-the-middle prompts for every dialect that takes one: llama-server's /infill, OpenAI's
/v1/completions `suffix` and Ollama's /api/generate `suffix`. The layout is llama-server's (models/fim.py),
sized as it sizes it: the prefix and suffix to one batch (-b, 2048 by default), extra chunks to the rest of a
slot's context less twice the server's -n. A model without FIM tokens is a 400."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import FieldError
from ...models.fim import DEFAULT_BATCH, FimTokens, infill_ids
from ...models.vocab import hf_tokenizer, plain_encoder
from .prompt import check_token_ids

if TYPE_CHECKING:
    from ..runtime import Runtime


def fim_tokens(rt: "Runtime", param: str) -> FimTokens:
    """The model's FIM tokens, or the 400 saying which are missing."""
    fim = rt.loaded.fim
    if fim.missing:
        raise FieldError(f"infill is not supported by {rt.model_id}: its vocabulary has no fill-in-the-middle "
                         f"tokens ({', '.join(fim.missing)}); use a code model with FIM tokens "
                         "(Qwen2.5-Coder, CodeGemma, StarCoder, CodeLlama, ...)", param=param)
    return fim


def server_budget(rt: "Runtime") -> tuple[int, int]:
    """(n_batch, n_predict) as llama-server sizes an infill: the pinned prefill chunk (-b) else 2048, and the
    server's -n else -1."""
    chunk = getattr(rt.config.chunk, "explicit", None) if rt.config.chunk is not None else None
    flags = getattr(rt.config.flags, "sampling", None)
    n_predict = getattr(flags, "max_tokens", None)
    return chunk or DEFAULT_BATCH, n_predict if n_predict is not None else -1


def fim_prompt(rt: "Runtime", prefix, suffix, extra=(), prompt: str = "", param: str = "input_prefix") -> list[int]:
    """The FIM prompt's ids for this model and server (a 400 when the model has no FIM tokens)."""
    fim = fim_tokens(rt, param)
    loaded = rt.loaded
    n_batch, n_predict = server_budget(rt)
    encode = plain_encoder(hf_tokenizer(loaded.tokenizer))
    follow = list(loaded.tokenizer.encode(prompt, add_special_tokens=False)) if prompt else []
    for name, value in (("input_prefix", prefix), ("input_suffix", suffix)):
        if not isinstance(value, str):
            check_token_ids([p for p in value if isinstance(p, int)], rt.vocab_size, name)
    rt.prompt_limit.check_chars(sum(len(t) for t in (prefix, suffix, prompt) if isinstance(t, str))
                                + sum(len(text) for _, text in extra), param)
    return infill_ids(fim, encode, prefix, suffix, extra, follow, bos=loaded.bos_token_id if loaded.add_bos else None,
                      n_batch=n_batch, n_predict=n_predict, n_ctx=rt.prompt_limit.slot_context,
                      spm=bool(getattr(rt.config.server, "spm_infill", False)))
