"""The tiled prefill attention (models/cpu/prefill_attention.py) against a plain float64 softmax attention."""

import numpy as np
import pytest

from mlxcel_py.models.cpu import prefill_attention as cpu_attention
from mlxcel_py.models.cpu.prefill_kernels import causal_attention, masked_attention


def reference(q, k, v, scale, seen):
    """softmax(q k^T * scale, masked) v in float64, head h reading KV head h // group."""
    group = q.shape[0] // k.shape[0]
    kk, vv = np.repeat(k, group, axis=0).astype(np.float64), np.repeat(v, group, axis=0).astype(np.float64)
    scores = np.einsum("hqd,hkd->hqk", q.astype(np.float64), kk) * scale
    scores = np.where(seen[None], scores, -np.inf)
    with np.errstate(invalid="ignore"):  # a row that sees nothing: NaN, compared only where rows see keys
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,hkd->hqd", weights, vv)


def causal_mask(num_q, num_k, window=None):
    rows = np.arange(num_k - num_q, num_k)[:, None]
    cols = np.arange(num_k)[None, :]
    seen = cols <= rows
    return seen if window is None else seen & (cols > rows - window)


def inputs(heads, kv, num_q, num_k, dim, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, num_q, dim), dtype=np.float32) * 2
    return q, rng.standard_normal((kv, num_k, dim), dtype=np.float32), rng.standard_normal((kv, num_k, dim), dtype=np.float32)


def assert_close(out, ref):
    """Within 1e-5 of the output's scale (float32 products over up to 2,048 keys)."""
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = cpu_attention._state["threads"]
    cpu_attention.set_threads(request.param)
    yield request.param
    cpu_attention.set_threads(before)


@pytest.mark.parametrize("heads, kv, dim", [(4, 4, 64), (8, 4, 128), (8, 2, 64), (16, 4, 128)])
@pytest.mark.parametrize("num_q, num_k", [(300, 300), (37, 1000), (600, 1111), (1, 50)])
def test_causal_attention_matches_float64(threads, heads, kv, dim, num_q, num_k):
    q, k, v = inputs(heads, kv, num_q, num_k, dim)
    out = causal_attention(q, k, v, dim ** -0.5)
    assert_close(out, reference(q, k, v, dim ** -0.5, causal_mask(num_q, num_k)))


@pytest.mark.parametrize("heads, kv, dim", [(4, 1, 64), (8, 4, 128), (6, 3, 64)])
@pytest.mark.parametrize("num_q, num_k, window", [(700, 700, 128), (100, 900, 512), (300, 300, 1000)])
def test_sliding_window_matches_float64(threads, heads, kv, dim, num_q, num_k, window):
    q, k, v = inputs(heads, kv, num_q, num_k, dim, seed=1)
    seen = causal_mask(num_q, num_k, window)
    assert cpu_attention.range_tiles(seen, heads // kv) is not None  # the tiled kernel, not the fallback
    assert_close(masked_attention(q, k, v, 0.2, seen), reference(q, k, v, 0.2, seen))


def test_a_mask_of_several_runs_falls_back_and_still_matches():
    q, k, v = inputs(4, 2, 40, 60, 64, seed=2)
    seen = causal_mask(40, 60)
    seen[:, 5:9] = False  # a hole: rows see two runs of keys
    assert cpu_attention.range_tiles(seen, 2) is None
    assert_close(masked_attention(q, k, v, 0.125, seen), reference(q, k, v, 0.125, seen))


def test_a_row_that_sees_nothing_gives_zeros():
    q, k, v = inputs(2, 1, 20, 30, 64, seed=3)
    seen = causal_mask(20, 30)
    seen[4] = False
    out = masked_attention(q, k, v, 0.125, seen)
    assert np.array_equal(out[:, 4], np.zeros((2, 64), np.float32))
    keep = np.arange(20) != 4
    assert_close(out[:, keep], reference(q, k, v, 0.125, seen)[:, keep])


def test_softmax_ranges_exp_is_within_float32_rounding():
    rng = np.random.default_rng(4)
    s = (rng.standard_normal((6, 500)) * 30).astype(np.float32)
    lo, hi = np.array([0, 10, 250], np.int64), np.array([500, 400, 251], np.int64)
    exact = s.astype(np.float64)
    totals = np.empty(6, np.float32)
    cpu_attention.softmax_ranges(s, lo, hi, 3, totals)
    for r in range(6):
        a, b = lo[r % 3], hi[r % 3]
        want = np.exp(exact[r, a:b] - exact[r, a:b].max())
        np.testing.assert_allclose(s[r, a:b], want, rtol=5e-6, atol=1e-30)
        assert not s[r, :a].any() and not s[r, b:].any()
        assert totals[r] == pytest.approx(want.sum(), rel=1e-6)


def test_numpy_blas_runs_on_one_thread_during_attention_and_is_restored(monkeypatch):
    from mlxcel_py.models.cpu import blas

    count = blas._numpy_set_local()
    if not count:
        pytest.skip("numpy's BLAS has no thread-local thread count")
    outside = count(2)  # numpy's own count on this thread (read by setting, then put back)
    seen_threads, task = [], cpu_attention._task
    monkeypatch.setattr(cpu_attention, "_task", lambda *a: (seen_threads.append(count(1)), task(*a)))
    q, k, v = inputs(2, 1, 64, 64, 64)
    before = cpu_attention._state["threads"]
    try:
        for threads in (1, 2):  # the tiles on this thread, then on the pool's
            cpu_attention.set_threads(threads)
            causal_attention(q, k, v, 0.125)
    finally:
        cpu_attention.set_threads(before)
    assert seen_threads and set(seen_threads) == {1}
    assert count(outside) == 2  # this thread's count is back
