"""The compiled batch core (``csrc/_batch_core.pyx``) equals its pure-Python reference
(``jianmu_fast/_batch_core_py.py``) on random inputs, errors included, and both equal a
one-line definition."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jianmu_fast._batch_core_py as core_py
from jianmu_fast import _backend
from jianmu_fast.message import Message, ai, human, system, tool

PURE = os.environ.get("JIANMU_FAST_PURE_PYTHON") == "1"
MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
NAMES = ["group_states", "intern_rows", "need_rows", "prefix_prompts", "slice_outputs", "table_records"]

if not PURE:
    import jianmu_fast._batch_core as core_c


def _cores():
    return [core_py] if PURE else [core_py, core_c]


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # the same error type and message on both
        return ("error", type(exc), str(exc))


def _same(a, b):
    """Deep equality of results: arrays by value and dtype, lists of objects by identity."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or a == b


@pytest.mark.skipif(PURE, reason="JIANMU_FAST_PURE_PYTHON=1")
@pytest.mark.parametrize("name", NAMES)
def test_twins_share_signatures_and_the_backend_dispatches(name):
    names = [list(inspect.signature(getattr(core, name)).parameters) for core in (core_c, core_py)]
    assert names[0] == names[1]
    assert getattr(_backend, name) is getattr(core_c, name)


@pytest.mark.skipif(PURE, reason="checks the compiled core")
def test_compiled_stub_is_honest(tmp_path):
    """mypy's stubtest checks jianmu_fast/_batch_core.pyi against the compiled module."""
    pytest.importorskip("mypy")
    import subprocess
    import sys
    from pathlib import Path

    import jianmu_fast

    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n\n[mypy-jianmu_fast.*]\nignore_errors = True\n\n"
                      "[mypy-jianmu_fast._batch_core]\nignore_errors = False\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "jianmu_fast._batch_core", "--mypy-config-file", str(config)],
        capture_output=True, text=True, timeout=300, cwd=Path(jianmu_fast.__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_pure_backend_dispatches_its_twin():
    if PURE:
        for name in NAMES:
            assert getattr(_backend, name) is getattr(core_py, name)


# -- intern_rows ---------------------------------------------------------------------------------

POOL = [human(f"u{i}") for i in range(6)] + [system("s"), ai("a")]


@st.composite
def prompt_lists(draw):
    """Prompts drawn from a small pool of Messages (shared by identity), now and then a bad
    one: a tuple, a string, a dict among the Messages, a Message subclass instance."""
    n = draw(st.integers(0, 12))
    out = []
    for _ in range(n):
        items = draw(st.lists(st.sampled_from(POOL), max_size=8))
        kind = draw(st.sampled_from(["list"] * 6 + ["tuple", "str", "dict", "empty"]))
        if kind == "tuple":
            out.append(tuple(items))
        elif kind == "str":
            out.append("not a prompt")
        elif kind == "dict":
            out.append(items + [{"role": "user", "content": "x"}])
        elif kind == "empty":
            out.append([])
        else:
            out.append(items)
    return out


def _intern_definition(prompts):
    distinct = []
    rows, offsets, bad = [], [0], []
    for p, msgs in enumerate(prompts):
        if type(msgs) is not list or any(type(m) is not Message for m in msgs):
            bad.append(p)
        else:
            for m in msgs:
                if not any(m is d for d in distinct):
                    distinct.append(m)
                rows.append(next(i for i, d in enumerate(distinct) if d is m))
        offsets.append(len(rows))
    return rows, offsets, distinct, bad


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(prompt_lists())
def test_intern_rows_twins_agree_with_the_definition(prompts):
    rows, offsets, distinct, bad = _intern_definition(prompts)
    for core in _cores():
        r, off, d, b = core.intern_rows(prompts, Message)
        assert r.dtype == np.int64 and off.dtype == np.int64
        assert r.tolist() == rows and off.tolist() == offsets and b == bad
        assert len(d) == len(distinct) and all(x is y for x, y in zip(d, distinct))


def test_intern_rows_many_distinct_objects_grow_the_table():
    msgs = [human(str(i)) for i in range(5000)]
    prompts = [msgs[i:i + 7] for i in range(0, 5000, 3)] + [msgs[::-1]]
    want = core_py.intern_rows(prompts, Message)
    for core in _cores():
        assert _same(core.intern_rows(prompts, Message), want)


def test_intern_rows_rejects_a_class_that_is_not_a_type():
    for core in _cores():
        assert _outcome(core.intern_rows, [[]], "Message") == (
            "error", TypeError, "cls must be a type, got str")


# -- table_records -------------------------------------------------------------------------------

ROLE_CODES = dict(_backend.ROLE_CODES)


@st.composite
def message_tables(draw):
    ids = st.sampled_from(["c1", "c2", "c3", "", None])
    out = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["user", "system", "answer", "call", "result"]))
        if kind == "user":
            out.append(human("q"))
        elif kind == "system":
            out.append(system("s"))
        elif kind == "answer":
            out.append(ai("a"))
        elif kind == "call":
            calls = [{"id": draw(ids), "type": "function", "function": {"name": "f", "arguments": "{}"}}
                     for _ in range(draw(st.integers(1, 3)))]
            out.append(Message.model_construct(role="assistant", content=None, tool_calls=calls, tool_call_id=None))
        else:
            out.append(Message.model_construct(role="tool", content="r", tool_calls=None, tool_call_id=draw(ids)))
    return out


