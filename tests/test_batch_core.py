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
NAMES = ["gather_rows", "group_states", "intern_rows", "need_rows", "pack_rows", "prefix_groups", "table_records"]

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


# -- need_rows and gather_rows -------------------------------------------------------------------


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
@given(planned(), st.sampled_from(["ok", "ok", "ok", "short_table", "not_list", "bad_offsets"]))
def test_gather_rows_twins_agree_with_the_definition(case, kind):
    rows, offsets, plans, counts = case
    distinct = [POOL[q % len(POOL)] for q in range(len(counts))]
    if kind == "short_table":  # a row past the table
        distinct = distinct[:-1]
    elif kind == "not_list":
        distinct = tuple(distinct)
    elif kind == "bad_offsets" and len(offsets) > 2:
        offsets = offsets.copy()
        offsets[1] = offsets[-1] + 1
    outs = [_outcome(core.gather_rows, distinct, rows, offsets, plans) for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    if outs[0][0] == "ok":
        want = [[distinct[r] for r in [*rows[o:o + k], *rows[o + a:o + b]]]
                for o, (_, k, a, b) in zip(offsets.tolist(), plans.tolist())]
        assert _same(outs[0][1], want)
        assert len({id(o) for o in outs[0][1]}) == len(want)  # every output a list of its own


def test_gather_rows_errors_name_the_prompt_and_the_row():
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    a = human("a")
    for core in _cores():
        assert _outcome(core.gather_rows, [a], i64(0), i64(0, 1), i64(0, 0, 1, 2).reshape(1, 4)) == (
            "error", ValueError, "prompt 0: need 0 <= n_pinned <= lo <= hi <= 1, got 0, 1, 2")
        assert _outcome(core.gather_rows, [a], i64(0, 1), i64(0, 2), i64(0, 1, 1, 2).reshape(1, 4)) == (
            "error", ValueError, "rows[1] must index distinct (0..0), got 1")
        assert _outcome(core.gather_rows, (a,), i64(0), i64(0, 1), i64(0, 0, 0, 1).reshape(1, 4)) == (
            "error", TypeError, "distinct must be a list, got tuple")
        assert _outcome(core.gather_rows, [a], i64(0), i64(0, 1), np.zeros((2, 4), dtype=np.int64)) == (
            "error", ValueError, "plans must have shape (1, 4), got (2, 4)")
        assert _outcome(core.gather_rows, [a], i64(0, 0), i64(0, 3, 2), np.zeros((2, 4), dtype=np.int64)) == (
            "error", ValueError, "offsets must be non-decreasing (at index 2)")
        assert _outcome(core.gather_rows, [a], i64(0), i64(0, 2), np.zeros((1, 4), dtype=np.int64)) == (
            "error", ValueError, "offsets must start at 0 and end at 1")


# -- group_states, prefix_groups and pack_rows ------------------------------------------------------


def _provider_output(draw, base):
    """A provider's output for ``base``: each item itself, an equal copy (what a provider made
    for an equal message before), or a changed copy (an annotation)."""
    kinds = [draw(st.sampled_from(["same", "same", "same", "equal", "annotated"])) for _ in base]
    return [m if k == "same" else m.model_copy() if k == "equal" else m.model_copy(update={"content": "note"})
            for m, k in zip(base, kinds)]


@st.composite
def grouped_states(draw):
    """``group_states``' input and result, the provider outputs of the groups (some missing),
    and the states' sources: prefixes of their group's longest history, some longer or
    diverging (same first message, another path), some not dicts of lists at all."""
    firsts = [human(f"f{i}") for i in range(3)]
    convs = [[f] + draw(st.lists(st.sampled_from(POOL), max_size=7)) for f in firsts]
    states = []
    for _ in range(draw(st.integers(0, 12))):
        c = draw(st.sampled_from(convs))
        k = draw(st.integers(0, len(c)))
        kind = draw(st.sampled_from(["prefix"] * 5 + ["swapped", "tuple", "not_dict"]))
        src = c[:k]
        if kind == "swapped" and len(src) > 1:
            src = src[:-1] + [human("other")]
        states.append(tuple(src) if kind == "tuple" else src if kind == "not_dict" else {"messages": src})
    srcs, order, off, tops, rest = core_py.group_states(states, "messages")
    hists = []
    for top in tops.tolist():
        hists.append(None if draw(st.integers(0, 5)) == 0 else _provider_output(draw, srcs[top]))
    return states, srcs, order, off, tops, hists


def _prefix_definition(srcs, order, off, tops, hists):
    gid = [-1] * len(srcs)
    firsts = []
    for g, top in enumerate(tops.tolist()):
        base, hist = srcs[top], hists[g]
        if hist is None:
            firsts.append(-1)
            continue
        firsts.append(next((j for j in range(len(base)) if not (hist[j] is base[j] or hist[j] == base[j])), len(base)))
        for i in order[off[g]:off[g + 1]].tolist():
            src = srcs[i]
            if type(src) is list and len(src) <= len(base) and all(a is b for a, b in zip(src, base)):
                gid[i] = g
    return gid, firsts


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(st.data())
def test_prefix_groups_twins_agree_with_the_definition(data):
    _, srcs, order, off, tops, hists = data.draw(grouped_states())
    outs = [core.prefix_groups(hists, srcs, order, off, tops) for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    gid, firsts = outs[0]
    assert gid.dtype == firsts.dtype == np.int64
    assert (gid.tolist(), firsts.tolist()) == _prefix_definition(srcs, order, off, tops, hists)


def test_prefix_groups_rejects_inconsistent_groups():
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    a, b = human("a"), human("b")
    for core in _cores():
        assert _outcome(core.prefix_groups, [[a]], [[a, b]], i64(0), i64(0, 1), i64(0)) == (
            "error", ValueError, "hists[0] must be None or a list as long as its base (2 items)")
        assert _outcome(core.prefix_groups, [None], [[a]], i64(0), i64(0, 1, 1), i64(0)) == (
            "error", ValueError, "hists and group_off must have 1 and 2 items, got 1 and 3")
        assert _outcome(core.prefix_groups, [None], [[a]], i64(3), i64(0, 1), i64(0)) == (
            "error", ValueError, "order[0] must index srcs, got 3")
        assert _outcome(core.prefix_groups, [None], [(a,)], i64(0), i64(0, 1), i64(0)) == (
            "error", TypeError, "srcs[0] (the base of group 0) must be a list, got tuple")
        assert _outcome(core.prefix_groups, [None], [[a]], i64(0), i64(0, 2), i64(0)) == (
            "error", ValueError, "group_off must be non-decreasing within 0..1, got 0, 2 at group 0")
        assert _outcome(core.prefix_groups, (None,), [[a]], i64(0), i64(0, 1), i64(0)) == (
            "error", TypeError, "hists must be a list, got tuple")


class Sub(Message):
    """A Message subclass: not of exact type Message, so its prompt is ``bad``."""


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(st.data())
def test_pack_rows_is_intern_rows_of_the_provided_prompts(data):
    _, srcs, order, off, tops, hists = data.draw(grouped_states())
    gid, firsts = core_py.prefix_groups(hists, srcs, order, off, tops)
    head = data.draw(st.sampled_from([[], [system("h")], [system("h"), POOL[0]]]))
    tail = data.draw(st.sampled_from([[], [system("t")], [POOL[1]]]))
    shared_note = system("note")
    notes = [data.draw(st.sampled_from([None, shared_note, system("own note")])) for _ in hists]
    if hists and data.draw(st.integers(0, 6)) == 0:  # a non-Message item in one history
        g = data.draw(st.integers(0, len(hists) - 1))
        if hists[g]:
            hists[g][-1] = Sub(role="user", content="sub")
    # the other states' prompts: lists of Messages (sharing objects with the heads, tails and
    # notes), now and then a bad one, or None (a failed state)
    prompts = [None if g >= 0 else data.draw(st.sampled_from([
        [], [POOL[2], shared_note], [POOL[3]] + head, None, "x", [Sub(role="user", content="s")]]))
        for g in gid.tolist()]
    full = []
    for i, g in enumerate(gid.tolist()):
        if g < 0:
            full.append(prompts[i])
        else:
            k = len(srcs[i])
            full.append(head + ([notes[g]] if notes[g] is not None and k > firsts[g] else []) + hists[g][:k] + tail)
    want = core_py.intern_rows(full, Message)
    for core in _cores():
        assert _same(core.pack_rows(head, tail, notes, hists, firsts, srcs, gid, prompts, Message), want)


def test_pack_rows_many_distinct_objects_grow_the_table():
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    hist = [human(str(i)) for i in range(3000)]
    srcs = [hist[:k] for k in (3000, 10, 2500)] + [None]
    rest = [hist[::-1][:1500]]
    args = ([system("h")], [system("t")], [system("n")], [hist], i64(5), srcs, i64(0, 0, 0, -1), [None] * 3 + rest)
    want = core_py.pack_rows(*args, Message)
    for core in _cores():
        assert _same(core.pack_rows(*args, Message), want)


def test_pack_rows_rejects_inconsistent_groups():
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    a = human("a")
    for core in _cores():
        assert _outcome(core.pack_rows, [], [], [None], [[a]], i64(1), [[a, a]], i64(0), [None], Message) == (
            "error", ValueError, "state 0: srcs[0] and hists[0] must be lists, the first no longer than the second")
        assert _outcome(core.pack_rows, [], [], [None], [[a]], i64(1), [[a]], i64(1), [None], Message) == (
            "error", ValueError, "gid[0] must be below 1, got 1")
        assert _outcome(core.pack_rows, [], [], [], [[a]], i64(1), [[a]], i64(0), [None], Message) == (
            "error", ValueError, "notes and firsts must have one item per group (1), got 0 and 1")
        assert _outcome(core.pack_rows, [], [], [None], [[a]], i64(1), [[a]], i64(0, 0), [None], Message) == (
            "error", ValueError, "srcs and gid must have one item per prompt (1), got 1 and 2")
        assert _outcome(core.pack_rows, (), [], [None], [[a]], i64(1), [[a]], i64(0), [None], Message) == (
            "error", TypeError, "head must be a list, got tuple")
        assert _outcome(core.pack_rows, [], [], [None], [[a]], i64(1), [[a]], i64(0), [None], "M") == (
            "error", TypeError, "cls must be a type, got str")


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


# -- text_sides -------------------------------------------------------------------------------------


@st.composite
def counted_messages(draw):
    """Messages as the counting threads get them: shared texts, calls, names, content blocks;
    now and then an object without the attributes (the same AttributeError on both)."""
    texts = ["a", "b", "hello world", "a", "", "中文"]
    out = []
    for _ in range(draw(st.integers(0, 16))):
        kind = draw(st.sampled_from(["text"] * 4 + ["named", "call", "blocks", "none", "odd"]))
        t = draw(st.sampled_from(texts))
        if kind == "text":
            out.append(human(t))
        elif kind == "named":
            out.append(human(t, name="ann"))
        elif kind == "call":
            out.append(ai(t or None, tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))
        elif kind == "blocks":
            out.append(human([{"type": "text", "text": t}]))
        elif kind == "none":
            out.append(ai(None))
        else:
            out.append(object())
    return out


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(counted_messages())
def test_text_sides_twins_agree_with_the_definition(msgs):
    outs = [_outcome(core.text_sides, msgs) for core in _cores()]
    assert all(_same(o, outs[0]) for o in outs)
    if outs[0][0] == "error":
        assert outs[0][1] is AttributeError
        return
    side0, side1, at0, at1 = outs[0][1]
    want = [0 if not (type(m.content) is str and m.tool_calls is None and m.name is None) else hash(m.content) & 1
            for m in msgs]
    assert at0.tolist() == [i for i, s in enumerate(want) if s == 0]
    assert at1.tolist() == [i for i, s in enumerate(want) if s == 1]
    assert _same(side0, [msgs[i] for i in at0.tolist()]) and _same(side1, [msgs[i] for i in at1.tolist()])


def test_prefix_groups_refuses_lists_changed_by_a_comparison():
    """An ``==`` that empties ``srcs`` while the history is compared: a clear error on both
    (the compiled twin would otherwise read past the list's end)."""
    i64 = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
    srcs: list = []

    class Clearing:
        def __eq__(self, other):
            srcs.clear()
            return True

        __hash__ = object.__hash__

    for core in _cores():
        a = human("a")
        srcs[:] = [[a], [a]]
        assert _outcome(core.prefix_groups, [[Clearing()]], srcs, i64(0, 1), i64(0, 2), i64(0)) == (
            "error", RuntimeError, "srcs or hists changed size while the history was compared")
