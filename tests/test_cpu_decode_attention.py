"""The decode attention kernel (models/cpu/decode_attention.py) against a float64 reference: shared
prefix cuts anywhere, sliding windows, left padding, verify spans, GQA groups, chunk crossings, and
the same bits on one and two threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from mlxcel_py.models.cpu import decode_attention as A
from mlxcel_py.models.cpu.decode_kernels import attend
from mlxcel_py.models.cpu.rows import attend_rows

DIM = 16
# the head dimensions of attention_ir's paths: 8-lane blocks (16), 64-lane (64), 64 + 32 (96), numba's (12)
DIMS = (16, 64, 96, 12)


def _kv(rows, kv_heads, capacity, seed=0, dim=DIM):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, kv_heads, capacity, dim), dtype=np.float32),
            rng.standard_normal((rows, kv_heads, capacity, dim), dtype=np.float32))


def _reference(qkv, keys, values, desc, heads, scale):
    """float64 softmax attention of each row over its described positions."""
    kv_heads, dim = keys.shape[1], keys.shape[3]
    group = heads // kv_heads
    out = np.zeros((qkv.shape[0], heads * dim))
    for r, (shared, own, cut, first, stop) in enumerate(desc):
        for h in range(heads):
            kv = h // group
            pos = np.arange(first, stop)
            src = np.where(pos < cut, shared, own)
            k = keys[src, kv, pos].astype(np.float64)
            v = values[src, kv, pos].astype(np.float64)
            s = k @ qkv[r, h * dim:(h + 1) * dim].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[r, h * dim:(h + 1) * dim] = p @ v / p.sum()
    return out


def _qkv(rows, heads, kv_heads, seed=1, dim=DIM):
    return np.random.default_rng(seed).standard_normal((rows, (heads + 2 * kv_heads) * dim), dtype=np.float32)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (6, 2), (8, 2)])  # GQA groups 1, 3, 4
def test_kernel_matches_a_float64_reference_across_chunks(heads, kv_heads, dim):
    keys, values = _kv(3, kv_heads, 3 * A.CHUNK + 40, dim=dim)
    qkv = _qkv(4, heads, kv_heads, dim=dim)
    # contexts within one chunk, ending on a boundary, crossing one and two; a start past a boundary
    desc = np.array([[0, 0, 0, 0, 7], [1, 1, 0, 0, A.CHUNK], [2, 2, 0, 3, A.CHUNK + 9],
                     [0, 1, 0, A.CHUNK + 5, 3 * A.CHUNK + 40]], np.int64)
    got = A.attend_desc(qkv, keys, values, desc, heads, np.float32(0.25))
    np.testing.assert_allclose(got, _reference(qkv, keys, values, desc, heads, 0.25), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("cut", [0, 1, 100, A.CHUNK - 1, A.CHUNK, A.CHUNK + 1, 2 * A.CHUNK + 3, 600])
def test_a_shared_prefix_row_gives_the_bits_of_a_private_copy(cut, dim):
    keys, values = _kv(3, 2, 2 * A.CHUNK + 100, dim=dim)
    keys[2, :, cut:], values[2, :, cut:] = keys[1, :, cut:], values[1, :, cut:]
    private_k, private_v = keys.copy(), values.copy()
    private_k[1, :, :cut], private_v[1, :, :cut] = keys[2, :, :cut], values[2, :, :cut]
    qkv = _qkv(2, 6, 2, dim=dim)
    shared = A.attend_desc(qkv, keys, values, np.array([[2, 1, cut, 0, 600]] * 2, np.int64), 6, np.float32(0.3))
    alone = A.attend_desc(qkv, private_k, private_v, np.array([[1, 1, 0, 0, 600]] * 2, np.int64), 6,
                          np.float32(0.3))
    assert np.array_equal(shared, alone)


def test_one_and_two_threads_give_the_same_bits():
    keys, values = _kv(2, 2, 4 * A.CHUNK)
    qkv = _qkv(3, 6, 2)
    desc = np.array([[0, 0, 0, 0, 4 * A.CHUNK], [1, 1, 0, 17, 3 * A.CHUNK + 1], [0, 1, 300, 0, 700]], np.int64)
    before = numba.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            outs.append(A.attend_desc(qkv, keys, values, desc, 6, np.float32(0.2)))
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(outs[0], outs[1])


def test_attend_left_pad_window_and_span_are_the_reference():
    """cpu_decode_kernels.attend: row b * width + j sees left_pad[b] .. end + j, the last `window` of them."""
    keys, values = _kv(2, 1, 700)
    width, end, pad = 3, 520, np.array([0, 9], np.int64)
    qkv = _qkv(2 * width, 3, 1)
    for window in (0, 300):
        got = attend(qkv, keys, values, end, pad, 3, 0.25, width, window)
        desc = []
        for r in range(2 * width):
            b, stop = r // width, end + r % width
            first = pad[b] if window == 0 else max(pad[b], stop - window)
            desc.append([b, b, first, first, stop])
        ref = _reference(qkv, keys, values, np.array(desc, np.int64), 3, 0.25)
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_attend_rows_spans_read_the_prefix_row_below_its_length():
    """cpu_decode_rows.attend_rows: a verify span (width 2) causal within it, positions below
    prefix[b, 1] from the prefix row, each row from its start."""
    keys, values = _kv(4, 2, 800)
    slot, start, pos = np.array([1, 3]), np.array([0, 40], np.int64), np.array([300, 610], np.int64)
    prefix = np.array([[2, 270], [0, 0]], np.int64)
    qkv = _qkv(4, 4, 2)
    got = attend_rows(qkv, keys, values, slot, start, pos, 4, 0.5, 2, prefix)
    desc = np.array([[2, 1, 270, 0, 301], [2, 1, 270, 0, 302], [0, 3, 0, 40, 611], [0, 3, 0, 40, 612]], np.int64)
    np.testing.assert_allclose(got, _reference(qkv, keys, values, desc, 4, 0.5), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dim", (8, 64, 96, 200))
def test_the_ir_loops_give_a_position_the_same_bits_in_any_pass(dim):
    """attention_ir.dots: a position's score alone == in a pass of 8 or 4; weigh: a range cut anywhere
    == the range whole; both against float64."""
    from numba import njit

    from mlxcel_py.models.cpu.attention_ir import dots, weigh

    run_dots, run_weigh = njit(lambda q, k, out: dots(q, k, out)), njit(lambda p, v, acc: weigh(p, v, acc))
    rng = np.random.default_rng(dim)
    n = 29  # three passes of 8, one of 4, one alone
    q, k = rng.standard_normal(dim, dtype=np.float32), rng.standard_normal((n, dim), dtype=np.float32)
    out = np.empty(n, np.float32)
    run_dots(q, k, out)
    np.testing.assert_allclose(out, k.astype(np.float64) @ q, rtol=1e-5, atol=1e-5)
    for j in range(n):
        alone = np.empty(1, np.float32)
        run_dots(q, k[j:j + 1], alone)
        assert alone[0] == out[j]
    p, acc0 = rng.random(n, dtype=np.float32), rng.standard_normal(dim, dtype=np.float32)
    whole = acc0.copy()
    run_weigh(p, k, whole)
    np.testing.assert_allclose(whole, acc0 + p.astype(np.float64) @ k, rtol=1e-5, atol=1e-5)
    for cut in (0, 1, 7, 8, 13, n):
        parts = acc0.copy()
        run_weigh(p[:cut], k[:cut], parts)
        run_weigh(p[cut:], k[cut:], parts)
        assert np.array_equal(parts, whole)


@pytest.mark.parametrize("dim", (16, 64, 96, 128))
def test_the_paired_ir_loops_give_each_query_the_bits_of_its_own_pass(dim):
    """attention_ir.dots2 / weigh2 (two queries sharing each K or V load) == dots / weigh per query."""
    from numba import njit

    from mlxcel_py.models.cpu.attention_ir import dots, dots2, weigh, weigh2

    run_dots, run_weigh = njit(lambda q, k, out: dots(q, k, out)), njit(lambda p, v, acc: weigh(p, v, acc))
    run_dots2 = njit(lambda a, b, k, oa, ob: dots2(a, b, k, oa, ob))
    run_weigh2 = njit(lambda a, b, v, xa, xb: weigh2(a, b, v, xa, xb))
    rng = np.random.default_rng(dim)
    n = 29  # passes of 8 (where AVX-512VL), 4 and alone
    qs, k = rng.standard_normal((2, dim), dtype=np.float32), rng.standard_normal((n, dim), dtype=np.float32)
    pair, alone = np.empty((2, n), np.float32), np.empty((2, n), np.float32)
    run_dots2(qs[0], qs[1], k, pair[0], pair[1])
    for i in range(2):
        run_dots(qs[i], k, alone[i])
    assert np.array_equal(pair, alone)
    ps, acc0 = rng.random((2, n), dtype=np.float32), rng.standard_normal((2, dim), dtype=np.float32)
    pair_acc, alone_acc = acc0.copy(), acc0.copy()
    run_weigh2(ps[0], ps[1], k, pair_acc[0], pair_acc[1])
    for i in range(2):
        run_weigh(ps[i], k, alone_acc[i])
    assert np.array_equal(pair_acc, alone_acc)
    np.testing.assert_allclose(pair_acc, acc0 + ps.astype(np.float64) @ k, rtol=1e-5, atol=1e-5)


def test_strided_kv_views_give_the_bits_of_contiguous_arrays():
    """K/V that are views (rows padded past the head dimension; a last axis that is not contiguous)
    take the same loops' bits as their contiguous copies, or numba's loops where the last axis strides."""
    dim, heads, kv_heads = 64, 6, 2
    rng = np.random.default_rng(5)
    wide = rng.standard_normal((2, kv_heads, 300, dim + 8), dtype=np.float32)
    padded_k, padded_v = wide[..., :dim], wide[..., 8:]  # row stride dim + 8 floats
    qkv = _qkv(2, heads, kv_heads, dim=dim)
    desc = np.array([[0, 0, 0, 0, 300], [1, 1, 0, 5, 290]], np.int64)
    got = A.attend_desc(qkv, padded_k, padded_v, desc, heads, np.float32(0.125))
    same = A.attend_desc(qkv, np.ascontiguousarray(padded_k), np.ascontiguousarray(padded_v), desc, heads,
                         np.float32(0.125))
    assert np.array_equal(got, same)
    tall = rng.standard_normal((2, kv_heads, dim, 300), dtype=np.float32)
    strided_k = tall.transpose(0, 1, 3, 2)  # the last axis strides by 300 floats: numba's loops
    ref = _reference(qkv, strided_k, padded_v, desc, heads, 0.125)
    np.testing.assert_allclose(A.attend_desc(qkv, strided_k, padded_v, desc, heads, np.float32(0.125)), ref,
                               rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dim", DIMS)
def test_a_block_of_prompt_rows_gives_each_row_s_bits_alone(dim):
    """A piece's rows (one KV row, consecutive stops) share each pass over K and V in blocks of
    BLOCK_ROWS: every row's output has the bits of that row attended alone, whatever rows ride along,
    with a shared prefix cut inside the block's chunks, windowed rows (their own first position) and a
    decode row of another sequence between blocks."""
    heads, kv_heads, n = 6, 2, A.BLOCK_ROWS + 7
    keys, values = _kv(3, kv_heads, 2 * A.CHUNK + 64, dim=dim)
    qkv = _qkv(n + 1, heads, kv_heads, dim=dim)
    stops = A.CHUNK - 5 + np.arange(n)  # the piece crosses a chunk boundary
    cut = A.CHUNK - 40
    piece = np.column_stack([np.full(n, 2), np.ones(n), np.full(n, cut), np.zeros(n), stops]).astype(np.int64)
    windowed = piece.copy()
    windowed[:, 3] = np.maximum(stops - 100, 0)  # each row's own window start
    for desc in (piece, windowed):
        desc = np.vstack([desc[:5], [[0, 0, 0, 0, 90]], desc[5:]])  # another sequence's decode row
        together = A.attend_desc(qkv, keys, values, desc, heads, np.float32(0.3))
        for r in range(len(desc)):
            alone = A.attend_desc(qkv[r:r + 1], keys, values, desc[r:r + 1], heads, np.float32(0.3))
            assert np.array_equal(together[r], alone[0]), r
        np.testing.assert_allclose(together, _reference(qkv, keys, values, desc, heads, 0.3), rtol=2e-5, atol=2e-6)


def test_block_rows_are_runs_of_one_kv_cut_at_multiples_of_the_block():
    desc = np.array([[0, 1, 0, 0, 5]] * (A.BLOCK_ROWS + 3) + [[0, 2, 0, 0, 9], [0, 1, 0, 0, 6]], np.int64)
    starts = {r: int(A.block_rows(desc, r)) for r in range(len(desc)) if A.block_rows(desc, r)}
    assert starts == {0: A.BLOCK_ROWS, A.BLOCK_ROWS: 3, A.BLOCK_ROWS + 3: 1, A.BLOCK_ROWS + 4: 1}
