"""llama-server's `timings` block, which its /completion replies and OpenAI-shaped ones both carry."""

from __future__ import annotations

from ...engine import Finished


def timings_json(f: Finished) -> dict:
    """llama-server's `timings` block (prompt_n counts the tokens actually prefilled); draft_n and
    draft_n_accepted only when the request drafted, as llama-server's; context_shifts and discarded_n
    (ours) only when its KV was shifted."""
    t, u = f.timings, f.usage
    prompt_n = u.prompt_tokens - u.cached_tokens
    drafts = {"draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted} if t.draft_n else {}
    if t.context_shifts:  # ours (--context-shift): llama-server says only `truncated`
        drafts |= {"context_shifts": t.context_shifts, "discarded_n": t.discarded_tokens}
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": t.prefill_ms,
        "prompt_per_token_ms": t.prefill_ms / prompt_n if prompt_n else 0.0, "prompt_per_second": t.prompt_tps,
        "predicted_n": u.completion_tokens, "predicted_ms": t.decode_ms,
        "predicted_per_token_ms": t.decode_ms / u.completion_tokens if u.completion_tokens else 0.0,
        "predicted_per_second": t.decode_tps,
        **drafts,
    }
