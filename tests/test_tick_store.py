"""The fused tick's `store` (engine/runner/tick.py): the piece's K/V appended to its row cache, each
layer regrowing at its own tick (`_grow_ahead`), the stored positions unchanged."""

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxcel_py.engine.runner import tick

LAYERS, HEADS, DIM, PIECE = 30, 3, 8, 24


def test_store_regrows_one_layer_at_a_time_and_keeps_every_position():
    cache = [KVCache() for _ in range(LAYERS)]
    store, rng, kept = tick._store(cache), np.random.default_rng(0), []
    grown_per_tick = []
    for _ in range(4000 // PIECE):
        before = [c.keys.shape[2] if c.keys is not None else 0 for c in cache]
        new = rng.standard_normal((HEADS, PIECE, DIM), dtype=np.float32)
        kept.append(new)
        for layer in range(LAYERS):
            keys, values = store(layer, new, -new)
        grown_per_tick.append(sum(c.keys.shape[2] != b for c, b in zip(cache, before)))
        assert all(c.keys.shape[2] - c.offset < 2 * tick.GROW_STEP for c in cache)  # bounded slack
    want = np.concatenate(kept, axis=1)
    np.testing.assert_array_equal(keys, want)
    np.testing.assert_array_equal(values, -want)
    np.testing.assert_array_equal(np.asarray(cache[0].keys)[0, :, : cache[0].offset], want)
    # past the first growths (a short context) every layer regrows on a tick of its own or shared with one
    assert max(grown_per_tick[tick.GROW_STEP // PIECE:]) <= 2
    assert sum(grown_per_tick[tick.GROW_STEP // PIECE:]) >= LAYERS  # and they did regrow: every 1,024 tokens


def test_store_leaves_other_caches_to_their_own_growth():
    class Other(KVCache):
        pass

    cache = [Other() for _ in range(2)]
    store = tick._store(cache)
    piece = np.ones((HEADS, 300, DIM), np.float32)
    reference = KVCache()
    for _ in range(2):
        store(0, piece, piece)
        reference.update_and_fetch(mx.array(piece)[None], mx.array(piece)[None])
    assert cache[0].keys.shape == reference.keys.shape  # mlx-lm's own growth, untouched


def test_a_staged_slot_survives_a_regrow_and_is_not_handed_out():
    from mlxcel_py.engine.runner.kv_rows import RowKV

    kv = RowKV(2, HEADS, DIM, slots=1, capacity=8)
    slot = kv.stage(8)
    data = np.random.default_rng(1).standard_normal((HEADS, 6, DIM), dtype=np.float32)
    for layer in range(2):
        kv.keys[layer][slot, :, 2:8] = data
    kv.staged_written(slot, 2, 8)
    other = [KVCache() for _ in range(2)]
    for c in other:
        c.update_and_fetch(mx.ones((1, HEADS, 20, DIM)), mx.ones((1, HEADS, 20, DIM)))
    kv.add(other)  # needs a slot and more capacity: one regrow, the staged positions copied along
    assert kv.slots == [1] and kv.capacity >= 21
    np.testing.assert_array_equal(kv.keys[1][slot, :, 2:8], data)
    kv.staged_written(slot, 12, 14)  # a gap (a separate piece ran): the run restarts there
    assert kv.staged[slot] == [12, 14]