def _records_definition(msgs):
    intern: dict = {}

    def num(key):
        return intern.setdefault(key, len(intern)) if key else -1

    roles, off, ids, rids = [], [0], [], []
    for m in msgs:
        code = ROLE_CODES[m.role]
        roles.append(code)
        rids.append(num(m.tool_call_id) if code == 3 else -1)
        if code == 2 and m.tool_calls:
            ids.extend(num(c.get("id")) for c in m.tool_calls)
        off.append(len(ids))
    return roles, off, ids, rids


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(message_tables())
def test_table_records_twins_agree_with_the_definition(msgs):
    want = _records_definition(msgs)
    for core in _cores():
        roles, off, ids, rids = core.table_records(msgs, ROLE_CODES)
        assert roles.dtype == np.int8 and off.dtype == ids.dtype == rids.dtype == np.int64
        assert (roles.tolist(), off.tolist(), ids.tolist(), rids.tolist()) == want


def test_table_records_unknown_role_is_the_same_key_error():
    bad = Message.model_construct(role="robot", content="x", tool_calls=None, tool_call_id=None)
    outs = [_outcome(core.table_records, [human("a"), bad], ROLE_CODES) for core in _cores()]
    assert outs[0] == ("error", KeyError, "'robot'") and all(o == outs[0] for o in outs)


# -- need_rows and slice_outputs -------------------------------------------------------------------


