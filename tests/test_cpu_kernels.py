"""The numpy prefill kernels equal MLX's own, and the BLAS kernel choice follows the CPU flags."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcel_py.models.cpu.blas import coretype_for, narrower_coretype
from mlxcel_py.models.cpu.decode_kernels import silu_mul_rows
from mlxcel_py.models.cpu.prefill_kernels import causal_attention, make_sdpa, make_swiglu, numpy_swiglu


@pytest.mark.parametrize("heads, kv, num_q, num_k", [(9, 3, 512, 2048), (4, 4, 300, 300), (8, 2, 37, 1000), (6, 3, 600, 600)])
def test_numpy_causal_attention_matches_mlx(heads, kv, num_q, num_k):
    mx.random.seed(0)
    q = mx.random.normal((1, heads, num_q, 64))
    k, v = mx.random.normal((1, kv, num_k, 64)), mx.random.normal((1, kv, num_k, 64))
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    out = causal_attention(np.asarray(q[0]), np.asarray(k[0]), np.asarray(v[0]), 0.125)
    np.testing.assert_allclose(out, np.asarray(ref[0]), atol=2e-5)


def test_wrapped_sdpa_falls_back_to_mlx_for_decode_and_masks():
    calls = []

    def original(q, k, v, cache, scale, mask, sinks=None):
        calls.append(mask if mask is None or isinstance(mask, str) else "array")
        return q

    sdpa = make_sdpa(original)
    q, k = mx.zeros((1, 2, 1, 8)), mx.zeros((1, 2, 4, 8))
    sdpa(q, k, k, cache=None, scale=1.0, mask=None)  # one query: decode
    sdpa(mx.zeros((2, 2, 16, 8)), mx.zeros((2, 2, 16, 8)), mx.zeros((2, 2, 16, 8)), cache=None, scale=1.0,
         mask=mx.ones((2, 1, 16, 16), dtype=mx.bool_))  # batched with an array mask
    assert calls == [None, "array"]
    big = mx.random.normal((1, 2, 16, 8))
    out = sdpa(big, big, big, cache=None, scale=0.5, mask="causal")
    assert calls == [None, "array"]  # handled in numpy
    ref = mx.fast.scaled_dot_product_attention(big, big, big, scale=0.5, mask="causal")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


def test_wrapped_sdpa_reads_a_growing_cache_in_place():
    """Pieces over mlx-lm's KVCache (a strided view of a larger buffer) equal MLX's SDPA, and
    numpy reads the buffer itself: no per-layer copy of the whole KV."""
    from mlx_lm.models.cache import KVCache

    mx.random.seed(1)
    sdpa, cache, seen = make_sdpa(lambda *a, **k: None), KVCache(), []
    real_asarray = np.asarray

    def spy(a, *args, **kwargs):
        out = real_asarray(a, *args, **kwargs)
        seen.append(out)
        return out

    for length in (300, 40, 17):  # offsets 300, 340, 357: never a multiple of the cache's step
        q = mx.random.normal((1, 6, length, 32))
        k, v = cache.update_and_fetch(mx.random.normal((1, 2, length, 32)), mx.random.normal((1, 2, length, 32)))
        seen.clear()
        np.asarray, saved = spy, np.asarray
        try:
            out = sdpa(q, k, v, cache=cache, scale=0.2, mask="causal")
        finally:
            np.asarray = saved
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5)
        assert k.shape[2] < cache.keys.shape[2]  # a view of a larger buffer
        assert np.shares_memory(seen[1], np.asarray(cache.keys)) and np.shares_memory(seen[2], np.asarray(cache.values))


def test_openblas_workers_sleep_soon_unless_the_environment_says_otherwise():
    import subprocess
    import sys

    code = "import os, mlxcel_py; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "4"
    env["OPENBLAS_THREAD_TIMEOUT"] = "20"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "20"


def test_the_one_pass_swiglu_matches_numpys_passes_from_tiny_to_overflowing_gates():
    """silu_mul_rows' polynomial exp against numpy's exp, gates from -200 to 200 (both clamps: exp(-g)
    overflows float32 past |g| ~ 88), rows of odd widths, and the (1, L, F) prefill shape."""
    rng = np.random.default_rng(3)
    gate = np.concatenate([np.linspace(-200, 200, 4001, dtype=np.float32), rng.standard_normal(4001).astype(np.float32) * 6])
    gate = gate.reshape(2, -1)  # 4001 a row: no vector-width multiple
    up = rng.standard_normal(gate.shape).astype(np.float32)
    got, want = np.empty_like(gate), numpy_swiglu(gate, up)
    silu_mul_rows(gate, up, got)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=5e-6, atol=1e-20)  # 3.4e-6 measured, at g ~ -55
    swiglu = make_swiglu(lambda g, y: nn.silu(g) * y)
    g3, x3 = mx.array(gate.reshape(1, 2, -1)), mx.array(up.reshape(1, 2, -1))
    g3 = mx.concatenate([g3] * 8, axis=1)  # 16 rows: the numpy path (MIN_QUERIES)
    x3 = mx.concatenate([x3] * 8, axis=1)
    out = np.asarray(swiglu(g3, x3))
    assert out.shape == (1, 16, 4001)
    np.testing.assert_allclose(out, numpy_swiglu(np.asarray(g3), np.asarray(x3)), rtol=5e-6, atol=1e-20)


def test_numpy_swiglu_matches_mlx():
    gate, x = mx.random.normal((64, 96)) * 6, mx.random.normal((64, 96))
    swiglu = make_swiglu(lambda g, y: nn.silu(g) * y)
    np.testing.assert_allclose(np.asarray(swiglu(gate, x)), np.asarray(nn.silu(gate) * x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "flags, machine, expected",
    [
        ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx2", "fma"}, "x86_64", "SkylakeX"),
        ({"avx2", "fma", "avx512f"}, "x86_64", "Haswell"),
        ({"sse4_2"}, "x86_64", None),
        ({"avx2", "fma"}, "aarch64", None),
    ],
)
def test_openblas_kernel_family_follows_the_cpu_flags(flags, machine, expected):
    assert coretype_for(flags, machine) == expected


@pytest.mark.parametrize(
    "env_value, best, narrower",
    [("Haswell", "SkylakeX", True), ("prescott", "Haswell", True), ("Zen", "SkylakeX", True),
     ("SkylakeX", "SkylakeX", False), ("Cooperlake", "SkylakeX", False), ("SkylakeX", "Haswell", False),
     ("Haswell", None, False), ("NEOVERSEN1", "Haswell", False)],
)
def test_an_environment_kernel_family_narrower_than_the_cpus_is_flagged(env_value, best, narrower):
    assert narrower_coretype(env_value, best) is narrower


def test_a_wide_models_prefill_scope_lets_mlx_cache_its_widest_buffers_and_frees_them_after():
    from types import SimpleNamespace

    from mlxcel_py.models.cpu.prefill_kernels import PREFILL_ROWS, PrefillKernels, prefill_cache_bytes

    wide = SimpleNamespace(args=SimpleNamespace(intermediate_size=8192, hidden_size=2048))
    assert prefill_cache_bytes(wide) == 3 * PREFILL_ROWS * 8192 * 4
    assert prefill_cache_bytes(SimpleNamespace(args=SimpleNamespace(intermediate_size=1536, hidden_size=576))) == 0
    assert prefill_cache_bytes(SimpleNamespace()) == 0
    module = SimpleNamespace(__name__="test_wide_scope", swiglu=lambda g, x: g * x)
    kernels = PrefillKernels(module, {"swiglu": module.swiglu}, prefill_cache_bytes(wide))
    before = mx.set_cache_limit(32 << 20)
    try:
        with kernels:
            with kernels:  # nested scopes: the outermost raises and restores
                ys = [mx.zeros((PREFILL_ROWS, 8192)) for _ in range(2)]
                mx.eval(ys)
                del ys
            assert mx.get_cache_memory() >= 2 * PREFILL_ROWS * 8192 * 4  # kept for the next layer
        assert mx.get_cache_memory() < 32 << 20  # freed once the forward is over
        assert mx.set_cache_limit(32 << 20) == 32 << 20  # the limit as it was
        other = PrefillKernels(SimpleNamespace(__name__="test_wide_scope_2", swiglu=module.swiglu),
                               {"swiglu": module.swiglu}, 2 * prefill_cache_bytes(wide))
        with kernels:  # two models' scopes overlapping: the larger limit while both are open, then back
            with other:
                assert mx.set_cache_limit(2 * prefill_cache_bytes(wide)) == 2 * prefill_cache_bytes(wide)
            assert mx.set_cache_limit(prefill_cache_bytes(wide)) == prefill_cache_bytes(wide)
        assert mx.set_cache_limit(32 << 20) == 32 << 20
    finally:
        mx.set_cache_limit(before)


@pytest.mark.parametrize("name, platform, said", [("reference", "linux", True), ("openblas", "linux", False),
                                                   ("off", "linux", False), ("reference", "darwin", False)])
def test_the_reference_blas_is_said_with_its_cost(monkeypatch, name, platform, said):
    from mlxcel_py.models.cpu import blas

    monkeypatch.setattr(blas, "_loaded", blas.BlasInfo(name, note="no OpenBLAS found (apt-get install x)"))
    monkeypatch.setattr(blas.sys, "platform", platform)
    note = blas.slow_blas_note()
    assert (note is not None) == said
    if said:
        assert note.startswith("the reference BLAS is in use (no OpenBLAS found") and "make blas" in note
