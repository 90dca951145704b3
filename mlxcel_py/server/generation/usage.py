"""llama-server's `timings` block, which its /completion replies and OpenAI-shaped ones both carry."""

from __future__ import annotations

from ...engine import Finished


def timings_json(f: Finished) -> dict:
    """llama-server's `timings` block (prompt_n counts the tokens actually prefilled)."""
    t, u = f.timings, f.usage
    prompt_n = u.prompt_tokens - u.cached_tokens
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": t.prefill_ms,
        "prompt_per_token_ms": t.prefill_ms / prompt_n if prompt_n else 0.0, "prompt_per_second": t.prompt_tps,
        "predicted_n": u.completion_tokens, "predicted_ms": t.decode_ms,
        "predicted_per_token_ms": t.decode_ms / u.completion_tokens if u.completion_tokens else 0.0,
        "predicted_per_second": t.decode_tps,
    }
