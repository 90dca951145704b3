"""--cache-type-k / --cache-type-v: the typed and quantized caches of engine/runner/kv.py."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, make_prompt_cache

from mlxcel_py.config import KV_CACHE_TYPES, resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.runner import kv
from mlxcel_py.engine.runner.model_runner import ModelRunner
from mlxcel_py.errors import ConfigError

from config_helpers import flags_for
from kv_models import loaded32, model32, prompt, run_engine
from tiny import tiny_model


def greedy(n):
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)


def engine_for(loaded, **kw):
    return build_engine(resolve("serve", flags_for("serve", **kw), env={}).engine, loaded)


def reference(model, ids, n, bits=0):
    """Greedy decoding through mlx-lm's own caches: KVCache, or QuantizedKVCache(group 32)."""
    cache = [QuantizedKVCache(group_size=32, bits=bits) for _ in model.layers] if bits else make_prompt_cache(model)
    logits = model(mx.array([list(ids)]), cache=cache)
    out = []
    for _ in range(n):
        out.append(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[out[-1]]]), cache=cache)
    return out


def test_the_config_names_are_the_kv_module_ones():
    assert KV_CACHE_TYPES == kv.KV_TYPES


@pytest.mark.parametrize("name, expected", [("f32", 512), ("f16", 256), ("bf16", 256), ("q8_0", 160), ("q4_0", 96)])
def test_bytes_per_token(name, expected):
    # 2 layers x 1 KV head x dim 32, K and V; q8_0: 1 byte + a float32 scale and bias per 32 values.
    layout = kv.resolve_layout(model32(), name, name)
    assert kv.bytes_per_token(model32(), layout) == expected
    cache = kv.make_cache(model32(), layout)
    model32()(mx.array([list(range(5, 261))]), cache=cache)  # 256 positions: exactly one step of capacity
    assert sum(c.nbytes for c in cache) == 256 * expected


def test_the_model_dtype_keeps_mlx_lm_caches_and_the_cpu_decode_step():
    lm = tiny_model()
    layout = kv.resolve_layout(lm.model, "f32", "f32")
    assert layout.native and type(kv.make_cache(lm.model, layout)[0]) is KVCache
    engine = engine_for(lm, cache_type_k="f32", cache_type_v="f32")
    assert engine.runner._fast_decode is lm.cpu_decode is not None
    assert engine_for(lm, cache_type_k="f16").runner._fast_decode is None  # it writes float32 in place


@pytest.mark.parametrize("bits, name", [(8, "q8_0"), (4, "q4_0")])
def test_a_quantized_row_decodes_as_mlx_lm_quantized_cache(bits, name):
    runner = ModelRunner(model32(), kv=kv.resolve_layout(model32(), name, name))
    p = prompt(40, 1)
    out = run_steps(runner, {1: p}, 12)[1]
    assert out == reference(model32(), p, 12, bits)


def run_steps(runner, prompts, n):
    """Prefill each prompt in turn, three decode steps apart, and decode all to `n` tokens (retiring each)."""
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Retire, Step

    out, retired = {}, set()

    def decode(steps):
        for _ in range(steps):
            finished = tuple(Retire(s) for s in out if len(out[s]) >= n and s not in retired)
            retired.update(r.seq_id for r in finished)
            rows = tuple(s for s in out if len(out[s]) < n)
            if not rows:
                runner.execute(Step(retire=finished))
                return
            for s, t in zip(rows, runner.execute(Step(retire=finished, decode=rows)).decoded):
                out[s].append(t)

    for sid, p in prompts.items():
        first = runner.execute(Step(prefill=PrefillPiece(sid, 0, p, 512, True, None, BeginSequence(greedy(n), ()))))
        out[sid] = [first.first_token]
        decode(3)
    decode(10 * n)
    return out


@pytest.mark.parametrize("name", ["f16", "bf16", "q8_0", "q4_0"])
def test_batched_equals_each_sequence_alone(name):
    layout = kv.resolve_layout(model32(), name, name)
    prompts = {1: prompt(40, 1), 2: prompt(9, 2), 3: prompt(70, 3)}
    together = run_steps(ModelRunner(model32(), kv=layout), prompts, 14)
    for sid, p in prompts.items():
        assert together[sid] == run_steps(ModelRunner(model32(), kv=layout), {sid: p}, 14)[sid], sid


@pytest.mark.parametrize("name", ["f16", "q8_0"])
def test_engine_cache_hit_equals_miss_and_drafts_change_nothing(name):
    p = prompt(120, 5)
    requests = lambda tag: [Request(f"{tag}{i}", p + prompt(6, i), greedy(16)) for i in range(3)]  # noqa: E731
    cold = run_engine(engine_for(loaded32(), parallel=1, prompt_cache=False, cache_type_k=name,
                                 cache_type_v=name), requests("r"))
    warm_engine = engine_for(loaded32(), parallel=2, cache_min_prefix=8, cache_type_k=name, cache_type_v=name)
    warm = run_engine(warm_engine, requests("r"))
    assert warm == cold and warm_engine.stats().num_cached_prompt_tokens > 0
    drafted = run_engine(engine_for(loaded32(), parallel=2, lookup_ngram=2, cache_type_k=name, cache_type_v=name),
                         [Request("d", p * 2, greedy(24))])
    plain = run_engine(engine_for(loaded32(), parallel=2, cache_type_k=name, cache_type_v=name),
                       [Request("d", p * 2, greedy(24))])
    assert drafted == plain


