"""The compiled core equals its pure-Python reference, and both equal a brute force."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jianmu_fast
import jianmu_fast._filter_core_py as core_py
from strategies import WindowCase, window_cases

PURE = os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1"
MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500"))

if not PURE:
    import jianmu_fast._filter_core as core_c

needs_c = pytest.mark.skipif(PURE, reason="JIANMU_FAST_PURE_PYTHON=1")


def i64(*xs):
    return np.array(xs, dtype=np.int64)


def brute_force(case: WindowCase) -> tuple[int, int]:
    """The definition: the longest contiguous run of whole units at the kept end that fits."""
    counts, starts, n_pinned, budget = list(case.counts), list(case.unit_starts), case.n_pinned, case.budget
    n = len(counts)
    bounds = starts + [n]
    pinned = sum(counts[:n_pinned])
    empty = (n, n) if case.from_start else (n_pinned, n_pinned)
    if not starts or pinned > budget:
        return empty
    fits = []
    for k in range(len(starts) + 1):
        lo, hi = (bounds[k], n) if case.from_start else (n_pinned, bounds[k])
        if pinned + sum(counts[lo:hi]) <= budget:
            fits.append((hi - lo, lo, hi))
    _, lo, hi = max(fits)
    return (lo, hi) if lo != hi else empty


EDGES = [
    WindowCase((), (), 0, 0, True, 0),                      # empty input
    WindowCase((3, 4), (0, 1), 0, 0, True, 0),              # budget 0
    WindowCase((9, 1, 1), (2,), 2, 5, True, 0),             # pinned prefix over the budget
    WindowCase((1, 2, 20), (1, 2), 1, 10, True, 0),         # newest unit larger than the budget
    WindowCase((1, 2, 20), (1, 2), 1, 10, False, 0),        # oldest kept, newest too large
    WindowCase((0, 0, 0), (0, 1, 2), 0, 0, True, 0),        # zero-cost messages always fit
    WindowCase((2, 5, 5, 5, 5), (1, 2, 3, 4), 1, 17, True, 4),  # chunked cut
]


@needs_c
@pytest.mark.parametrize("name", ["select_window", "select_windows", "plan_window", "plan_windows",
                                  "sanitize_window", "sanitize_windows", "counts_of"])
def test_twins_share_signatures(name):
    assert inspect.signature(getattr(core_c, name)) == inspect.signature(getattr(core_py, name))


@needs_c
@pytest.mark.parametrize("name", ["match", "advance", "extend", "set_counts", "plan", "sanitize", "window", "folds",
                                  "joined", "fold_keys", "fold_step"])
def test_records_twins_share_method_signatures(name):
    assert inspect.signature(getattr(core_c.Records, name)) == inspect.signature(getattr(core_py.Records, name))


@needs_c
def test_twins_share_constants():
    assert core_c.MAX_VALUE == core_py.MAX_VALUE == 2**53 and core_c.ROLE_CODES == core_py.ROLE_CODES


@needs_c
@given(case=window_cases())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_compiled_equals_reference(case):
    assert core_c.select_window(*case.args) == core_py.select_window(*case.args)


@needs_c
@pytest.mark.parametrize("case", EDGES, ids=repr)
def test_compiled_equals_reference_on_edges(case):
    assert core_c.select_window(*case.args) == core_py.select_window(*case.args)


def _cores():
    return [core_py] if PURE else [core_py, core_c]


@given(case=window_cases())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_exact_eviction_is_the_brute_force_definition(case):
    exact = WindowCase(case.counts, case.unit_starts, case.n_pinned, case.budget, case.from_start, 0)
    for core in _cores():
        assert core.select_window(*exact.args) == brute_force(exact)


@pytest.mark.parametrize("case", EDGES[:6], ids=repr)
def test_edges_match_brute_force(case):
    for core in _cores():
        assert core.select_window(*case.args) == brute_force(case)


def test_edge_results_are_exact():
    for core in _cores():
        assert core.select_window(*EDGES[0].args) == (0, 0)
        assert core.select_window(*EDGES[1].args) == (2, 2)
        assert core.select_window(*EDGES[2].args) == (3, 3)
        assert core.select_window(*EDGES[3].args) == (3, 3)
        assert core.select_window(*EDGES[4].args) == (1, 2)
        assert core.select_window(*EDGES[5].args) == (0, 3)
        # chunked: total 20, room 15 -> drop 5, rounded up to 8 -> first boundary at or past 8 is 3
        assert core.select_window(*EDGES[6].args) == (3, 5)
        # the same case with exact eviction keeps one more unit
        assert core.select_window(*EDGES[6].args[:5], 0) == (2, 5)


@given(case=window_cases())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_chunked_keeps_a_suffix_of_exact_within_budget(case):
    if not case.from_start or case.chunk == 0:
        return
    for core in _cores():
        lo_e, hi_e = core.select_window(*case.args[:5], 0)
        lo_c, hi_c = core.select_window(*case.args)
        assert hi_c == hi_e
        assert lo_c >= lo_e
        if lo_e == hi_e:
            assert lo_c == hi_c
        else:
            assert lo_c < hi_c  # the newest unit is never dropped when it fits
            assert sum(case.counts[: case.n_pinned]) + sum(case.counts[lo_c:hi_c]) <= case.budget


@given(cases=st.lists(window_cases(max_messages=12), max_size=12), from_start=st.booleans(), chunk=st.sampled_from([0, 5]))
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 4))
def test_batch_equals_single_calls(cases, from_start, chunk):
    counts = i64(*[c for case in cases for c in case.counts])
    starts = i64(*[s for case in cases for s in case.unit_starts])
    offsets = i64(0, *np.cumsum([len(c.counts) for c in cases]).tolist())
    unit_offsets = i64(0, *np.cumsum([len(c.unit_starts) for c in cases]).tolist())
    n_pinned = i64(*[c.n_pinned for c in cases])
    budgets = i64(*[c.budget for c in cases])
    for core in _cores():
        lo, hi = core.select_windows(counts, offsets, starts, unit_offsets, n_pinned, budgets, from_start, chunk)
        assert lo.dtype == np.int64 and hi.dtype == np.int64
        expected = [core.select_window(*c.args[:4], from_start, chunk) for c in cases]
        assert list(zip(lo.tolist(), hi.tolist())) == expected


BAD_SINGLE = [
    ((i64(1, -1), i64(0, 1), 0, 5, True), "counts[1] must be between 0 and 2**53, got -1"),
    ((i64(1, 2), i64(1), 0, 5, True), "unit_starts[0] must equal n_pinned (0), got 1"),
    ((i64(1, 2), i64(), 0, 5, True), "unit_starts[0] must equal n_pinned (0), got None"),
    ((i64(1, 2), i64(0, 0), 0, 5, True), "unit_starts must be strictly increasing (at index 1)"),
    ((i64(1, 2), i64(0, 2), 0, 5, True), "unit_starts[1] must be below len(counts) (2)"),
    ((i64(1, 2), i64(2), 3, 5, True), "n_pinned must be between 0 and len(counts) (2), got 3"),
    ((i64(1, 2), i64(0), 0, -1, True), "budget must be between 0 and 2**53, got -1"),
    ((i64(1, 2), i64(0), 2, 5, True), "unit_starts must be empty when every message is pinned"),
    ((i64(1, 2), i64(0), 0, 5, True, -2), "chunk must be between 0 and 2**53, got -2"),
    ((i64(1, 2), i64(0), 0, 2**53 + 1, True), "budget must be between 0 and 2**53, got 9007199254740993"),
    ((i64(1, 2**53 + 1), i64(0), 0, 5, True), "counts[1] must be between 0 and 2**53, got 9007199254740993"),
    ((i64(1, 2), i64(0), 0, 5, True, 2**62), "chunk must be between 0 and 2**53, got 4611686018427387904"),
]


@pytest.mark.parametrize("args,message", BAD_SINGLE)
def test_bad_arguments_raise_the_same_error_on_both(args, message):
    for core in _cores():
        with pytest.raises(ValueError) as info:
            core.select_window(*args)
        assert str(info.value) == message


def test_batch_errors_name_the_prompt():
    for core in _cores():
        with pytest.raises(ValueError, match=r"^prompt 1: counts\[0\] must be between 0 and 2\*\*53, got -3$"):
            core.select_windows(i64(1, -3), i64(0, 1, 2), i64(0, 0), i64(0, 1, 2), i64(0, 0), i64(5, 5), True)
        with pytest.raises(ValueError, match="offsets must have len"):
            core.select_windows(i64(1), i64(0, 1, 1), i64(0), i64(0, 1), i64(0), i64(5), True)
        with pytest.raises(ValueError, match="budgets has 2 entries"):
            core.select_windows(i64(1), i64(0, 1), i64(0), i64(0, 1), i64(0), i64(5, 5), True)


@st.composite
def extreme_cases(draw):
    """Counts, budgets and chunks at the top of the documented range (issue 12 item 7): sums
    of many 2**53 counts pass int64, and the compiled core must still equal the twin."""
    big = st.sampled_from([0, 1, 2**52, 2**53 - 1, 2**53])
    case = draw(window_cases(max_messages=20))
    counts = tuple(draw(st.one_of(big, st.just(c))) for c in case.counts)
    budget = draw(st.one_of(big, st.just(case.budget)))
    chunk = draw(st.sampled_from([0, 1, 7, 2**52, 2**53]))
    return WindowCase(counts, case.unit_starts, case.n_pinned, budget, case.from_start, chunk)


@given(case=extreme_cases())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_extremes_equal_on_both_and_the_brute_force(case):
    results = {core.__name__: core.select_window(*case.args) for core in _cores()}
    assert len(set(results.values())) == 1, results
    if case.chunk == 0:
        assert next(iter(results.values())) == brute_force(case)


def test_many_max_counts_do_not_overflow():
    counts = np.full(4000, 2**53, dtype=np.int64)  # sums to 2**65: past int64
    starts = np.arange(1, 4000, dtype=np.int64)
    for core in _cores():
        assert core.select_window(counts, starts, 1, 2**53, True) == (4000, 4000)
        assert core.select_window(counts[:3], i64(0, 2), 0, 2**53, True) == (2, 3)
        assert core.select_window(counts, i64(0, 2, 3000), 0, 2**53, True, 2**53) == (4000, 4000)
        assert core.select_window(counts, i64(0, 3999), 0, 2**53, True, 2**53) == (3999, 4000)


def test_backend_is_named_and_not_silently_missing():
    if PURE:
        assert jianmu_fast.BACKEND == "python"
    else:
        assert jianmu_fast.BACKEND == "cython"
        assert jianmu_fast._backend.select_window is core_c.select_window


# -- plan_window / sanitize_window: the per-prompt plans over records (issue 13) --------------


@st.composite
def plan_cases(draw):
    n = draw(st.integers(0, 30))
    roles = draw(st.lists(st.sampled_from([0, 0, 1, 2, 3, 3]), min_size=n, max_size=n))
    true = draw(st.lists(st.one_of(st.integers(0, 40), st.sampled_from([0, 2**53])), min_size=n, max_size=n))
    known = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    counts = [c if k else -1 for c, k in zip(true, known)]
    big = draw(st.booleans())
    budget = draw(st.integers(0, 2**53)) if big else draw(st.integers(0, sum(c for c in true if c < 2**53) + 5))
    return (np.array(roles, dtype=np.int8), np.array(counts, dtype=np.int64), np.array(true, dtype=np.int64),
            draw(st.integers(0, 15)), budget, draw(st.booleans()), draw(st.sampled_from([0, 0, 1, 5, 40, 2**53])),
            draw(st.booleans()))


def _plan_until_done(core, roles, counts, true, mask, budget, from_start, chunk, free):
    counts = counts.copy()
    for _ in range(200):
        status, n_pinned, lo, hi = core.plan_window(roles, counts, mask, budget, from_start, chunk, free)
        if status == 0:
            return n_pinned, lo, hi
        assert lo < hi or (lo == hi == 0 and n_pinned == 0)
        unknown = counts[lo:hi] < 0
        assert unknown.any(), "a request must make progress"
        counts[lo:hi][unknown] = true[lo:hi][unknown]
    raise AssertionError("no decision")


@given(case=plan_cases())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_plan_window_twin_equals_compiled_and_select_window(case):
    roles, counts, true, mask, budget, from_start, chunk, free = case
    if not from_start:
        chunk = 0
    results = [core.plan_window(roles, counts, mask, budget, from_start, chunk, free) for core in _cores()]
    assert len(set(results)) == 1, results
    plans = {_plan_until_done(core, roles, counts, true, mask, budget, from_start, chunk, free) for core in _cores()}
    assert len(plans) == 1
    n_pinned, lo, hi = plans.pop()
    # the same decision as select_window over the same units
    n = len(roles)
    k = 0
    while k < n and (mask >> int(roles[k])) & 1:
        k += 1
    assert n_pinned == k
    c = true.copy()
    if free:
        c[:k] = 0
    starts = [k] + [i for i in range(k + 1, n) if roles[i] != 3] if k < n else []
    assert (lo, hi) == core_py.select_window(c, np.array(starts, dtype=np.int64), k, budget, from_start, chunk)


def _records(units):
    """roles, call_off, call_ids, result_ids of a random prompt, and the same as Messages."""
    from jianmu_fast.message import ai, human, system, tool

    roles, off, cids, rids, msgs = [], [0], [], [], []
    name = lambda x: None if x == -1 else f"c{x}"  # noqa: E731
    for kind, calls, results in units:
        if kind == "call":
            roles.append(2)
            cids += calls
            off.append(len(cids))
            rids.append(-1)
            msgs.append(ai(None, tool_calls=[{**({"id": name(c)} if c != -1 else {}), "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}} for c in calls]))
            kinds = [(3, r) for r in results]
        else:
            kinds = [({"system": 0, "user": 1, "assistant": 2, "tool": 3}[kind], results[0] if results else -1)]
        for role, r in kinds:
            roles.append(role)
            off.append(len(cids))
            rids.append(r if role == 3 else -1)
            msgs.append(tool("r", tool_call_id=name(r)) if role == 3 else
                        [system, human, ai][role]("t"))
    return (np.array(roles, dtype=np.int8), np.array(off, dtype=np.int64), np.array(cids, dtype=np.int64),
            np.array(rids, dtype=np.int64), msgs)


_ids = st.sampled_from([-1, 1, 2, 3, 3])
sanitize_units = st.lists(st.one_of(
    st.tuples(st.just("call"), st.lists(_ids, min_size=1, max_size=3), st.lists(_ids, max_size=3)),
    st.tuples(st.sampled_from(["system", "user", "assistant"]), st.just([]), st.just([])),
    st.tuples(st.just("tool"), st.just([]), st.lists(_ids, min_size=1, max_size=1)),
), max_size=10)


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_sanitize_window_equals_twin_and_the_sanitizer(units, data):
    from jianmu_fast.errors import ToolCallHistoryError
    from jianmu_fast.message import sanitize_tool_call_history_report

    roles, off, cids, rids, msgs = _records(units)
    n = len(roles)
    n_pinned = data.draw(st.integers(0, n))
    lo = data.draw(st.integers(n_pinned, n))
    hi = data.draw(st.integers(lo, n))
    results = [core.sanitize_window(roles, off, cids, rids, n_pinned, lo, hi) for core in _cores()]
    assert all(r == results[0] for r in results), results
    status, drops = results[0]
    prompt = msgs[:n_pinned] + msgs[lo:hi]
    try:
        report = sanitize_tool_call_history_report(prompt)
    except ToolCallHistoryError:
        assert status == 2
        return
    if status == 0:
        assert not report.changed and report.messages == prompt
    elif status == 1:
        assert not report.filled and not report.filled_results
        assert [tuple((d.indices[0], d.indices[-1] + 1)) for d in report.dropped] == drops
    else:
        assert report.filled or report.filled_results or report.dropped


@given(cases=st.lists(plan_cases(), min_size=1, max_size=6), data=st.data())
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 4))
def test_plan_windows_equals_plan_window_per_prompt_over_a_shared_table(cases, data):
    roles = np.concatenate([c[0] for c in cases])
    counts = np.concatenate([c[1] for c in cases])
    mask, budget, from_start, chunk, free = cases[0][3], cases[0][4], cases[0][5], cases[0][6], cases[0][7]
    if not from_start:
        chunk = 0
    n_tab = len(roles)
    prompts = [data.draw(st.lists(st.integers(0, max(0, n_tab - 1)), max_size=12)) if n_tab else [] for _ in range(4)]
    rows = np.array([r for p in prompts for r in p], dtype=np.int64)
    offsets = np.array([0] + np.cumsum([len(p) for p in prompts]).tolist(), dtype=np.int64)
    for core in _cores():
        plans = core.plan_windows(rows, offsets, roles, counts, mask, budget, from_start, chunk, free)
        for p, prompt in enumerate(prompts):
            r = np.array(prompt, dtype=np.int64)
            expected = core.plan_window(roles[r], counts[r], mask, budget, from_start, chunk, free) if len(r) else (0, 0, 0, 0)
            assert tuple(plans[p].tolist()) == tuple(expected)


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_sanitize_windows_status_equals_sanitize_window(units, data):
    roles, off, cids, rids, _ = _records(units)
    n = len(roles)
    prompts, bounds = [], []
    for _ in range(3):
        prompt = data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=10)) if n else []
        k = len(prompt)
        a = data.draw(st.integers(0, k))
        b = data.draw(st.integers(a, k))
        c = data.draw(st.integers(b, k))
        prompts.append(prompt)
        bounds.append((a, b, c))
    if not n:
        return
    rows = np.array([r for p in prompts for r in p], dtype=np.int64)
    offsets = np.array([0] + np.cumsum([len(p) for p in prompts]).tolist(), dtype=np.int64)
    n_pinned, lo, hi = (np.array(x, dtype=np.int64) for x in zip(*bounds))
    for core in _cores():
        status = core.sanitize_windows(rows, offsets, roles, off, cids, rids, n_pinned, lo, hi).tolist()
        for p, prompt in enumerate(prompts):
            r = np.array(prompt, dtype=np.int64)
            ids, o = [], [0]
            for q in prompt:
                ids += cids[off[q]:off[q + 1]].tolist()
                o.append(len(ids))
            expected = core_py.sanitize_window(roles[r], np.array(o, dtype=np.int64), np.array(ids, dtype=np.int64),
                                               rids[r], *bounds[p])[0] if len(r) else 0
            assert status[p] == expected


# -- Records: one prompt's records, grown in place (the agent loop) ---------------------------

def _record_messages(units):
    """Messages of random units (roles, call ids and result ids as in ``_records``)."""
    return _records(units)[4]


def _record_cores():
    from jianmu_fast.message import Message

    return [core.Records(Message) for core in _cores()]


@given(steps=st.lists(st.tuples(sanitize_units, st.integers(0, 3)), min_size=1, max_size=8), data=st.data())
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 2))
def test_records_twin_equals_compiled_and_the_stateless_plans(steps, data):
    """Grown in place by random units with counts known, unknown or filled later, the
    records plan and sanitize exactly as ``plan_window``/``sanitize_window`` over their
    arrays, on both twins (the compiled one by prefix sums and binary search)."""
    recs = _record_cores()
    history: list = []
    big = data.draw(st.booleans())
    for units, how in steps:
        new = _record_messages(units)
        history.extend(new)
        if how == 0:
            counts = None
        else:
            pool = st.integers(0, 40) if not big else st.sampled_from([0, 7, 2**53])
            counts = data.draw(st.lists(st.one_of(pool, st.just(-1)) if how == 3 else pool,
                                        min_size=len(new), max_size=len(new)))
        assert [r.advance(history, lambda new_: counts) for r in recs] == [len(new)] * len(recs) or not new
        n = len(history)
        if n and data.draw(st.booleans()):  # fill some counts, as the filter does when asked
            index = data.draw(st.lists(st.integers(0, n - 1), max_size=6, unique=True))
            values = data.draw(st.lists(st.integers(-1, 50), min_size=len(index), max_size=len(index)))
            for r in recs:
                r.set_counts(np.array(index, dtype=np.int64), values)
        views = [(r.roles.tolist(), r.counts.tolist(), r.call_off.tolist(), r.call_ids.tolist(),
                  r.result_ids.tolist(), r.n, r.interned) for r in recs]
        assert all(v == views[0] for v in views)
        roles, counts = recs[0].roles, recs[0].counts
        for _ in range(3):
            mask = data.draw(st.integers(0, 15))
            budget = data.draw(st.one_of(st.integers(0, 300), st.just(2**53)))
            from_start = data.draw(st.booleans())
            chunk = data.draw(st.sampled_from([0, 0, 1, 5, 40])) if from_start else 0
            free = data.draw(st.booleans())
            want = core_py.plan_window(roles, counts, mask, budget, from_start, chunk, free)
            assert [r.plan(budget, mask, from_start, chunk, free) for r in recs] == [want] * len(recs)
        if n:
            k = data.draw(st.integers(0, n))
            lo = data.draw(st.integers(k, n))
            hi = data.draw(st.integers(lo, n))
            want_s = core_py.sanitize_window(roles, recs[0].call_off, recs[0].call_ids, recs[0].result_ids, k, lo, hi)[0]
            assert [r.sanitize(k, lo, hi) for r in recs] == [want_s] * len(recs)


@given(n=st.integers(1, 400), budget=st.integers(0, 3000), data=st.data())
@settings(deadline=None, max_examples=max(30, MAX_EXAMPLES // 5))
def test_records_plan_on_long_histories_with_counted_tails(n, budget, data):
    """Long histories whose older records are uncounted (the hot loop's state after the
    first trim): the compiled binary search equals the walk of ``plan_window``."""
    from jianmu_fast.message import Message, ai, human, system, tool

    seed = data.draw(st.integers(0, 10**6))
    import random

    rng = random.Random(seed)
    msgs: list = [system("s")]
    while len(msgs) < n:
        r = rng.random()
        if r < 0.3:
            calls = [{"id": f"c{len(msgs)}_{j}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                     for j in range(rng.choice([1, 1, 2]))]
            msgs.append(ai(None, tool_calls=calls))
            msgs += [tool("r", tool_call_id=c["id"]) for c in calls]
        else:
            msgs.append(human("u") if r < 0.7 else ai("a"))
    true = [rng.randint(0, 60) for _ in msgs]
    cut = data.draw(st.integers(0, len(msgs)))  # counted from here on
    recs = [core.Records(Message) for core in _cores()]
    for r in recs:
        r.extend(msgs, [-1] * cut + true[cut:])
    for from_start, chunk in ((True, 0), (True, 37), (False, 0)):
        roles, counts = recs[0].roles, recs[0].counts
        for _ in range(40):  # fill what is asked for, as the filter does, until decided
            want = core_py.plan_window(roles, counts, 1, budget, from_start, chunk)
            assert [r.plan(budget, 1, from_start, chunk) for r in recs] == [want] * len(recs)
            if want[0] == 0:
                break
            idx = np.arange(want[2], want[3], dtype=np.int64)
            for r in recs:
                r.set_counts(idx, [true[i] for i in idx])
            counts = recs[0].counts
        # one more unit appended, counted: still equal
        extra, cost = [human("x")], rng.randint(0, 60)
        for r in recs:
            r.extend(extra, [cost])
        msgs += extra
        true.append(cost)


def test_records_match_identity_equality_and_errors():
    from jianmu_fast.message import Message, ai, human, system

    for core in _cores():
        a, b = system("s"), human("q")
        rec = core.Records(Message)
        assert rec.advance([a, b], lambda new: [1] * len(new)) == 2
        twin = b.model_copy()  # equal, not the same object: matches and replaces the recorded one
        assert rec.match([a, twin, human("r")]) == 1 and rec.msgs[1] is twin
        assert rec.match([a]) == -1 and rec.match([a, ai("other")]) == -1
        # another user message in its place: the record takes it with a new count (advance)
        assert rec.match([a, human("other")]) == 0 and rec.msgs[1] is twin
        assert rec.advance([a, twin, {"role": "user", "content": "x"}], len) == -2 and rec.n == 2
        with pytest.raises(ValueError, match=r"counts\[2\] must be -1 \(not counted\) or between 0 and 2\*\*53, got 9007199254740993"):
            rec.extend([human("x")], [2**53 + 1])
        with pytest.raises(ValueError, match=r"counts has 2 entries, new has 1"):
            rec.extend([human("x")], [1, 2])
        with pytest.raises(ValueError, match=r"index\[0\] must be a record position \(0..1\), got 2"):
            rec.set_counts([2], [1])
        with pytest.raises(ValueError, match=r"values\[0\] must be -1 \(not counted\) or between 0 and 2\*\*53, got -2"):
            rec.set_counts([1], [-2])
        with pytest.raises(ValueError, match=r"budget must be between 0 and 2\*\*53, got -1"):
            rec.plan(-1, 1, True)
        with pytest.raises(ValueError, match=r"need 0 <= n_pinned <= lo <= hi <= 2, got 0, 1, 3"):
            rec.sanitize(0, 1, 3)
        assert rec.n == 2 and rec.counts.tolist() == [1, 1]


@given(steps=st.lists(st.tuples(sanitize_units, st.booleans()), min_size=1, max_size=8), data=st.data())
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 2))
def test_records_window_is_advance_plan_and_slice_on_both_twins(steps, data):
    """``window`` (the agent loop's turn in one call) equals advance + plan + sanitize +
    the output slice on both twins, or says None exactly when the general path must decide."""
    from jianmu_fast.message import tool

    recs = _record_cores()
    refs = _record_cores()
    history: list = []
    for units, repeat in steps:
        new = _record_messages(units)
        history.extend(new)
        costs = data.draw(st.lists(st.integers(0, 30), min_size=len(new), max_size=len(new)))
        settings_ = (data.draw(st.integers(0, 15)), data.draw(st.booleans()), data.draw(st.sampled_from([0, 0, 7])),
                     data.draw(st.booleans()))
        budget = data.draw(st.integers(0, 200))
        sanitize = data.draw(st.booleans())
        for _ in range(2 if repeat else 1):
            got = [r.window(history, lambda new_: costs, budget, settings_, sanitize) for r in recs]
            assert all(g == got[0] for g in got)
            for ref in refs:
                assert ref.advance(history, lambda new_: costs) >= 0
                status, k, lo, hi = ref.plan(budget, *settings_)
                if status or k == ref.n or lo == hi:
                    assert got[0] is None
                else:
                    clean = sanitize and ref.sanitize(k, lo, hi) == 0
                    assert got[0] == (history[:k] + history[lo:hi], clean)
    stranger = tool("x", tool_call_id="nobody's")  # no record can take it: shares no prefix
    assert [r.window([stranger] + history, len, 5, (1, True, 0, False), False) for r in recs if r.n] == \
        [None] * sum(1 for r in recs if r.n)
    for r in recs:
        with pytest.raises(ValueError, match=r"settings must be \(pinned_mask, from_start, chunk, pinned_free\)"):
            r.window(history, len, 5, (1, True), False)


@given(steps=st.lists(st.tuples(sanitize_units, st.integers(0, 3)), min_size=1, max_size=8), data=st.data())
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 2))
def test_records_window_with_insert_on_both_twins(steps, data):
    """``window(..., insert=(message, at, lo))`` (the summarizing budget's unchanged turn):
    the compiled twin equals the reference; a prompt that extends the records and whose plan
    keeps ``at`` pinned messages and cuts at ``lo`` gets the plain window's output with
    ``message`` at ``at`` (the plain window's ``clean``); another decided plan gives the plain
    window with its plan, the records advanced; a prompt that does not extend them gives None
    with the records unchanged."""
    from jianmu_fast.message import human, system

    marker = system("the summary")
    recs = _record_cores()
    refs = _record_cores()
    history: list = []
    for units, how in steps:
        new = _record_messages(units)
        if how == 3 and history:  # an edit in the middle: not an extension
            history = history[:-1] + [human("edited")] + new
        else:
            history = history + new
        costs = data.draw(st.lists(st.integers(0, 30), min_size=len(history), max_size=len(history)))
        count = lambda new_: costs[len(costs) - len(new_):]  # noqa: E731
        settings_ = (data.draw(st.integers(0, 15)), data.draw(st.booleans()), data.draw(st.sampled_from([0, 0, 7])),
                     data.draw(st.booleans()))
        budget = data.draw(st.integers(0, 200))
        sanitize = data.draw(st.booleans())
        before = [(r.n, r.msgs) for r in recs]
        extends = recs[0].match(history) >= 0 and history[:recs[0].n] == recs[0].msgs  # (no patch pending)
        status, k, lo, hi = 1, 0, 0, 0
        if extends:
            assert all(ref.advance(history, count) >= 0 for ref in refs)
            status, k, lo, hi = refs[0].plan(budget, *settings_)
        at, cut = (k, lo) if data.draw(st.booleans()) else (data.draw(st.integers(0, 5)), data.draw(st.integers(0, 9)))
        got = [r.window(history, count, budget, settings_, sanitize, (marker, at, cut)) for r in recs]
        assert all(g == got[0] for g in got)
        if not extends:
            assert got[0] is None and [(r.n, r.msgs) for r in recs] == before
            for r in recs + refs:  # the general path's turn (a rewind) brings them up to date
                r.window(history, count, budget, settings_, sanitize)
            continue
        if status or k == refs[0].n or lo == hi:
            assert got[0] is None
        elif (at, cut) != (k, lo):  # the cut moved: the plain window and its plan
            clean = sanitize and refs[0].sanitize(k, lo, hi) == 0
            assert got[0] == (history[:k] + history[lo:hi], clean, k, lo)
        else:
            clean = sanitize and refs[0].sanitize(k, lo, hi) == 0
            out, flag = got[0]
            assert out == history[:k] + [marker] + history[lo:hi] and out[k] is marker and flag == clean
        assert all(r.n == len(history) and r.msgs == history for r in recs)
    for r in recs:
        with pytest.raises(ValueError, match=r"insert must be \(message, at, lo\), got \(1, 2\)"):
            r.window(history, len, 5, (1, True, 0, False), False, (1, 2))


def _fold_walk(msgs, counts, lo, hi, acc, units, level, fold):
    """The definition (``SummarizingBudgetFilter._folds``' walk over the messages)."""
    points = []
    for i in range(lo, hi):
        if msgs[i].role != "tool":
            if acc >= level:
                points.append((i, acc, units))
                level = (acc // fold + 1) * fold
            units += 1
        acc += counts[i]
    return points, units, acc


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_records_folds_equal_on_both_twins_and_the_walk(units, data):
    """``Records.folds`` (the rolling summary's fold points read off the records) equals the
    walk over the messages on both twins; None exactly when a count in the range is unknown or
    the tokens pass 2**62."""
    msgs = _record_messages(units)
    n = len(msgs)
    big = data.draw(st.booleans())
    pool = st.sampled_from([0, 3, 2**53]) if big else st.integers(0, 40)
    counts = data.draw(st.lists(st.one_of(pool, st.just(-1)) if data.draw(st.booleans()) else pool,
                                min_size=n, max_size=n))
    recs = _record_cores()
    for r in recs:
        r.extend(msgs, counts)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    acc = data.draw(st.one_of(st.integers(0, 100), st.just(2**62)))
    units_ = data.draw(st.integers(0, 50))
    fold = data.draw(st.one_of(st.integers(1, 50), st.just(2**53)))
    level = data.draw(st.one_of(st.integers(0, 120), st.just(2**62)))
    got = [r.folds(lo, hi, acc, units_, level, fold) for r in recs]
    assert all(g == got[0] for g in got)
    part = counts[lo:hi]
    walked = _fold_walk(msgs, counts, lo, hi, acc, units_, level, fold) if min(part, default=0) >= 0 else None
    passes = walked is not None and any(acc + sum(part[:j + 1]) > 2**62 for j in range(len(part)))
    assert got[0] == (None if passes else walked)
    for r in recs:
        with pytest.raises(ValueError, match=rf"need 0 <= lo <= hi <= {n}, got 1, 0"):
            r.folds(1, 0, 0, 0, 0, 1)
        with pytest.raises(ValueError, match=r"units must be between 0 and 2\*\*62, got -1"):
            r.folds(0, 0, 0, -1, 0, 1)
        with pytest.raises(ValueError, match=r"level must be between 0 and 2\*\*62, got 4611686018427387905"):
            r.folds(0, 0, 0, 0, 2**62 + 1, 1)
        with pytest.raises(ValueError, match=r"fold must be between 1 and 2\*\*53, got 0"):
            r.folds(0, 0, 0, 0, 0, 0)


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_records_joined_equals_on_both_twins_and_the_definition(units, data):
    """``Records.joined`` (the summarizing budget's content digests of a span, looked up by
    message identity) equals the concatenation over the recorded messages on both twins, or
    None exactly when one has no entry."""
    msgs = _record_messages(units)
    n = len(msgs)
    recs = _record_cores()
    for r in recs:
        r.extend(msgs)
    have = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    values = {id(m): data.draw(st.binary(max_size=4)) for m, h in zip(msgs, have) if h}
    values[id(object())] = b"other"  # an entry for no recorded message
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    got = [r.joined(values, lo, hi) for r in recs]
    assert all(g == got[0] for g in got)
    want = None if not all(have[lo:hi]) else b"".join(values[id(m)] for m in msgs[lo:hi])
    assert got[0] == want
    for r in recs:
        with pytest.raises(ValueError, match=rf"need 0 <= lo <= hi <= {n}, got 0, {n + 1}"):
            r.joined(values, 0, n + 1)
        if n:
            with pytest.raises(TypeError, match=r"values: expected bytes, got str"):
                r.joined({id(msgs[0]): "x"}, 0, 1)


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_records_fold_keys_equal_on_both_twins_and_the_hash_chain(units, data):
    """``Records.fold_keys`` (the rolling summary's fold points with their content keys) equals
    on both twins the fold walk from ``first`` plus a sha256 chain over the messages' values
    from ``lo`` (the first piece after ``key``, each next one after the previous key); a
    ``known`` key of ``[lo, first)`` is the key of a point at ``first`` (given right, the
    result is the one without it); None exactly when a count or a value is missing."""
    import hashlib

    msgs = _record_messages(units)
    n = len(msgs)
    counts = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    if n and data.draw(st.integers(0, 5)) == 0:
        counts[data.draw(st.integers(0, n - 1))] = -1
    recs = _record_cores()
    for r in recs:
        r.extend(msgs, counts)
    have = [data.draw(st.integers(0, 9)) > 0 for _ in msgs]
    values = {id(m): data.draw(st.binary(min_size=1, max_size=4)) for m, h in zip(msgs, have) if h}
    lo = data.draw(st.integers(0, n))
    first = data.draw(st.integers(lo, n))
    hi = data.draw(st.integers(first, n))
    acc, units_, fold = data.draw(st.integers(0, 60)), data.draw(st.integers(0, 9)), data.draw(st.integers(1, 40))
    level = data.draw(st.integers(0, 80))
    key = data.draw(st.binary(max_size=8))
    right = None if not all(have[lo:first]) else hashlib.sha256(key + b"".join(values[id(m)] for m in msgs[lo:first])).digest()
    known = data.draw(st.sampled_from([None, right, b"K" * 32]))
    got = [r.fold_keys(lo, first, hi, acc, units_, level, fold, key, known, values) for r in recs]
    assert all(g == got[0] for g in got)
    walked = _fold_walk(msgs, counts, first, hi, acc, units_, level, fold) if min(counts[first:hi], default=0) >= 0 else None
    points, u, a = walked if walked is not None else ([], 0, 0)
    want = []
    start, k = lo, key
    for e, tokens, n_units in [*points, (hi, -1, u)]:
        if known is not None and e == first and tokens >= 0:
            k = known
        elif not all(have[start:e]):
            k = None
            break
        else:
            k = hashlib.sha256(k + b"".join(values[id(m)] for m in msgs[start:e])).digest()
        want.append((e, tokens, n_units, k))
        start = e
    if walked is None or k is None:
        assert got == [None] * len(recs)
    else:
        assert got[0] == (want, u, a)
        if known is right and right is not None:  # the known key changes nothing
            assert got[0] == recs[0].fold_keys(lo, first, hi, acc, units_, level, fold, key, None, values)
    for r in recs:
        with pytest.raises(ValueError, match=r"need 0 <= lo <= first <= hi, got 1, 0, 0"):
            r.fold_keys(1, 0, 0, 0, 0, 0, 1, b"", None, values)
        with pytest.raises(TypeError, match=r"key and known: expected bytes \(known: or None\), got str"):
            r.fold_keys(0, 0, 0, 0, 0, 0, 1, b"", "k", values)


@given(units=sanitize_units, data=st.data())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_records_fold_step_equals_on_both_twins_and_the_fold_keys_walk(units, data):
    """``Records.fold_step`` (the summarizer's cached rolling step in one call) equals on both
    twins the walk it stands for: ``fold_keys`` from the chain's last fold point, each key
    looked up in ``by_content``, the new chain; None when the chain is another records', another
    version's or another start's, when the span does not grow past its end, when a count or a
    value is missing or a step's summary is not cached."""
    msgs = _record_messages(units)
    n = len(msgs)
    counts = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    if n and data.draw(st.integers(0, 5)) == 0:
        counts[data.draw(st.integers(0, n - 1))] = -1
    recs = _record_cores()
    for r in recs:
        r.extend(msgs, counts)
    values = {id(m): data.draw(st.binary(min_size=1, max_size=4)) for m in msgs if data.draw(st.integers(0, 40)) > 0}
    a = data.draw(st.integers(0, n))
    end = data.draw(st.integers(0, n - a))
    fold = data.draw(st.integers(1, 40))
    b = data.draw(st.integers(min(n, a + end + 1), n)) if data.draw(st.integers(0, 5)) else data.draw(st.integers(a, n))
    # the chain of [a, a + end) as the summarizer leaves it (its last fold point, the key there)
    first = recs[0].fold_keys(a, a, a + end, 0, 0, fold, fold, b"", None, values)
    if first is None:
        lo, cum, units0, key, text, acc, units_, known = 0, 0, 0, b"", None, 0, 0, None
    else:
        ends, units_, acc = first
        lo, cum, units0, key, text, known = 0, 0, 0, b"", None, ends[-1][3]
        for e, before, n_units, k in ends[:-1]:
            lo, cum, units0, key, text = e - a, before, n_units, k, f"s{e}"
        units_ -= units0
    out = ("old", 1)
    by_content: dict[bytes, str] = {}
    walked = recs[0].fold_keys(a + lo, a + end, b, acc, units_, (cum // fold + 1) * fold, fold, key, known, values) \
        if end < b - a else None
    for e, before, n_units, k in (walked[0] if walked is not None else []):
        if data.draw(st.integers(0, 11)):
            by_content[k] = f"t{e}"
    version = data.draw(st.sampled_from([None, -1]))
    for r in recs:
        chain = (None, r, r.version if version is None else version, a, lo, cum, units0, key, text, end, acc, units_,
                 known, out)
        got = r.fold_step(chain, a, b, fold, values, by_content)
        want = None
        if version is None and walked is not None and all(k in by_content for *_, k in walked[0]):
            ends, u, acc2 = walked
            lo2, cum2, key2, text2, pu = lo, cum, key, text, 0
            for e, before, n_units, k in ends[:-1]:
                lo2, cum2, key2, text2, pu = e - a, before, k, by_content[k], n_units
            want = (None, r, r.version, a, lo2, cum2, units0 + pu, key2, text2, b - a, acc2, u - pu, ends[-1][3],
                    (by_content[ends[-1][3]], units0 + u))
        assert got == want
        other = recs[0] if r is not recs[0] else recs[-1]
        if other is not r:  # another records' chain never applies
            assert r.fold_step((None, other, *chain[2:]), a, b, fold, values, by_content) is None
        assert r.fold_step(chain, a + 1, b + 1, fold, values, by_content) is None
        with pytest.raises(TypeError, match=r"chain: expected a 14-tuple, got list"):
            r.fold_step(list(chain), a, b, fold, values, by_content)
        with pytest.raises(ValueError, match=r"fold must be between 1 and 2\*\*53, got 0"):
            r.fold_step(chain, a, b, 0, values, by_content)


@needs_c
def test_records_version_counts_the_rewinds_on_both_twins():
    """``Records.version`` changes exactly when recorded messages are dropped (``truncate``, a
    rewind in ``advance`` or ``window``), never when records are appended or counted."""
    from jianmu_fast.message import human, system

    history = [system("s"), human("a"), human("b")]
    versions = []
    for core in (core_py, core_c):
        rec = core.Records(type(history[0]))
        seen = [rec.version]
        rec.extend(history, [1, 1, 1])
        rec.set_counts([1], [2])
        seen.append(rec.version)
        assert rec.advance(history + [human("c")], lambda new: [1] * len(new)) == 1
        seen.append(rec.version)
        assert rec.advance(history[:2] + [human("x")], lambda new: [1] * len(new)) == 1  # a rewind
        seen.append(rec.version)
        rec.truncate(rec.n)
        seen.append(rec.version)
        versions.append(seen)
    assert versions[0] == versions[1] == [0, 0, 0, 1, 2]


def test_records_window_survives_a_count_that_shortens_the_list():
    """A counter that edits the caller's list while counting cannot make the compiled turn
    read past the list's end: the turn says None and the caller starts over."""
    from jianmu_fast.message import human, system

    for core in _cores():
        history = [system("s"), human("a"), human("b")]
        rec = core.Records(type(history[0]))
        assert rec.window(history, lambda new: [1] * len(new), 100, (1, True, 0, False), False) is not None
        history.append(human("c"))

        def shrinking(new):
            del history[:]
            return [1] * len(new)

        assert rec.window(history, shrinking, 100, (1, True, 0, False), False) is None
        assert rec.match([]) == -1


# -- Records after an edit in the middle: the common prefix is kept, the rest re-appended ----

def _canonical_ids(rec):
    """The records' call and result ids renamed by first use (fresh records number ids in
    that order; records that kept a prefix may number them otherwise, ids only being added)."""
    names: dict = {}
    rename = lambda v: -1 if v == -1 else names.setdefault(v, len(names))  # noqa: E731
    off, ids, rids = rec.call_off.tolist(), rec.call_ids.tolist(), rec.result_ids.tolist()
    out = []
    for i in range(rec.n):
        out.append((tuple(rename(v) for v in ids[off[i]:off[i + 1]]), rename(rids[i])))
    return out


def _state(rec):
    return (rec.roles.tolist(), rec.counts.tolist(), rec.call_off.tolist(), _canonical_ids(rec), rec.n)


def _edited(history, data):
    """``history`` after a random edit at a random position: a message replaced by one of the
    same role with other content (ids kept), deleted, inserted, or the list truncated."""
    from jianmu_fast.message import human

    out = list(history)
    kind = data.draw(st.sampled_from(["replace", "delete", "insert", "truncate", "replace"]))
    if not out or kind == "insert":
        out.insert(data.draw(st.integers(0, len(out))), human(f"inserted {data.draw(st.integers(0, 9))}"))
    elif kind == "replace":
        i = data.draw(st.integers(0, len(out) - 1))
        m = out[i]
        out[i] = m.model_copy(update={"content": f"{m.content or ''} [edited {data.draw(st.integers(0, 9))}]"})
    elif kind == "delete":
        del out[data.draw(st.integers(0, len(out) - 1))]
    else:
        del out[data.draw(st.integers(0, len(out))):]
    return out


@given(steps=st.lists(st.tuples(sanitize_units, st.integers(0, 2), st.booleans()), min_size=1, max_size=8),
       data=st.data())
@settings(deadline=None, max_examples=max(60, MAX_EXAMPLES // 2))
def test_records_after_an_edit_equal_fresh_records_on_both_twins(steps, data):
    """A growing history edited at random positions (replace, delete, insert, truncate):
    after ``advance``/``window`` the records equal fresh records of the edited list (ids
    compared up to their numbering), twin == compiled exactly (numbering included), and they
    plan and sanitize as ``plan_window``/``sanitize_window`` over those arrays."""
    from jianmu_fast.message import Message

    cost = {}  # one count per message object, as a counter's cache gives

    def count_of(m):
        return cost.setdefault(id(m), (len(str(m.content)) * 7 + len(m.role)) % 41)

    recs = _record_cores()
    keep = []  # every message stays alive, so id() in ``cost`` stays unique
    history: list = []
    for units, how, windowed in steps:
        history = history + _record_messages(units)
        if history and data.draw(st.booleans()):
            history = _edited(history, data)
        keep.append(history)
        counted = how != 0  # 0: appended records stay uncounted (the filter counts on demand)
        count = (lambda new: [count_of(m) for m in new]) if counted else (lambda new: None)
        if windowed and counted:
            settings_ = (data.draw(st.integers(0, 15)), data.draw(st.booleans()),
                         data.draw(st.sampled_from([0, 0, 7])), data.draw(st.booleans()))
            budget = data.draw(st.integers(0, 200))
            got = [r.window(history, count, budget, settings_, True) for r in recs]
            assert all(g == got[0] for g in got)
        got_k = [r.advance(history, count) for r in recs]  # 0 after a window that recorded it
        assert all(k == got_k[0] for k in got_k)
        if got_k[0] == -1:  # shares no prefix: the caller starts over
            recs = _record_cores()
            for r in recs:
                r.extend(history, count(history) if history else None)
        assert [r.n for r in recs] == [len(history)] * len(recs)
        if how == 2 and history:  # fill some counts, as the filter does when asked
            index = data.draw(st.lists(st.integers(0, len(history) - 1), max_size=4, unique=True))
            for r in recs:
                r.set_counts(np.array(index, dtype=np.int64), [count_of(history[i]) for i in index])
        fresh = core_py.Records(Message)
        fresh.extend(history, None)
        views = [(r.roles.tolist(), r.call_off.tolist(), r.call_ids.tolist(), r.result_ids.tolist(), r.n,
                  r.interned, r.counts.tolist()) for r in recs]
        assert all(v == views[0] for v in views)
        assert all(r.msgs == history and all(a is b for a, b in zip(r.msgs, history)) for r in recs)
        assert [_state(r)[0] for r in recs] == [_state(fresh)[0]] * len(recs)
        assert [_state(r)[2:] for r in recs] == [_state(fresh)[2:]] * len(recs)
        counts = recs[0].counts
        known = [c for c in counts.tolist() if c >= 0]
        assert all(c == count_of(m) for c, m in zip(counts.tolist(), history) if c >= 0) and len(known) <= len(history)
        roles = recs[0].roles
        for _ in range(2):
            mask = data.draw(st.integers(0, 15))
            budget = data.draw(st.one_of(st.integers(0, 300), st.just(2**53)))
            from_start = data.draw(st.booleans())
            chunk = data.draw(st.sampled_from([0, 0, 5])) if from_start else 0
            free = data.draw(st.booleans())
            want = core_py.plan_window(roles, counts, mask, budget, from_start, chunk, free)
            assert [r.plan(budget, mask, from_start, chunk, free) for r in recs] == [want] * len(recs)
        if history:
            n = len(history)
            k = data.draw(st.integers(0, n))
            lo = data.draw(st.integers(k, n))
            hi = data.draw(st.integers(lo, n))
            want_s = core_py.sanitize_window(fresh.roles, fresh.call_off, fresh.call_ids, fresh.result_ids, k, lo, hi)[0]
            assert [r.sanitize(k, lo, hi) for r in recs] == [want_s] * len(recs)



@given(steps=st.lists(st.tuples(sanitize_units, st.booleans()), min_size=1, max_size=12), data=st.data())
@settings(deadline=None, max_examples=max(60, MAX_EXAMPLES // 2))
def test_records_sanitize_from_the_kept_scan_equals_the_full_check_on_both_twins(steps, data):
    """The compiled records sanitize ``[:n_pinned] + [lo:hi]`` from a scan of all records kept
    between calls (resumed at its last unit as records are appended, anew after an edit): on
    a history grown a few messages at a time and edited now and then, many windows per step
    (their bounds mostly at unit starts, as the planner cuts, some anywhere) give what
    ``sanitize_window`` gives over the same arrays, on both twins."""
    recs = _record_cores()
    history: list = []
    keep = []
    for units, edit in steps:
        history = history + _record_messages(units)
        if edit and history and data.draw(st.booleans()):
            history = _edited(history, data)
        keep.append(history)
        got = [r.advance(history, lambda new: [1] * len(new)) for r in recs]
        if got[0] == -1:
            recs = _record_cores()
            for r in recs:
                r.extend(history, [1] * len(history))
        n = len(history)
        if not n:
            continue
        roles, off, ids, rids = recs[0].roles, recs[0].call_off, recs[0].call_ids, recs[0].result_ids
        starts = [i for i in range(n + 1) if i == n or roles[i] != 3]  # unit (or message) starts
        bound = lambda a: st.one_of(st.sampled_from([i for i in starts if i >= a]), st.integers(a, n))  # noqa: E731
        for _ in range(6):
            k = data.draw(st.sampled_from([0, 0, 1, 2])) if n >= 2 else 0
            lo = data.draw(bound(k))
            hi = data.draw(bound(lo))
            want = core_py.sanitize_window(roles, off, ids, rids, k, lo, hi)[0]
            assert [r.sanitize(k, lo, hi) for r in recs] == [want] * len(recs), (k, lo, hi)



@pytest.mark.parametrize("units", [
    # a pinned unit that a tool result after a cut would complete (joined in the prompt, apart in the records)
    [("call", [1, 2], [1]), ("user", [], []), ("tool", [], [2]), ("user", [], [])],
    [("system", [], []), ("call", [1], [1]), ("tool", [], [1]), ("user", [], []), ("call", [2, 3], [3, 2]),
     ("assistant", [], []), ("tool", [], [3]), ("call", [1], []), ("system", [], [])],
    [("call", [1], []), ("tool", [], [-1]), ("user", [], []), ("call", [2], [2]), ("call", [3], [2])],
])
def test_records_sanitize_from_the_kept_scan_on_every_window(units):
    """Every window ``[:k] + [lo:hi]`` of histories grown a message at a time, where a unit of
    the pinned prefix meets a tool result after the cut: the kept scan equals the full check."""
    msgs = _record_messages(units)
    recs = _record_cores()
    for n in range(1, len(msgs) + 1):
        for r in recs:
            assert r.advance(msgs[:n], lambda new: [1] * len(new)) == 1
        roles, off, ids, rids = recs[0].roles, recs[0].call_off, recs[0].call_ids, recs[0].result_ids
        for k in range(n + 1):
            for lo in range(k, n + 1):
                for hi in range(lo, n + 1):
                    want = core_py.sanitize_window(roles, off, ids, rids, k, lo, hi)[0]
                    assert [r.sanitize(k, lo, hi) for r in recs] == [want] * len(recs), (n, k, lo, hi)


def test_records_edit_keeps_the_common_prefix_and_bounds_the_id_table():
    """An edit that keeps the record's role and ids (a cleared result) is patched in place (the
    count callback sees that message only); another re-appends only what follows it;
    ``truncate`` checks its argument; a table of ids grown past twice the ids in use plus
    64 makes the records decline (-1: the caller starts over with fresh records)."""
    from jianmu_fast.message import Message, ai, human, system, tool

    def call(i):
        return [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]

    for core in _cores():
        history = [system("s"), human("q"), ai(None, tool_calls=call(0)), tool("r", tool_call_id="c0"), human("z")]
        rec = core.Records(Message)
        seen = []
        counting = lambda new: (seen.append(list(new)), [3] * len(new))[1]  # noqa: E731
        assert rec.advance(history, counting) == 5
        history[3] = tool("[cleared]", tool_call_id="c0")  # the same role and id: patched in place
        version = rec.version
        assert rec.advance(history, counting) == 0 and seen[-1] == [history[3]] and rec.msgs[3] is history[3]
        assert rec.version == version + 1
        history[4] = ai("z")  # another role: the records from there on are redone
        assert rec.advance(history, counting) == 1 and seen[-1] == history[4:]
        assert rec.result_ids.tolist() == [-1, -1, -1, 0, -1] and rec.interned == 1
        assert rec.advance(history[:2], counting) == 0 and rec.n == 2 and len(seen) == 3
        assert rec.call_off.tolist() == [0, 0, 0] and rec.call_ids.tolist() == []
        with pytest.raises(ValueError, match=r"k must be between 0 and 2, got 3"):
            rec.truncate(3)
        assert rec.advance([system("other")], counting) == -1 and rec.n == 2
        # many conversations sharing one system prompt: the id table stays bounded
        for j in range(200):
            convo = [history[0]] + [ai(None, tool_calls=call(f"{j}_{i}")) for i in range(3)]
            k = rec.advance(convo, lambda new: [1] * len(new))
            if k == -1:
                rec = core.Records(Message)
                rec.extend(convo, [1] * 4)
            assert rec.n == 4 and rec.interned <= 2 * (3 + 4) + 64 + 3


@given(units=st.lists(sanitize_units, min_size=1, max_size=4), data=st.data())
@settings(deadline=None, max_examples=max(60, MAX_EXAMPLES // 3))
def test_records_patched_in_place_plan_as_fresh_records_on_both_twins(units, data):
    """A clearing step: several messages replaced at once by copies with the same role and
    ids (other content, another count). ``window`` patches those records in place (only
    they are counted again; ``version`` moves on) and decides as fresh records of the edited
    prompt do, on both twins; more changes than ``32 + n // 8`` or one that changes a role or
    an id redo the records from the first change instead, with the same outcome."""
    cost = {}

    def count(new):
        return [cost.setdefault(id(m), (len(str(m.content)) * 7 + len(m.role)) % 41) for m in new]

    history: list = []
    keep = []
    for u in units:
        history = history + _record_messages(u)
    if not history:
        return
    recs = _record_cores()
    settings_ = (data.draw(st.integers(0, 15)), True, data.draw(st.sampled_from([0, 0, 7])), False)
    budget = data.draw(st.integers(0, 200))
    for r in recs:
        r.window(history, count, budget, settings_, True)
    for _ in range(3):
        where = data.draw(st.lists(st.integers(0, len(history) - 1), max_size=len(history), unique=True))
        edited = list(history)
        for i in where:
            m = edited[i]
            if data.draw(st.integers(0, 9)) == 0:  # now and then a new role: not patchable
                edited[i] = m.model_copy(update={"role": "user", "tool_calls": None, "tool_call_id": None})
            else:
                edited[i] = m.model_copy(update={"content": f"[cleared {data.draw(st.integers(0, 9))}]"})
        keep.append(history)
        history = edited
        versions = [r.version for r in recs]
        got = [r.window(history, count, budget, settings_, True) for r in recs]
        assert all(g == got[0] for g in got)
        fresh = _record_cores()[0]
        want = fresh.window(history, count, budget, settings_, True)
        assert got[0] is None or got[0] == want
        if got[0] is None:  # the general path's turn brings them up to date (or starts anew)
            if [r.advance(history, count) for r in recs][0] == -1:
                recs = _record_cores()
                versions = [-1] * len(recs)
                for r in recs:
                    r.extend(history, count(history))
        elif where and all(history[i].role == keep[-1][i].role for i in where):
            assert got[0] == want  # every change patched: the compiled turn decided
        assert all(r.msgs == history and all(a is b for a, b in zip(r.msgs, history)) for r in recs)
        assert all(c == cost[id(m)] for r in recs for c, m in zip(r.counts.tolist(), history) if c >= 0)
        if any(history[i] != keep[-1][i] for i in where):
            assert all(r.version > v for r, v in zip(recs, versions))
        for r in recs:  # (ids compared up to their numbering)
            assert r.roles.tolist() == fresh.roles.tolist()
            assert (r.result_ids >= 0).tolist() == (fresh.result_ids >= 0).tolist()


@given(units=st.lists(sanitize_units, min_size=1, max_size=4), data=st.data())
@settings(deadline=None, max_examples=max(60, MAX_EXAMPLES // 3))
def test_records_hint_gives_what_match_gives_without_it_on_both_twins(units, data):
    """``Records.hint`` (a clearing step's changed positions, handed on by the builder): the
    hinted ``window`` returns what the same records return without the hint (or, where those
    return None for a record left uncounted, what fresh records return), and leave the same
    records (the same messages, counts, roles and ids), on both twins, for true hints and
    for hints that do not hold (a position whose record is not the named original, a change
    outside the named positions, another list, positions out of order): those are dropped and
    the records compare as usual. A hint is used once."""
    from jianmu_fast.message import human

    def count(new):
        return [(len(str(m.content)) * 7 + len(m.role)) % 41 for m in new]

    history: list = []
    for u in units:
        history = history + _record_messages(u)
    if not history:
        return
    hinted, plain = _record_cores(), _record_cores()
    settings_ = (data.draw(st.integers(0, 15)), True, data.draw(st.sampled_from([0, 0, 7])), False)
    budget = data.draw(st.integers(0, 200))
    for r in hinted + plain:
        r.window(history, count, budget, settings_, True)
    for _ in range(3):
        where = sorted(data.draw(st.lists(st.integers(0, len(history) - 1), max_size=len(history), unique=True)))
        edited = list(history)
        for i in where:
            edited[i] = edited[i].model_copy(update={"content": f"[cleared {data.draw(st.integers(0, 9))}]"})
        patched, originals = list(where), [history[i] for i in where]
        lie = data.draw(st.sampled_from(["none", "none", "original", "outside", "list", "order"]))
        if lie == "original" and patched:
            originals[0] = human("not the record")
        elif lie == "outside":
            j = data.draw(st.integers(0, len(edited) - 1))
            if j not in where:
                edited[j] = human(f"changed outside {j}")
        elif lie == "order" and len(patched) > 1:
            patched.reverse()
        edited += _record_messages(data.draw(sanitize_units))[: data.draw(st.integers(0, 3))]
        # the patched messages' counts, given with the hint (a clearing step's own counts of its copies)
        counts = count([edited[i] for i in patched]) if data.draw(st.booleans()) else None
        for r in hinted:
            r.hint(list(edited) if lie == "list" else edited, patched, originals, counts)
        got = [r.window(edited, count, budget, settings_, True) for r in hinted]
        want = [r.window(edited, count, budget, settings_, True) for r in plain]
        fresh = [r.window(edited, count, budget, settings_, True) for r in _record_cores()]
        assert all(x == fresh[0] for x in fresh)
        assert all(g == got[0] for g in got) and all(w == want[0] for w in want)
        # the same answer, or None (the general path's turn) where a record is uncounted: a
        # hinted message equal to its original is patched (counted) where plain records adopt it
        assert want[0] is None or got[0] == want[0]
        assert all(x is None or x == fresh[0] for x in (got[0], want[0]))
        for recs in (hinted, plain):  # the general path's turn brings them up to date (or starts anew)
            if want[0] is not None:
                continue
            if [r.advance(edited, count) for r in recs][0] == -1:
                recs[:] = _record_cores()
                for r in recs:
                    r.extend(edited, count(edited))
        # the same records (a rewind may leave re-appended records uncounted where a patch counts them)
        states = [(r.roles.tolist(), r.call_off.tolist(), _canonical_ids(r), r.n) for r in hinted + plain]
        assert all(st_ == states[0] for st_ in states)
        assert all(all(a is b for a, b in zip(r.msgs, edited)) and r.n == len(edited) for r in hinted + plain)
        assert all(c == count([m])[0] for r in hinted + plain for c, m in zip(r.counts.tolist(), edited) if c >= 0)
        history = edited
    for r in hinted:  # used once: a later match over the list compares as usual
        r.hint(history, [0], [human("x")])
        assert r.match(history) == 0 and r.match(history) == 0


@given(steps=st.lists(st.tuples(sanitize_units, st.integers(0, 3)), min_size=1, max_size=8), data=st.data())
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 2))
def test_records_window_with_known_counts_on_both_twins(steps, data):
    """``window(..., known=(ref, counts, ...))`` (the clearing stage's records handed to the
    budget filter after it): the new messages that are ``ref``'s own objects take their counts
    from ``counts`` and ``count`` is not called for them; the output and the records equal
    those of the same turn without ``known``, on both twins, when ``ref`` holds the history's
    objects, others (a cleared copy in its place), is shorter, or the turn appends more than
    ``KNOWN_MAX`` messages; a malformed ``known`` is a TypeError."""
    import array

    from jianmu_fast import _filter_core

    assert core_py.KNOWN_MAX == _filter_core.KNOWN_MAX == 16

    def count(new):
        return [(len(str(m.content)) * 5 + len(m.role)) % 37 for m in new]

    known_recs, plain = _record_cores(), _record_cores()
    history: list = []
    calls: list = []
    for units, how in steps:
        history = history + _record_messages(units) * (9 if how == 3 else 1)
        ref = list(history)
        if how == 1 and ref:  # another object at a position (a cleared copy): counted by count()
            j = data.draw(st.integers(0, len(ref) - 1))
            ref[j] = ref[j].model_copy(update={"content": "[cleared]"})
        elif how == 2:
            ref = ref[: data.draw(st.integers(0, len(ref)))]
        counts = array.array("q", count(ref))
        settings_ = (data.draw(st.integers(0, 15)), data.draw(st.booleans()), data.draw(st.sampled_from([0, 0, 7])),
                     False)
        budget = data.draw(st.integers(0, 200))

        def counting(new):
            calls.append(len(new))
            return count(new)

        got = [r.window(history, counting, budget, settings_, True, None, (ref, counts, "counter")) for r in known_recs]
        want = [r.window(history, count, budget, settings_, True) for r in plain]
        assert all(g == want[0] for g in got + want)
        for recs in (known_recs, plain):  # the general path's turn brings them up to date
            if want[0] is None and [r.advance(history, count) for r in recs][0] == -1:
                recs[:] = _record_cores()
                for r in recs:
                    r.extend(history, count(history))
        states = [(r.roles.tolist(), r.counts.tolist(), r.call_off.tolist(), _canonical_ids(r), r.n)
                  for r in known_recs + plain]
        assert all(st_ == states[0] for st_ in states)
    for r in known_recs:
        for bad in ((history,), (history, [1] * len(history)), (tuple(history), array.array("q")),
                    (history, array.array("i")), [history, array.array("q")]):
            with pytest.raises(TypeError, match=r"known must be a tuple \(ref, counts, \.\.\.\)"):
                r.window(history, count, 5, (1, True, 0, False), False, None, bad)


def test_records_match_survives_a_list_changed_while_comparing():
    """Reading a message's ``content`` (``_unequal``) or its role and ids (``_patchable``) may
    run code that shortens the list being matched: on both twins the match then says -1
    with nothing shared (never a read past the list's end)."""

    class Sly:
        role = "user"
        tool_call_id = None
        tool_calls = None

        def __init__(self, victim, where):
            self.victim, self.where = victim, where

        def __getattribute__(self, name):
            if name in ("content", "role"):
                victim = object.__getattribute__(self, "victim")
                if victim:
                    del victim[object.__getattribute__(self, "where"):]
            return object.__getattribute__(self, name)

    for core in _cores():
        for at in (0, 1):
            rec = core.Records(object)
            plain = [Sly(None, 0) for _ in range(6)]
            rec.extend(plain, [1] * 6)
            msgs = list(plain)
            msgs[at] = Sly(msgs, 1)
            assert rec.match(msgs) == -1 and len(msgs) == 1
            # what is left: a stranger at 0 (nothing shared), or the first recorded message
            assert rec.advance(msgs, len) == (-1 if at == 0 else 0) and rec.n == (6 if at == 0 else 1)
