"""The compiled clearing decision equals its pure-Python twin (``_editing_core_py``)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast import _editing_core_py as py

core = pytest.importorskip("jianmu_fast._editing_core")


@st.composite
def records(draw):
    n = draw(st.integers(0, 60))
    counts = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    kinds = draw(st.lists(st.sampled_from([0, 0, 1, 2, 2]), min_size=n, max_size=n))
    savings = [draw(st.integers(0, c)) if k == 2 else 0 for c, k in zip(counts, kinds)]
    return (np.array(counts, dtype=np.int64), np.array(kinds, dtype=np.int8), np.array(savings, dtype=np.int64))


def _both(*args):
    try:
        a = py.plan_clearing(*args)
    except ValueError as exc:
        with pytest.raises(ValueError) as info:
            core.plan_clearing(*args)
        assert str(info.value) == str(exc)
        return None
    assert core.plan_clearing(*args) == a
    return a


@settings(max_examples=400, deadline=None)
@given(records(), st.integers(0, 100), st.integers(0, 20000), st.sampled_from([0, 1, 300, 2000]), st.integers(0, 5))
def test_twin_equals_compiled(rec, base, trigger, step, keep):
    counts, kinds, savings = rec
    out = _both(counts, kinds, savings, base, trigger, step, keep)
    cleared, total = out
    n_results = int((kinds > 0).sum())
    assert 0 <= cleared <= max(0, n_results - keep)
    assert total <= base + int(counts.sum())


@settings(max_examples=200, deadline=None)
@given(records(), st.integers(0, 20000), st.sampled_from([0, 1, 300, 2000]), st.integers(0, 5), st.data())
def test_monotone_along_growing_histories(rec, trigger, step, keep, data):
    counts, kinds, savings = rec
    k = data.draw(st.integers(0, len(counts)))
    short = py.plan_clearing(counts[:k], kinds[:k], savings[:k], 3, trigger, step, keep)
    long = py.plan_clearing(counts, kinds, savings, 3, trigger, step, keep)
    assert long[0] >= short[0]


@pytest.mark.parametrize("args, message", [
    (([1, 2], [0], [0, 0], 0, 0, 0, 0), "counts, kinds and savings must have the same length, got 2, 1, 2"),
    (([1], [0], [0], -1, 0, 0, 0), "base must be between 0 and 2**53, got -1"),
    (([1], [0], [0], 0, 0, 0, -2), "keep must be between 0 and 2**53, got -2"),
    (([-1], [0], [0], 0, 0, 0, 0), "counts[0] must be between 0 and 2**53, got -1"),
    (([5], [3], [0], 0, 0, 0, 0), "kinds[0] must be 0, 1 or 2, got 3"),
    (([5], [1], [2], 0, 0, 0, 0), "savings[0] must be between 0 and counts[0], and 0 unless kinds[0] == 2, got 2"),
    (([5], [2], [6], 0, 0, 0, 0), "savings[0] must be between 0 and counts[0], and 0 unless kinds[0] == 2, got 6"),
    (([1 << 53] * 600, [0] * 600, [0] * 600, 0, 0, 0, 0), "base + sum(counts[:513]) must be at most 2**62"),
])
def test_errors_name_the_argument(args, message):
    c, k, s, *rest = args
    arrays = (np.array(c, dtype=np.int64), np.array(k, dtype=np.int8), np.array(s, dtype=np.int64))
    for mod in (py, core):
        with pytest.raises(ValueError) as info:
            mod.plan_clearing(*arrays, *rest)
        assert str(info.value) == message