def test_k_and_v_may_differ_in_float_types():
    layout = kv.resolve_layout(model32(), "f16", "f32")
    assert (layout.k.name, layout.v.name, kv.bytes_per_token(model32(), layout)) == ("f16", "f32", 384)
    prompts = {1: prompt(30, 7), 2: prompt(50, 8)}
    together = run_steps(ModelRunner(model32(), kv=layout), prompts, 10)
    assert together[2] == run_steps(ModelRunner(model32(), kv=layout), {2: prompts[2]}, 10)[2]


@pytest.mark.parametrize("k, v, message", [
    ("q8_0", "f16", "--cache-type-k q8_0 with --cache-type-v f16: quantized KV needs K and V in the same quantized type"),
    ("q8_0", "q4_0", "--cache-type-k q8_0 with --cache-type-v q4_0: quantized KV needs K and V"),
    ("f16", "q4_0", "--cache-type-k f16 with --cache-type-v q4_0: quantized KV needs K and V"),
])
def test_mixed_quantized_types_are_refused(k, v, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        kv.resolve_layout(model32(), k, v)


def test_quantized_kv_needs_a_head_dim_multiple_of_the_group():
    with pytest.raises(ConfigError, match="--cache-type-k q8_0: this model's head dim 16 is not a multiple of the "
                                          "quantization group 32"):
        engine_for(tiny_model(), cache_type_k="q8_0", cache_type_v="q8_0")


def test_the_decode_batch_of_a_typed_cache_is_its_own_class():
    layout = kv.resolve_layout(model32(), "q8_0", "q8_0")
    runner = ModelRunner(model32(), kv=layout)
    from mlxcel_py.engine.core.step import BeginSequence, PrefillPiece, Step

    for sid, p in ((1, prompt(20, 1)), (2, prompt(33, 2))):
        runner.execute(Step(prefill=PrefillPiece(sid, 0, p, 512, True, None, BeginSequence(greedy(3), ()))))
    runner.execute(Step(decode=(2, 1)))
    assert [layer.size() for layer in runner._batch] == [34, 34]
    assert all(type(layer) is kv.QuantizedKVBatch and layer.bits == 8 for layer in runner._batch)
    assert not isinstance(runner._batch[0], BatchKVCache)


def test_the_flags_their_short_names_and_variables_reach_the_config(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import mlxcel_py.server.http.serving as serving
    from mlxcel_py.cli.app import app

    seen = []
    monkeypatch.setattr(serving, "serve_forever", seen.append)
    args = ["serve", "--port", "0", "-ctk", "q8_0", "-ctv", "Q8_0", "-cram", "64", "--slot-save-path", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    eng = seen[0].engine
    assert (eng.kv_type_k, eng.kv_type_v, eng.prompt_cache.max_bytes) == ("q8_0", "q8_0", 64 << 20)
    assert seen[0].server.slot_save_path == str(tmp_path.resolve())
    env = {"LLAMA_ARG_CACHE_TYPE_K": "f16", "LLAMA_ARG_CACHE_TYPE_V": "bf16", "LLAMA_ARG_CACHE_RAM": "-1"}
    cfg = resolve("serve", env=env).engine
    assert (cfg.kv_type_k, cfg.kv_type_v, cfg.prompt_cache.max_bytes) == ("f16", "bf16", 1 << 62)
    assert resolve("serve", env={"LLAMA_ARG_CACHE_RAM": "0"}).engine.prompt_cache.enabled is False
    assert resolve("serve", env={}).engine.prompt_cache.max_bytes == 8192 << 20  # llama-server's default
    bad = CliRunner().invoke(app, ["serve", "--port", "0", "-ctk", "q5_1"])
    assert bad.exit_code == 2 and "--cache-type-k must be one of f32, f16, bf16, q8_0, q4_0 (got 'q5_1')" in bad.stderr


@pytest.mark.parametrize("kw, message", [
    ({"cache_ram": -2}, "--cache-ram must be at least -1 (got -2)"),
    ({"cache_ram": 5, "cache_max_bytes": 3}, "--cache-ram and --cache-max-bytes both cap the prompt cache; give one"),
    ({"env": {"LLAMA_ARG_CACHE_RAM": "lots"}}, "LLAMA_ARG_CACHE_RAM must be an integer number of MiB"),
    ({"env": {"LLAMA_ARG_CACHE_TYPE_V": "q2_k"}}, "LLAMA_ARG_CACHE_TYPE_V must be one of"),
    ({"slot_save_path": "/no/such/dir"}, "--slot-save-path '/no/such/dir' is not a directory"),
])
def test_bad_values_name_their_flag(kw, message):
    env = kw.pop("env", {})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve("serve", flags_for("serve", **kw), env=env)


@pytest.mark.parametrize("name", ["f16", "q8_0"])
def test_the_cpu_prefill_kernels_leave_a_typed_batch_to_mlx_lm(name):
    """With the loader's CPU prefill kernels in scope (the default on a CPU), a ragged decode batch over
    a quantized cache (a boolean mask, (packed, scales, biases) keys) runs mlx-lm's own attention: the
    tokens are those without the kernels."""
    import dataclasses

    with_kernels = dataclasses.replace(loaded32(), cpu_kernels=tiny_model().cpu_kernels)
    assert with_kernels.cpu_kernels is not None
    requests = [Request("a", prompt(70, 1), greedy(8)), Request("b", prompt(9, 2), greedy(8))]
    kw = dict(parallel=2, prompt_cache=False, cache_type_k=name, cache_type_v=name)
    assert run_engine(engine_for(with_kernels, **kw), requests) == run_engine(engine_for(loaded32(), **kw), requests)
