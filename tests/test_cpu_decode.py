"""The numpy decode step (models/cpu/decoder.py) against mlx-lm's own forward, on shared KV caches."""

import random

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcel_py.models.cpu import decoder as cpu_decode
from mlxcel_py.models.cpu import decode_kernels as K
from mlxcel_py.models.cpu.decode_kernels import MAX_STREAM_ROWS, linear

from tiny import reference_model, tiny_model

ATOL = 1e-4


def make_batch(model, prompts):
    """Per-layer BatchKVCache rows of the prefilled prompts, joined as the runner joins them."""
    rows = []
    for p in prompts:
        cache = make_prompt_cache(model)
        model(mx.array([list(p)]), cache=cache)
        rows.append(cache)
    batch = [layer.merge([layer]) for layer in rows[0]]
    for row in rows[1:]:
        for b, layer in zip(batch, row):
            b.extend(layer.merge([layer]))
    return batch


def compare(model, decode, prompts, steps):
    """Decode `steps` greedy tokens both ways from identical caches; returns the worst logit gap."""
    ours, theirs = make_batch(model, prompts), make_batch(model, prompts)
    tokens, worst = [p[-1] for p in prompts], 0.0
    for _ in range(steps):
        got = np.array(decode(tokens, ours))
        want = np.array(model(mx.array(tokens)[:, None], cache=theirs)[:, -1, :])
        worst = max(worst, float(np.abs(got - want).max()))
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()
    for a, b in zip(ours, theirs):  # the KV written in place equals update_and_fetch's
        np.testing.assert_allclose(np.array(a.keys_and_values()[0]), np.array(b.keys_and_values()[0]), atol=ATOL)
        assert a.offset.tolist() == b.offset.tolist() and a.left_padding.tolist() == b.left_padding.tolist()
    return worst


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 400) for _ in range(n)]


def test_loader_installs_the_numpy_decoder_on_the_cpu():
    lm = tiny_model()
    assert isinstance(lm.cpu_decode, cpu_decode.CpuDecoder)
    assert lm.description.endswith("decode in numpy")


@pytest.mark.parametrize("lengths", [(9,), (5, 17, 40)])
def test_decode_matches_mlx_lm_at_batch_1_and_ragged_batch_3(lengths):
    lm = tiny_model()
    assert compare(lm.model, lm.cpu_decode, [prompt(n, i) for i, n in enumerate(lengths)], 12) < ATOL


def test_untied_lm_head_decodes_like_mlx_lm():
    model = reference_model(400, seed=3, tied=False)
    decode = cpu_decode.decoder_for(model)
    assert decode is not None
    assert compare(model, decode, [prompt(7, 7), prompt(3, 8)], 6) < ATOL


def test_decode_grows_kv_and_rope_tables_past_their_first_size():
    lm = tiny_model()
    # rows cross the KV capacity step (256) and the first rope table (512 positions)
    assert compare(lm.model, lm.cpu_decode, [prompt(250, 1), prompt(515, 2)], 10) < ATOL


def test_rows_leaving_and_joining_keep_decoding_like_mlx_lm():
    lm = tiny_model()
    model = lm.model
    ours, theirs = make_batch(model, [prompt(6, 3), prompt(30, 4)]), make_batch(model, [prompt(6, 3), prompt(30, 4)])
    tokens = [1, 2]
    for step in range(8):
        if step == 3:  # row 0 leaves, a new one joins: both caches reshaped by mlx-lm itself
            joined = [make_batch(model, [prompt(12, 5)]) for _ in range(2)]
            for batch, extra in zip((ours, theirs), joined):
                for layer, row in zip(batch, extra):
                    layer.filter([1])
                    layer.extend(row)
            tokens = [tokens[1], 7]
        got = np.array(lm.cpu_decode(tokens, ours))
        want = np.array(model(mx.array(tokens)[:, None], cache=theirs)[:, -1, :])
        np.testing.assert_allclose(got, want, atol=ATOL)
        tokens = want.argmax(-1).tolist()


def test_extracted_row_is_a_private_copy():
    # A snapshot taken from the batch must not change when decoding writes the next position.
    lm = tiny_model()
    batch = make_batch(lm.model, [prompt(8, 6)])
    lm.cpu_decode([3], batch)
    snap = batch[0].extract(0)
    before = np.array(snap.keys)
    for t in range(4):
        lm.cpu_decode([t], batch)
    np.testing.assert_array_equal(np.array(snap.keys), before)


@pytest.mark.parametrize("rows", [1, 3, 4, 6, MAX_STREAM_ROWS, MAX_STREAM_ROWS + 1])
@pytest.mark.parametrize("out_rows", [64, 70])  # 70: rows past the last 4-row tile
def test_linear_matches_matmul(rows, out_rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 96), dtype=np.float32)
    w = rng.standard_normal((out_rows, 96), dtype=np.float32)
    np.testing.assert_allclose(linear(x, w), x @ w.T, rtol=1e-5, atol=1e-4)