@st.composite
def planned(draw):
    """CSR prompts over a table, plans (status, n_pinned, lo, hi) local to each prompt, and
    counts with -1 where not counted; now and then an invalid plan or offsets."""
    n_tab = draw(st.integers(1, 10))
    sizes = draw(st.lists(st.integers(0, 8), max_size=8))
    rows = [draw(st.integers(0, n_tab - 1)) for _ in range(sum(sizes))]
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
    plans = []
    for size in sizes:
        cuts = sorted(draw(st.lists(st.integers(0, size), min_size=3, max_size=3)))
        plans.append([draw(st.sampled_from([0, 1])), *cuts])
    if plans and draw(st.integers(0, 9)) == 0:  # an out-of-range window
        p = draw(st.integers(0, len(plans) - 1))
        plans[p] = [1, 0, 0, sizes[p] + 1]
    counts = [draw(st.sampled_from([-1, 0, 3, 7])) for _ in range(n_tab)]
    return (np.array(rows, dtype=np.int64), offsets, np.array(plans, dtype=np.int64).reshape(len(sizes), 4),
            np.array(counts, dtype=np.int64))


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(planned())
def test_need_rows_twins_agree_with_the_definition(case):
    rows, offsets, plans, counts = case
    outs = [_outcome(core.need_rows, rows, offsets, plans, counts) for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    if outs[0][0] == "ok":
        want = sorted({int(r) for p in range(len(plans)) if plans[p, 0] == 1
                       for r in rows[offsets[p] + plans[p, 2]:offsets[p] + plans[p, 3]] if counts[r] < 0})
        assert outs[0][1].tolist() == want


def test_need_rows_rejects_bad_offsets_and_rows():
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    for core in _cores():
        assert _outcome(core.need_rows, i64(0, 1), i64(0, 3), i64(1, 0, 0, 2).reshape(1, 4), i64(-1, -1)) == (
            "error", ValueError, "offsets must start at 0 and end at 2")
        assert _outcome(core.need_rows, i64(0, 5), i64(0, 2), i64(1, 0, 0, 2).reshape(1, 4), i64(-1, -1)) == (
            "error", ValueError, "rows[1] must index the records (0..1), got 5")
        assert _outcome(core.need_rows, i64(0), i64(0, 1), i64(1, 0, 0, 1, 0, 0, 0, 0).reshape(2, 4), i64(-1)) == (
            "error", ValueError, "plans must have shape (1, 4), got (2, 4)")


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(planned(), st.booleans())
def test_slice_outputs_twins_agree_with_the_definition(case, tuple_prompt):
    rows, offsets, plans, _ = case
    prompts = [[POOL[int(r) % len(POOL)] for r in rows[offsets[p]:offsets[p + 1]]] for p in range(len(plans))]
    if tuple_prompt and prompts:
        prompts[-1] = tuple(prompts[-1])
    outs = [_outcome(core.slice_outputs, prompts, plans) for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    if outs[0][0] == "ok":
        want = [m[:k] + m[a:b] for m, (_, k, a, b) in zip(prompts, plans.tolist())]
        assert _same(outs[0][1], want)
        assert all(o is not m for o, m in zip(outs[0][1], prompts))  # always new lists


def test_slice_outputs_errors_name_the_prompt():
    for core in _cores():
        assert _outcome(core.slice_outputs, [[human("a")]], np.array([[0, 0, 1, 2]], dtype=np.int64)) == (
            "error", ValueError, "prompt 0: need 0 <= n_pinned <= lo <= hi <= 1, got 0, 1, 2")
        assert _outcome(core.slice_outputs, [[], "x"], np.zeros((2, 4), dtype=np.int64)) == (
            "error", TypeError, "prompts[1] must be a list, got str")
        assert _outcome(core.slice_outputs, [[]], np.zeros((2, 4), dtype=np.int64)) == (
            "error", ValueError, "plans must have shape (1, 4), got (2, 4)")


# -- prefix_prompts and group_states ----------------------------------------------------------------


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(st.lists(st.sampled_from(POOL), max_size=10), st.data())
def test_prefix_prompts_twins_agree_with_the_definition(base, data):
    # hist: the provider's output for base: an item itself, an equal copy (what a provider
    # made for an equal message before), or a changed copy (an annotation)
    kinds = [data.draw(st.sampled_from(["same", "same", "same", "equal", "annotated"])) for _ in base]
    hist = [m if k == "same" else m.model_copy() if k == "equal" else m.model_copy(update={"content": "note"})
            for m, k in zip(base, kinds)]
    head, note = [system("h")], system("note")
    tail = data.draw(st.sampled_from([[], [system("t")]]))
    srcs = []
    for _ in range(data.draw(st.integers(0, 8))):
        k = data.draw(st.integers(0, len(base) + 1))
        src = base[:k]
        kind = data.draw(st.sampled_from(["prefix", "prefix", "longer", "swapped", "tuple"]))
        if kind == "longer":
            src = base + [human("more")]
        elif kind == "swapped" and src:
            src = src[:-1] + [human("other")]
        elif kind == "tuple":
            src = tuple(src)
        srcs.append(src)
    members = np.array(data.draw(st.permutations(range(len(srcs)))), dtype=np.int64)
    results = []
    for core in _cores():
        out = ["untouched"] * len(srcs)
        results.append((_outcome(core.prefix_prompts, head, head + [note], tail, hist, base, srcs, members, out), out))
    assert all(_same(r, results[0]) for r in results)
    want_out, want_missed = ["untouched"] * len(srcs), []
    for i in members.tolist():
        src = srcs[i]
        k = len(src)
        if type(src) is not list or k > len(base) or any(a is not b for a, b in zip(src, base)):
            want_missed.append(i)
        else:
            annotated = any(not (h is b or h == b) for h, b in zip(hist[:k], base[:k]))
            want_out[i] = head + ([note] if annotated else []) + hist[:k] + tail
    assert _same(results[0], (("ok", want_missed), want_out))


def test_prefix_prompts_rejects_mismatched_lengths_types_and_members():
    none = np.zeros(0, dtype=np.int64)
    for core in _cores():
        assert _outcome(core.prefix_prompts, [], [], [], [human("a")], [], [], none, []) == (
            "error", ValueError, "hist has 1 items, base has 0")
        assert _outcome(core.prefix_prompts, (), [], [], [], [], [], none, []) == (
            "error", TypeError, "head must be a list, got tuple")
        assert _outcome(core.prefix_prompts, [], [], [], [], [], [[]], np.array([1], dtype=np.int64), [None]) == (
            "error", ValueError, "members must index srcs and out, got 1")


@st.composite
def state_lists(draw):
    firsts = [human(f"f{i}") for i in range(4)]
    out = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["hist"] * 5 + ["empty", "tuple", "none", "other_key", "not_dict", "subclass"]))
        hist = [draw(st.sampled_from(firsts))] + draw(st.lists(st.sampled_from(POOL), max_size=5))
        if kind == "hist":
            out.append({"messages": hist})
        elif kind == "empty":
            out.append({"messages": []})
        elif kind == "tuple":
            out.append({"messages": tuple(hist)})
        elif kind == "none":
            out.append({"messages": None})
        elif kind == "other_key":
            out.append({"history": hist})
        elif kind == "not_dict":
            out.append(hist)
        else:
            class D(dict):
                pass

            out.append(D(messages=hist))
    return out


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(state_lists())
def test_group_states_twins_agree_with_the_definition(states):
    outs = [core.group_states(states, "messages") for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    srcs, order, off, tops, rest = outs[0]
    want_srcs = [s.get("messages") if type(s) is dict and type(s.get("messages")) is list else None for s in states]
    assert _same(srcs, want_srcs)
    firsts: list = []
    for i, src in enumerate(want_srcs):
        if src and not any(src[0] is f for f in firsts):
            firsts.append(src[0])
    groups = [[i for i, src in enumerate(want_srcs) if src and src[0] is f] for f in firsts]
    assert [order[off[g]:off[g + 1]].tolist() for g in range(len(groups))] == groups
    assert tops.tolist() == [max(g, key=lambda i: len(want_srcs[i])) for g in groups]
    assert rest == [i for i, src in enumerate(want_srcs) if not src]
