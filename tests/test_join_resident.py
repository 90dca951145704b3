"""The end-of-prompt stall: a long prompt joining the engine's rows makes resident
only its own K/V, not the grown capacity. With np.zeros buffers (numpy's calloc, madvised to huge
pages) the join of a 6,144-token prompt touched 1.9 GiB, ~7x its K/V, and took 5-7 s of CPU under
shared load: the 6.3 s last tick of the quiet admission run (docs/CONTINUOUS_BATCHING.md)."""

import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from mlxcel_py.engine.runner import kv_rows
from mlxcel_py.models.footprint import resident_bytes

LAYERS, HEADS, DIM = 6, 3, 64


def row(n: int) -> list:
    out = []
    for _ in range(LAYERS):
        c = KVCache()
        c.update_and_fetch(mx.ones((1, HEADS, n, DIM)), mx.ones((1, HEADS, n, DIM)))
        mx.eval(c.keys, c.values)
        out.append(c)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_long_join_makes_resident_only_its_own_kv():
    kv = kv_rows.RowKV.like(row(8))
    for _ in range(kv_rows.FIRST_SLOTS):  # every first slot taken: the join grows slots and capacity
        kv.add(row(300))
    for mb in (8, 16, 24, 31):  # a prefill's temporaries, freed: they raise glibc's mmap threshold
        a = np.ones(mb << 18, np.float32)
        del a
    long = row(6144)
    own = LAYERS * 2 * HEADS * 6144 * DIM * 4
    before = resident_bytes()
    kv.add(long)
    grown = resident_bytes() - before
    assert kv.capacity == 8192 and kv.keys[0].shape[0] == 2 * kv_rows.FIRST_SLOTS
    capacity = LAYERS * 2 * kv.keys[0].size * 4
    assert capacity > 6 * own  # what a zeroed capacity would have cost
    assert grown < 1.5 * own, f"the join made {grown >> 20} MiB resident for {own >> 20} MiB of K/V"
    np.testing.assert_array_equal(kv.row_kv(len(kv) - 1)[0][0], np.ones((HEADS, 6144, DIM), np.float32))
