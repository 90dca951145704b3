"""Not a test module: a batch-1 decode loop over our sampler, the runner's loop in small."""

from __future__ import annotations


def generate(lm, prompt_ids, sampler, compiler, max_tokens: int) -> str:
    """Decode with an mlx-lm prompt cache and our sampler until EOS; fails without EOS."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel_py.engine.runner.sampling import sample_step

    cache = make_prompt_cache(lm.model)
    logits, out = lm.model(mx.array([list(prompt_ids)]), cache=cache)[:, -1, :], []
    for _ in range(max_tokens):
        (token,) = sample_step(logits, [sampler], compiler)
        if token.token_id in lm.eos_token_ids:
            return lm.tokenizer.decode(out)
        out.append(token.token_id)
        logits = lm.model(mx.array([[token.token_id]]), cache=cache)[:, -1, :]
    raise AssertionError(f"no EOS in {max_tokens} tokens: {lm.tokenizer.decode(out)!r}")
