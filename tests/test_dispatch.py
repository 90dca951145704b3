"""dispatch.TypedCall: after a key's first call, the compiled entry point, same results; a new key
(another layout) goes through numba's dispatcher again."""

import numpy as np
from numba import njit

from mlxcel_py.models.cpu.quant.dispatch import TypedCall, layout


@njit(cache=False)
def _weighted(pair, scale):
    a, b = pair
    return (a * scale).sum() + b.sum()


class Counting:
    """The dispatcher, counting the calls that reach it."""

    def __init__(self, dispatcher):
        self.dispatcher, self.calls = dispatcher, 0
        self.overloads, self.typeof_pyval = dispatcher.overloads, dispatcher.typeof_pyval

    def __call__(self, *args):
        self.calls += 1
        return self.dispatcher(*args)


def test_entry_point_results_equal_the_dispatchers_and_skip_it():
    counting = Counting(_weighted)
    call = TypedCall(counting)
    rng = np.random.default_rng(0)
    for i in range(5):
        a, b = rng.random((3, 4)), rng.random(7)
        key = layout(a, b)
        assert call(key, (a, b), 2.0) == _weighted((a, b), 2.0)
    assert counting.calls == 1  # the first call typed the arguments; the other four took the entry point


def test_a_new_layout_is_a_new_key_typed_by_the_dispatcher():
    counting = Counting(_weighted)
    call = TypedCall(counting)
    a, b = np.ones((4, 4)), np.arange(3.0)
    call(layout(a, b), (a, b), 1.0)
    strided = a[:, ::2]  # not C-contiguous: another numba type
    assert layout(strided, b) != layout(a, b)
    assert call(layout(strided, b), (strided, b), 1.0) == 8.0 + 3.0
    assert counting.calls == 2
    assert call(layout(strided, b), (strided, b), 3.0) == 24.0 + 3.0
    assert counting.calls == 2
