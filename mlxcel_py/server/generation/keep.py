"""llama-server's context-shift fields, `n_keep` and `n_discard`, for every route that takes
them (/completion and the OpenAI routes, as llama-server): the engine Request's fields. The
other dialects have no such fields and get the defaults (a shift keeps the prompt's BOS).

They apply only to a server started with --context-shift; elsewhere a value other than the
default 0 is a 400 naming the field (nothing would be kept or discarded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ...errors import FieldError
from ...models.vocab import hf_tokenizer

if TYPE_CHECKING:
    from ..runtime import Runtime


def _bos(tokenizer: Any, ids: tuple[int, ...]) -> int:
    """1 when the prompt starts with the model's BOS (llama-server's n_keep does not count it)."""
    bos = getattr(hf_tokenizer(tokenizer), "bos_token_id", None)
    return 1 if bos is not None and ids and ids[0] == bos else 0


def shift_field(shift: Optional[bool], rt: "Runtime") -> dict:
    """Ollama's `shift`: false ends this reply at its slot's end; true needs --context-shift."""
    if shift is True and not rt.config.engine.context_shift:
        raise FieldError("shift true needs the server started with --context-shift (here a reply ends at its "
                         "slot's end: done_reason \"length\")", param="shift", code="unsupported_parameter")
    return {"context_shift": False} if shift is False else {}


def keep_fields(req: Any, rt: "Runtime", ids: tuple[int, ...]) -> dict:
    """The engine Request's n_keep / n_discard for a body with llama-server's n_keep and n_discard."""
    n_keep: Optional[int] = getattr(req, "n_keep", None)
    n_discard: Optional[int] = getattr(req, "n_discard", None)
    if not rt.config.engine.context_shift:
        for name, value in (("n_keep", n_keep), ("n_discard", n_discard)):
            if value not in (None, 0):
                raise FieldError(f"{name} applies to a context shift, and this server runs without "
                                 "--context-shift (a reply that fills its slot ends with 'length')",
                                 param=name, code="unsupported_parameter")
        return {}
    if n_keep is not None and n_keep < -1:
        raise FieldError(f"n_keep must be -1 (the whole prompt), 0 or positive (got {n_keep})", param="n_keep")
    if n_discard is not None and n_discard < 0:
        raise FieldError(f"n_discard must be 0 (half of what follows n_keep) or positive (got {n_discard})",
                         param="n_discard")
    keep = -1 if n_keep == -1 else (n_keep or 0) + _bos(rt.loaded.tokenizer, ids)
    return {"n_keep": keep, "n_discard": n_discard or 0}
