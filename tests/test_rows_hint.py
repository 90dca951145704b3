"""The engine's owned KV rows are sized up front, so a long prompt joining a busy batch regrows nothing."""

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxcel_py.engine.lifecycle import MAX_FIRST_CAPACITY, ROW_MARGIN, rows_hint
from mlxcel_py.engine.runner import kv_rows


def _row(length: int, layers: int = 2) -> list:
    out = []
    for layer in range(layers):
        cache = KVCache()
        cache.update_and_fetch(mx.full((1, 2, length, 4), float(layer + 1)), mx.full((1, 2, length, 4), -1.0))
        out.append(cache)
    return out


def test_rows_hint_covers_every_slot_and_its_context():
    assert rows_hint(4, 4096) == (10, 4096 + ROW_MARGIN)
    assert rows_hint(1, 10**6) == (4, MAX_FIRST_CAPACITY)


def test_joins_within_the_hint_never_regrow(monkeypatch):
    regrows = []
    real = kv_rows.RowKV._regrow
    monkeypatch.setattr(kv_rows.RowKV, "_regrow", lambda self, *a: (regrows.append(a), real(self, *a))[1])
    kv = kv_rows.RowKV.like(_row(8), *rows_hint(4, 6200))
    for length in (8, 300, 40, 6144):
        kv.add(_row(length))
    assert regrows == [] and kv.lengths == [8, 300, 40, 6144]
    assert float(kv.keys[1][kv.slots[3], 0, 6143, 0]) == 2.0


def test_a_join_needing_a_slot_and_capacity_regrows_once(monkeypatch):
    regrows = []
    real = kv_rows.RowKV._regrow
    monkeypatch.setattr(kv_rows.RowKV, "_regrow", lambda self, *a: (regrows.append(a), real(self, *a))[1])
    kv = kv_rows.RowKV.like(_row(8), 2, 16)
    kv.add(_row(8))
    kv.add(_row(12))
    kv.add(_row(40))  # a third slot and 40 positions: one regrow to (4, 64), the rows copied once
    assert regrows == [(4, 64)]
    assert [float(kv.keys[0][s, 1, n - 1, 3]) for s, n in zip(kv.slots, kv.lengths)] == [1.0, 1.0, 1.0]
