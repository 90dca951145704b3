"""Context shift on the tiny model: a reply runs past its slot and keeps generating, token-exact
with a fresh prefill of the shifted token list (the "prefill" mode), batched as alone; the
"rotate" mode's keys match a fresh prefill's at the first layer (its logits differ: measured)."""

import dataclasses

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Shift, Step
from mlxcel_py.engine.runner.model_runner import ModelRunner

from test_speculative import run  # run requests to completion: (tokens, Finished) per id
from config_helpers import flags_for
from tiny import tiny_model

CTX = 64


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


def prompt(n, start=5):
    return tuple(start + (i * 7) % 290 for i in range(n))


def engine_for(lm, parallel=1, mode="prefill", **kw):
    cfg = resolve("serve", flags_for("serve", parallel=parallel, ctx_size=CTX * parallel, context_shift=True, **kw),
                  env={})
    engine = build_engine(cfg.engine, lm)
    engine.runner.shift_mode = mode
    return engine


def greedy(rid, ids, n, **kw):
    return Request(rid, ids, SamplingParams(max_tokens=n, ignore_eos=True), **kw)


def reference(model, ids, n, n_keep=0):
    """Greedy decoding that, at every shift, prefills the shifted token list afresh (llama-server's plan)."""
    kv, out = list(ids), []
    logits = model(mx.array([kv]))[0, -1]
    for _ in range(n):
        out.append(mx.argmax(logits).item())
        if len(out) == n:
            break
        if len(kv) + 1 >= CTX:
            keep = len(ids) if n_keep < 0 else n_keep
            keep = min(keep, CTX - 4)
            discard = min((len(kv) - keep) // 2, len(kv) - keep - 1)
            kv = kv[:keep] + kv[keep + discard:]
        kv.append(out[-1])
        logits = model(mx.array([kv]))[0, -1]
    return out


@pytest.mark.parametrize("n_keep", [0, 5, -1])
def test_a_reply_past_the_context_keeps_generating_token_exact(lm, n_keep):
    ids = prompt(40)
    (tokens, done), = run(engine_for(lm), [greedy("a", ids, 100, n_keep=n_keep)]).values()
    assert done.finish_reason == "length" and len(tokens) == 100
    assert done.timings.context_shifts >= 2
    assert tokens == reference(lm.model, ids, 100, n_keep)


def test_batched_is_alone(lm):
    requests = [greedy("a", prompt(40), 80), greedy("b", prompt(9, 11), 70, n_keep=3), greedy("c", prompt(20, 3), 12)]
    together = run(engine_for(lm, parallel=3), requests)
    for r in requests:
        assert together[r.request_id][0] == run(engine_for(lm), [r])[r.request_id][0], r.request_id
    assert together["a"][1].timings.context_shifts > 0 and together["c"][1].timings.context_shifts == 0


def _shifted_runner(lm, mode, ids, n_keep, n_discard, kv_rows=False):
    """A runner with one row of `ids` in its decode batch, shifted; the batch's row and the kept tokens."""
    runner = ModelRunner(lm.model, decode=lm.cpu_decode, kv_rows=kv_rows)
    runner.shift_mode = mode
    begin = BeginSequence(SamplingParams(), ())
    runner.execute(Step(prefill=PrefillPiece(1, 0, ids, len(ids), True, None, begin)))
    kept = ids[:n_keep] + ids[n_keep + n_discard:]
    runner.execute(Step(shift=(Shift(1, n_keep, n_discard, kept),)))
    return runner, kept


@pytest.mark.parametrize("kv_rows", [False, True])  # mlx-lm's BatchKVCache, the engine's own rows
@pytest.mark.parametrize("mode", ["prefill", "rotate"])
def test_the_shifted_row_against_a_fresh_prefill(lm, mode, kv_rows):
    ids, last = prompt(40), 17
    runner, kept = _shifted_runner(lm, mode, ids, 4, 18, kv_rows)
    fresh = make_prompt_cache(lm.model)
    want = lm.model(mx.array([kept + (last,)]), cache=fresh)[0, -1]
    row = runner._batch.extract(0, len(kept)) if kv_rows else runner._batch
    got = lm.model(mx.array([[last]]), cache=row)[0, -1]
    error = mx.abs(got - want).max().item()
    layer0 = row[0] if kv_rows else runner._batch[0].extract(0)
    key_error = mx.abs(layer0.keys[..., : len(kept), :] - fresh[0].keys[..., : len(kept), :]).max().item()
    assert key_error < 1e-5  # the first layer's keys depend on token and position only
    if mode == "prefill":
        assert error < 1e-4
    else:  # deeper layers still carry the dropped tokens' contribution
        assert error > 1e-3


@pytest.mark.parametrize("arch", ["qwen3", "qwen2yarn", "phi3long", "mistral", "gemma3"])
def test_other_architectures_shift_token_exact(arch):
    from gguf_fixtures import ARCH_FILES, fixture_model

    model = fixture_model(ARCH_FILES[arch])
    ids = prompt(40)
    (tokens, done), = run(engine_for(model), [greedy("a", ids, 60, n_keep=3)]).values()
    assert done.timings.context_shifts >= 1
    assert tokens == reference(model.model, ids, 60, 3)


class _Windowed:
    """A model whose cache has a sliding-window layer (mlx-lm's gemma3 directories)."""

    def make_cache(self):
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        return [KVCache(), RotatingKVCache(max_size=8)]


def test_sliding_window_layers_refuse_context_shift_at_startup():
    from mlxcel_py.engine.lifecycle import _context_shift
    from mlxcel_py.errors import ConfigError

    runner = ModelRunner(_Windowed())
    cfg = resolve("serve", flags_for("serve", parallel=1, ctx_size=CTX, context_shift=True), env={}).engine
    with pytest.raises(ConfigError, match=r"--context-shift is not available for this model: its RotatingKVCache"):
        _context_shift(cfg, runner)
    assert _context_shift(dataclasses.replace(cfg, context_shift=False), runner) is False


def test_a_runner_that_cannot_shift_is_refused():
    from mlxcel_py.engine.core.step import Runner
    from mlxcel_py.engine.lifecycle import _context_shift
    from mlxcel_py.errors import ConfigError

    class Remote(Runner):
        pass

    cfg = resolve("serve", flags_for("serve", parallel=1, ctx_size=CTX, context_shift=True), env={}).engine
    with pytest.raises(ConfigError, match="Remote does not shift the KV cache"):
        _context_shift(cfg, Remote())


def test_drafting_rows_shift_token_exact(lm):
    ids = prompt(12) * 3  # a repeating prompt: prompt lookup drafts from it
    (plain, _), = run(engine_for(lm), [greedy("a", ids, 80)]).values()
    (drafted, done), = run(engine_for(lm, lookup_ngram=2, draft_max=8), [greedy("a", ids, 80)]).values()
    assert drafted == plain and done.timings.context_shifts >= 2 and done.timings.draft_n > 0


@pytest.mark.parametrize("parallel", [1, 3])
def test_draft_model_rows_shift_token_exact(lm, parallel):
    # The tiny model drafting for itself: its own row is rebuilt at each shift, so its drafts stay
    # the target's own tokens (all accepted), and the output is plain decoding's, alone and batched.
    requests = [greedy(rid, prompt(30, start), 90) for rid, start in (("a", 5), ("b", 50), ("c", 90))][:parallel]
    plain = run(engine_for(lm, parallel), requests)
    cfg = resolve("serve", flags_for("serve", parallel=parallel, ctx_size=CTX * parallel, context_shift=True,
                                     draft_max=4), env={})
    drafted = run(build_engine(cfg.engine, lm, draft=lm), requests)
    for rid, (tokens, done) in drafted.items():
        assert tokens == plain[rid][0], rid
        assert done.timings.context_shifts >= 2, rid
        assert done.timings.draft_n > 0 and done.timings.draft_n_accepted == done.timings.draft_n, rid


def test_a_kv_type_other_than_the_models_refuses_context_shift_at_startup(lm):
    from mlxcel_py.errors import ConfigError

    cfg = resolve("serve", flags_for("serve", parallel=1, ctx_size=CTX, context_shift=True, cache_type_k="f16",
                                     cache_type_v="f16"), env={})
    with pytest.raises(ConfigError, match="--context-shift is not available for this model: the KV is stored as K f16"):
        build_engine(cfg.engine, lm)
