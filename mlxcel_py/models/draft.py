"""Loading a draft model for speculative decoding (`--draft-model`): any model we load, provided
its tokenizer maps every token to the same id as the target's (the verify compares ids)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..errors import ModelLoadError
from .loader import load_model
from .types import LoadedModel


def _vocab(tokenizer: Any) -> Optional[dict[str, int]]:
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    get = getattr(inner, "get_vocab", None)
    return get() if callable(get) else None


def check_draft(target: LoadedModel, draft: LoadedModel) -> None:
    """ModelLoadError unless `draft` shares the target's vocabulary, token for token."""
    ours, theirs = _vocab(target.tokenizer), _vocab(draft.tokenizer)
    if ours is None or theirs is None:
        raise ModelLoadError(f"--draft-model {draft.name}: its vocabulary cannot be compared with the target's")
    if ours != theirs:
        differ = sum(1 for token, i in ours.items() if theirs.get(token) != i) + len(theirs.keys() - ours.keys())
        raise ModelLoadError(f"--draft-model {draft.name} has another vocabulary than {target.name} "
                             f"({len(theirs)} vs {len(ours)} tokens, {differ} differ): drafts would be other tokens")


def load_draft(path: str, target: LoadedModel, *, on_progress: Callable[[str], None] = lambda _: None,
               threads: Optional[int] = None, cpu_weights: Optional[str] = None) -> LoadedModel:
    """Load `path` as the draft model of `target`; ModelLoadError when it cannot draft for it."""
    on_progress(f"Loading the draft model {path}...")
    draft = load_model(path, on_progress=on_progress, threads=threads, cpu_weights=cpu_weights)
    check_draft(target, draft)
    return draft