def test_layer_kernels_match_numpy():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, 32), dtype=np.float32)
    weight = rng.standard_normal(32, dtype=np.float32)
    want = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-5) * weight
    np.testing.assert_allclose(K.rms_norm(h, weight, 1e-5), want, rtol=1e-5, atol=1e-6)
    gu = rng.standard_normal((3, 40), dtype=np.float32)
    silu = gu[:, :20] / (1 + np.exp(-gu[:, :20])) * gu[:, 20:]
    np.testing.assert_allclose(K.silu_mul(gu), silu, rtol=1e-5, atol=1e-6)
    # the polynomial exp's clamps: silu saturates to 0 and to the gate without inf or NaN
    edge = np.array([[-200.0, -90.0, -30.0, 0.0, 30.0, 200.0] + [2.0] * 6], np.float32)
    g64 = edge[:, :6].astype(np.float64)
    got = K.silu_mul(edge)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, g64 / (1 + np.exp(-g64)) * 2.0, rtol=1e-5, atol=1e-30)


def test_attention_kernel_masks_each_rows_left_padding():
    rng = np.random.default_rng(1)
    rows, heads, kv_heads, dim, end = 2, 4, 2, 8, 6
    qkv = rng.standard_normal((rows, (heads + 2 * kv_heads) * dim), dtype=np.float32)
    keys = rng.standard_normal((rows, kv_heads, 10, dim), dtype=np.float32)
    values = rng.standard_normal((rows, kv_heads, 10, dim), dtype=np.float32)
    pad = np.array([0, 3])
    got = K.attend(qkv, keys, values, end, pad, heads, 0.5)
    for b in range(rows):
        for h in range(heads):
            q, kv = qkv[b, h * dim : (h + 1) * dim], h // (heads // kv_heads)
            s = keys[b, kv, pad[b] : end] @ q * 0.5
            p = np.exp(s - s.max())
            want = p @ values[b, kv, pad[b] : end] / p.sum()
            np.testing.assert_allclose(got[b, h * dim : (h + 1) * dim], want, rtol=1e-5, atol=1e-5)


def test_unsupported_models_keep_mlx_lms_decode():
    assert cpu_decode.supported(reference_model(400)) is None
    model = reference_model(400)
    model.set_dtype(mx.float16)
    assert cpu_decode.supported(model) == "mlx.core.float16 weights"
    assert cpu_decode.decoder_for(model) is None


@pytest.fixture(scope="module")
def default_model():
    from mlxcel_py.models import load_model

    return load_model(None, cpu_weights="f32")  # compared with mlx-lm to float32 rounding


@pytest.mark.slow
@pytest.mark.parametrize("lengths", [(20,), (8, 33, 21)])
def test_real_model_decode_matches_mlx_lm(default_model, lengths):
    assert compare(default_model.model, default_model.cpu_decode, [prompt(n, i) for i, n in enumerate(lengths)], 6) < ATOL


def test_threads_split_the_products_without_changing_a_bit():
    """Each output row's dot product runs whole on one thread, so any thread count gives the
    same logits, bit for bit; the decoder sets the count on the thread that calls it."""
    import numba

    model = reference_model(400, seed=5)
    prompts = [prompt(6, 1), prompt(19, 2)]
    logits = {}
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        decoder = cpu_decode.CpuDecoder(model, threads)
        batch, tokens, out = make_batch(model, prompts), [p[-1] for p in prompts], []
        for _ in range(4):
            step = np.array(decoder(tokens, batch))
            out.append(step)
            tokens = step.argmax(-1).tolist()
        assert numba.get_num_threads() == threads
        logits[threads] = np.stack(out)
    one, many = logits.values()
    np.testing.assert_array_equal(one, many)


@pytest.mark.parametrize("width", [2, 5, 17])
def test_verify_span_matches_mlx_lms_forward_and_survives_a_trim(width):
    # W tokens per row in one span (a draft's verify), causal within it, on a ragged batch; then
    # the rejected positions trimmed and one plain decode step, both against mlx-lm.
    lm = tiny_model()
    prompts = [prompt(n, n) for n in (9, 3, 14)]
    ours, theirs = make_batch(lm.model, prompts), make_batch(lm.model, prompts)
    rows = [list(prompt(width, 40 + i)) for i in range(len(prompts))]
    got = np.array(lm.cpu_decode.verify(rows, ours))
    want = np.array(lm.model(mx.array(rows), cache=theirs))
    np.testing.assert_allclose(got, want, atol=ATOL)
    for a, b in zip(ours, theirs):
        a.trim(width - 1)
        b.trim(width - 1)
    tokens = [5, 6, 7]
    got = np.array(lm.cpu_decode(tokens, ours))
    want = np.array(lm.model(mx.array(tokens)[:, None], cache=theirs)[:, -1, :])
    np.testing.assert_allclose(got, want, atol=ATOL)
