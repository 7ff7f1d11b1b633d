"""The compiled clearing decision equals its pure-Python twin (``_editing_core_py``), and a
resumed scan equals a fresh one."""

import inspect

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jianmu_fast import _editing_core_py as py

core = pytest.importorskip("jianmu_fast._editing_core")


@st.composite
def records(draw):
    n = draw(st.integers(0, 60))
    n_pinned = draw(st.integers(0, min(n, 2)))
    counts = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    kinds = [3] * n_pinned + draw(st.lists(st.sampled_from([0, 4, 4, 1, 2, 2, 2]), min_size=n - n_pinned,
                                           max_size=n - n_pinned))
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


def test_twins_share_signatures_and_constants():
    assert inspect.signature(core.plan_clearing) == inspect.signature(py.plan_clearing)
    assert inspect.signature(core.extends) == inspect.signature(py.extends)
    assert (core.MAX_VALUE, core.STATE_LEN) == (py.MAX_VALUE, py.STATE_LEN)


@settings(max_examples=400, deadline=None)
@given(records(), st.integers(0, 100), st.integers(0, 20000), st.sampled_from([0, 1, 300, 2000]), st.integers(0, 5))
@example((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64)), 0, 0, 0, 0)
def test_twin_equals_compiled(rec, base, trigger, step, keep):
    counts, kinds, savings = rec
    cleared, total = _both(counts, kinds, savings, base, trigger, step, keep)
    n_results = int(((kinds == 1) | (kinds == 2)).sum())
    assert 0 <= cleared <= max(0, n_results - keep)
    positions = np.flatnonzero((kinds == 1) | (kinds == 2))[:cleared]
    assert total == base + int(counts.sum()) - int(savings[positions].sum())


@settings(max_examples=300, deadline=None)
@given(records(), st.integers(0, 20000), st.sampled_from([0, 1, 300, 2000]), st.integers(0, 5), st.data())
def test_resumed_scan_equals_fresh_scan_on_both_backends(rec, trigger, step, keep, data):
    counts, kinds, savings = rec
    cuts = sorted(data.draw(st.lists(st.integers(0, len(counts)), max_size=4)))
    for mod in (py, core):
        state = np.zeros(mod.STATE_LEN, dtype=np.int64)
        for k in cuts + [len(counts)]:
            got = mod.plan_clearing(counts[:k], kinds[:k], savings[:k], 3, trigger, step, keep, state)
            assert got == py.plan_clearing(counts[:k], kinds[:k], savings[:k], 3, trigger, step, keep)
            assert state[0] == k


@settings(max_examples=200, deadline=None)
@given(records(), st.integers(0, 20000), st.sampled_from([0, 1, 300, 2000]), st.integers(0, 5), st.data())
def test_monotone_along_growing_histories(rec, trigger, step, keep, data):
    counts, kinds, savings = rec
    k = data.draw(st.integers(0, len(counts)))
    short = py.plan_clearing(counts[:k], kinds[:k], savings[:k], 3, trigger, step, keep)
    long = py.plan_clearing(counts, kinds, savings, 3, trigger, step, keep)
    assert long[0] >= short[0]


@st.composite
def long_records(draw):
    """Long histories of many small results: many steps considered, each over many candidates
    (the compiled room is a binary search over prefix sums, the twin's a walk)."""
    n = draw(st.integers(50, 400))
    n_pinned = draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, draw(st.sampled_from([50, 400, 3000])), n).astype(np.int64)
    kinds = rng.choice(np.array([0, 4, 4, 1, 2, 2, 2], dtype=np.int8), n)
    kinds[:n_pinned] = 3
    savings = np.where(kinds == 2, (counts * rng.random(n)).astype(np.int64), 0).astype(np.int64)
    return counts, kinds, savings


@settings(max_examples=150, deadline=None)
@given(long_records(), st.integers(0, 20000), st.integers(1, 5000), st.integers(0, 5), st.data())
def test_long_scans_twin_equals_compiled_state_and_all(rec, trigger, step, keep, data):
    counts, kinds, savings = rec
    cuts = sorted(data.draw(st.lists(st.integers(0, len(counts)), max_size=3)))
    states = {}
    for mod in (py, core):
        state = np.zeros(mod.STATE_LEN, dtype=np.int64)
        got = [mod.plan_clearing(counts[:k], kinds[:k], savings[:k], 3, trigger, step, keep, state)
               for k in cuts + [len(counts)]]
        states[mod] = (got, state.tolist())
    assert states[py] == states[core]


def test_a_step_waits_for_a_message_that_is_not_an_assistant_message():
    # user, result, then a message that moves the budget's cut (x = 200 past the trigger, and
    # no unit start reaches the chunk mark: room 0): a user message takes the step at once,
    # an assistant message (no prompt ends with it) leaves it to the next message
    counts = np.array([100, 300, 800, 900], dtype=np.int64)
    savings = np.array([0, 290, 0, 0], dtype=np.int64)
    for mod in (py, core):
        user = np.array([0, 2, 0, 1], dtype=np.int8)
        assistant = np.array([0, 2, 4, 1], dtype=np.int8)
        assert mod.plan_clearing(counts[:3], user[:3], savings[:3], 0, 1000, 500, 0) == (1, 910)
        assert mod.plan_clearing(counts[:3], assistant[:3], savings[:3], 0, 1000, 500, 0) == (0, 1200)
        assert mod.plan_clearing(counts, assistant, savings, 0, 1000, 500, 1) == (1, 1810)


@pytest.mark.parametrize("args, message", [
    (([1, 2], [0], [0, 0], 0, 0, 0, 0), "counts, kinds and savings must have the same length, got 2, 1, 2"),
    (([1], [0], [0], -1, 0, 0, 0), "base must be between 0 and 2**53, got -1"),
    (([1], [0], [0], 0, 0, 0, -2), "keep must be between 0 and 2**53, got -2"),
    (([-1], [0], [0], 0, 0, 0, 0), "counts[0] must be between 0 and 2**53, got -1"),
    (([5], [5], [0], 0, 0, 0, 0), "kinds[0] must be between 0 and 4, got 5"),
    (([5, 5], [0, 3], [0, 0], 0, 0, 0, 0), "kinds[1] is 3 (pinned) after a message that is not pinned"),
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


def test_bad_state_is_named():
    arrays = (np.ones(2, dtype=np.int64), np.zeros(2, dtype=np.int8), np.zeros(2, dtype=np.int64))
    for mod in (py, core):
        with pytest.raises(ValueError, match=r"^state must have 7 entries, got 2$"):
            mod.plan_clearing(*arrays, 0, 0, 0, 0, np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match=r"^state\[0\] \(messages scanned\) must be between 0 and 2, got 3$"):
            mod.plan_clearing(*arrays, 0, 0, 0, 0, np.array([3, 0, 0, 0, 0, 0, 0], dtype=np.int64))


def test_compiled_stub_is_honest(tmp_path):
    """mypy's stubtest checks jianmu_fast/_editing_core.pyi against the compiled module."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("mypy")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n\n[mypy-jianmu_fast.*]\nignore_errors = True\n\n"
                      "[mypy-jianmu_fast._editing_core]\nignore_errors = False\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "jianmu_fast._editing_core", "--mypy-config-file", str(config)],
        capture_output=True, text=True, timeout=300, cwd=Path(core.__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12), st.data())
def test_extends_equals_its_twin_and_list_equality(a, b, data):
    """``extends(previous, current)`` is ``current[:len(previous)] == previous``: the same
    objects, or equal ones (here: boxed ints, some shared, some equal copies)."""
    pool = [object() for _ in range(6)]
    boxes = [[i] for i in range(6)]

    def item(i, how):
        return pool[i] if how == 0 else (boxes[i] if how == 1 else [i])

    hows = data.draw(st.lists(st.integers(0, 2), min_size=len(a) + len(b), max_size=len(a) + len(b)))
    previous = [item(i, h) for i, h in zip(a, hows)]
    current = [item(i, h) for i, h in zip(b, hows[len(a):])]
    if data.draw(st.booleans()):
        current = previous[:data.draw(st.integers(0, len(previous)))] + current
    expect = current[:len(previous)] == previous and len(current) >= len(previous)
    assert py.extends(previous, current) == core.extends(previous, current) == expect


def test_extends_names_bad_arguments():
    for mod in (py, core):
        with pytest.raises(TypeError, match=r"^previous and current must be lists, got tuple and list$"):
            mod.extends((1,), [1])


# -- the per-turn routines of the builder's hot hand-off (issue 19's per-turn target) ------------

import array  # noqa: E402
import weakref  # noqa: E402

from jianmu_fast.memory.context import ClearToolResultsFilter, TiktokenTokenCounter  # noqa: E402
from jianmu_fast.message import ai, human, system, tool  # noqa: E402

COUNTER = TiktokenTokenCounter("o200k_base")
_WORDS = ["alpha", "beta", "中文", "🙂", "42", "{\"k\": 1}", "\n"]


@st.composite
def messages(draw, n_max=30):
    """A history of system (leading or not), user, assistant (text or one call) and tool messages
    (text, sometimes blocks); some counted by ``COUNTER`` beforehand (cached), some not."""
    out = []
    for i in range(draw(st.integers(0, n_max))):
        role = draw(st.sampled_from(["system", "user", "assistant", "call", "tool", "tool"]))
        text = " ".join(draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=draw(st.sampled_from([5, 60, 400])))))
        if role == "system":
            m = system(text)
        elif role == "user":
            m = human(text)
        elif role == "assistant":
            m = ai(text)
        elif role == "call":
            m = ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
        else:
            m = tool([{"type": "text", "text": text}] if draw(st.integers(0, 9)) == 0 else text, tool_call_id=f"c{i - 1}")
        if draw(st.integers(0, 5)):
            COUNTER.count_message(m)
            if m.role == "tool" and isinstance(m.content, str) and draw(st.integers(0, 5)):
                COUNTER.count_text(m.content)
            e = COUNTER._msgs.get(id(m))
            if e is not None and e[0]() is m and draw(st.integers(0, 3)) == 0:
                COUNTER._msgs[id(m)] = e[:2]  # an entry without role and content count: read from m
        out.append(m)
    return out


@pytest.mark.parametrize("pure", [False, True])
def test_message_cache_entries_carry_role_and_content_count(pure, monkeypatch):
    """``_fill`` (both backends) caches ``(weakref, count, role, content count)``: the clearing's
    records in one look-up; the content count is None for content that is not a str."""
    from jianmu_fast import _backend, _filter_core_py

    if pure:
        monkeypatch.setattr(_backend, "counts_of", _filter_core_py.counts_of)
    c = TiktokenTokenCounter("o200k_base")
    c.count_text("known result")  # one content count from the text cache, the others tokenized
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    ms = [system("Be brief."), human("hi"), ai(None, tool_calls=call), tool("known result", tool_call_id="c1"),
          tool("new result 中文", tool_call_id="c1", name="f"), tool([{"type": "text", "text": "x"}], tool_call_id="c1"),
          ai("done")]
    counts = c._counts(ms)
    for m, n in zip(ms, counts):
        e = c._msgs.get(id(m))
        if type(m.content) is list:
            assert e is None  # (content blocks: never cached)
            continue
        assert e[0]() is m and e[1] == n and e[2] == m.role
        assert e[3] == (c.count_text(m.content) if type(m.content) is str else None)


def _records(f):
    r = f._rec
    return (r.messages, r.out, r.counts, r.kinds, r.savings, r.results, r.result_kinds, r.state)


@settings(max_examples=300, deadline=None)
@given(messages(), st.data(), st.sampled_from([0, 200, 2000, 20000]), st.sampled_from([0, 1, 300, 2000]),
       st.integers(0, 4))
def test_clearing_turn_twin_equals_compiled_and_the_general_path(hist, data, trigger, step, keep):
    k = data.draw(st.integers(0, len(hist)))
    n = data.draw(st.integers(k, min(len(hist), k + 20)))
    f = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step)
    f.apply(hist[:k])  # the records of the previous turn, by the general path
    settings_ = (f._placeholder_cost, trigger, step, keep)
    got = []
    for mod in (py, core):
        rec = tuple(
            list(x) if type(x) is list else array.array(x.typecode, x) for x in _records(f))
        code = mod.clearing_turn(hist[:n], *rec, COUNTER, settings_)
        got.append((code, [list(x) for x in rec]))
    assert got[0] == got[1]
    code, rec = got[0]
    if code < 0:  # nothing recorded
        assert rec == [list(x) for x in _records(f)]
        return
    whole = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step)
    whole.apply(hist[:n])
    want = [list(x) for x in _records(whole)]
    assert rec[0] == want[0] and rec[2:7] == want[2:7]  # the general path's records
    assert rec[1][:k] == f._rec.out and rec[1][k:] == hist[k:n]  # out extended by the messages themselves
    if code == 0:  # the scan took no step and computed no room: its state is the full scan's
        assert rec[7] == want[7] and want[7][2] == f._rec.state[2]


@settings(max_examples=300, deadline=None)
@given(messages(), st.data())
def test_extend_capped_twin_equals_compiled(hist, data):
    k = data.draw(st.integers(0, len(hist)))
    cuts = {}
    for m in hist:
        if m.role == "tool" and data.draw(st.booleans()):
            cuts[id(m)] = (weakref.ref(m), tool("cut", tool_call_id=m.tool_call_id))
    fits = data.draw(st.sampled_from([0, 0, 3, 8, 60, 400, 10**6]), label="fits")

    def within(m):  # a str content certainly within a byte-level cap of ``fits`` (each token >= 1 byte)
        c = m.content
        return bool(fits) and type(c) is str and (len(c) * 4 <= fits or (len(c) <= fits and c.isascii()))

    got = []
    for mod in (py, core):
        ref, out = list(hist[:k]), [cuts[id(m)][1] if id(m) in cuts else m for m in hist[:k]]
        i = mod.extend_capped(hist, ref, out, cuts, fits)
        got.append((i, ref, out))
        assert ref == hist[:i] and len(out) == i
        assert i == len(hist) or (hist[i].role == "tool" and id(hist[i]) not in cuts and not within(hist[i]))
        assert out[k:] == [cuts[id(m)][1] if m.role == "tool" and id(m) in cuts else m for m in hist[k:i]]
        assert all(id(m) in cuts or within(m) for m in hist[k:i] if m.role == "tool")
        for m in hist[k:i]:  # what passes uncounted fits the cap by the counter itself
            if m.role == "tool" and id(m) not in cuts:
                assert COUNTER.count_text(m.content) <= fits
    assert got[0] == got[1]


@settings(max_examples=200, deadline=None)
@given(messages(n_max=40), st.data(), st.sampled_from([1, 8, 60, 100000]))
def test_cap_hot_apply_twin_equals_compiled_and_the_general_path(hist, data, cap):
    """``ToolResultCapFilter._hot_apply`` through the compiled ``cap_hot_apply`` and through the
    twin, over a list grown by appends (sometimes a new list, sometimes a direct ``apply`` in
    between): every output equals a fresh filter's ``apply`` of the same prefix, and while the
    list only grows the output is the filter's same list, grown (the compiled turn's)."""
    from jianmu_fast.memory.context import ToolResultCapFilter

    filters = [ToolResultCapFilter(cap, COUNTER), ToolResultCapFilter(cap, COUNTER)]
    srcs: list[list] = [[], []]
    outs: list = [None, None]
    n = 0
    while n < len(hist):
        n = data.draw(st.integers(n + 1, min(len(hist), n + 5)), label="end")
        event = data.draw(st.sampled_from(["grow", "grow", "grow", "new list", "apply"]), label="event")
        want = ToolResultCapFilter(cap, COUNTER).apply(hist[:n])
        for j, (f, mod) in enumerate(zip(filters, (core, py))):
            if event == "new list":
                srcs[j] = list(srcs[j])
            elif event == "apply":
                assert f.apply(hist[:n]) == want
            grown = event == "grow" and outs[j] is not None
            srcs[j].extend(hist[len(srcs[j]):n])
            out = mod.cap_hot_apply(f, srcs[j], None)
            assert out == want and all(a is b for a, b in zip(out, f._turn_args[2]))
            assert all((o is h) == (w is h) for o, h, w in zip(out, hist, want))  # unchanged messages: themselves
            if grown:
                assert out is outs[j]  # the filter's own list, grown in place
            outs[j] = out
    assert type(ToolResultCapFilter.__dict__["_hot_apply"]).__name__ in ("function", "cython_function_or_method")


def test_per_turn_routines_name_bad_arguments():
    for mod in (py, core):
        with pytest.raises(TypeError, match=r"^src, ref and out must be lists and cache a dict$"):
            mod.extend_capped((), [], [], {})
        with pytest.raises(ValueError, match=r"^need len\(out\) == len\(ref\) <= len\(src\), got 1, 0, 0$"):
            mod.extend_capped([], [], [1], {})
        for bad in (-1, True, 1.0):
            with pytest.raises(ValueError, match=rf"^fits must be an int >= 0, got {bad!r}$"):
                mod.extend_capped([], [], [], {}, bad)
        arrays = (array.array("q"), array.array("b"), array.array("q"))
        with pytest.raises(TypeError, match=r"^src, ref, out, results and result_kinds must be lists$"):
            mod.clearing_turn([], [], [], *arrays, (), [], array.array("q", [0] * 7), COUNTER, (0, 0, 0, 0))
        with pytest.raises(TypeError, match=r"^kinds must be an array.array of typecode 'b'$"):
            mod.clearing_turn([], [], [], arrays[0], arrays[0], arrays[2], [], [], array.array("q", [0] * 7), COUNTER,
                              (0, 0, 0, 0))
    assert inspect.signature(core.clearing_turn) == inspect.signature(py.clearing_turn)
    assert inspect.signature(core.extend_capped) == inspect.signature(py.extend_capped)
    assert core.TURN_MAX == py.TURN_MAX


# -- the builder's hot call (``ClearingTurn``): one compiled call on the agent loop's turn -----------

@settings(max_examples=200, deadline=None)
@given(messages(n_max=40), st.data(), st.sampled_from([0, 200, 2000, 20000]), st.sampled_from([0, 1, 300, 2000]),
       st.integers(0, 4))
def test_clearing_turn_object_twin_equals_compiled_and_the_general_path(hist, data, trigger, step, keep):
    """Two filters, one called through the compiled ``ClearingTurn``, one through the twin, over
    the same growing list: the same outputs (and records) as a fresh filter's ``apply`` of each
    prefix, the output list the same object while no step is taken."""
    from jianmu_fast.message import Message

    filters = []
    for mod in (core, py):
        f = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step)
        object.__setattr__(f, "_hot_turn", mod.ClearingTurn(f, Message))
        filters.append(f)
    srcs: list[list] = [[], []]
    outs: list = [None, None]
    n = 0
    while n < len(hist):
        n = data.draw(st.integers(n + 1, min(len(hist), n + 5)), label="end")
        want = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step).apply(hist[:n])
        got = []
        for j, f in enumerate(filters):
            srcs[j].extend(hist[len(srcs[j]):n])
            armed = f._hot_turn.armed
            prev_len = len(outs[j]) if outs[j] is not None else -1
            out = f._hot_turn(srcs[j], None)
            assert out == want
            if armed and out is not outs[j]:  # a new list: a step was taken (or the cut moved)
                pass
            elif armed:
                assert len(out) >= prev_len
            outs[j] = out
            got.append([list(x) for x in _records(f)])
        assert got[0] == got[1]
        assert filters[0]._hot_turn.armed == filters[1]._hot_turn.armed


@settings(max_examples=200, deadline=None)
@given(messages(n_max=40), st.data(), st.sampled_from([0, 200, 2000, 20000]), st.sampled_from([0, 1, 300, 2000]),
       st.integers(0, 4))
def test_clearing_turn_object_fresh_starts_twin_equals_compiled_and_the_general_path(hist, data, trigger, step, keep):
    """The builder's hot call handed another list (a new conversation, a note put before the
    history, a copy of the same prefix): a short one is started afresh in the compiled turn
    (``_restart``), a long one, one that extends the records or one whose scan clears by the
    filter's general path; either way the output is a fresh filter's ``apply`` of that list,
    and the compiled turn and its twin keep the same records."""
    from jianmu_fast.message import Message

    filters = []
    for mod in (core, py):
        f = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step)
        object.__setattr__(f, "_hot_turn", mod.ClearingTurn(f, Message))
        filters.append(f)
    note = system("history note")
    COUNTER.count_message(note)
    srcs: list[list] = [[], []]
    n = 0
    while n < len(hist):
        n = data.draw(st.integers(n + 1, min(len(hist), n + 5)), label="end")
        how = data.draw(st.sampled_from(["grow", "grow", "new", "note", "copy", "tail"]), label="how")
        for j, f in enumerate(filters):
            if how == "grow":
                srcs[j].extend(hist[len(srcs[j]):n])
            elif how == "new":
                srcs[j] = hist[:n]
            elif how == "note":
                srcs[j] = hist[:1] + [note] + hist[1:n]
            elif how == "copy":
                srcs[j] = list(srcs[j]) + hist[len(srcs[j]):n]
            else:
                srcs[j] = hist[max(0, n - 6):n]
        want = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step).apply(srcs[0])
        got = []
        for j, f in enumerate(filters):
            out = f._hot_turn(srcs[j], None)
            assert out == want and out is not srcs[j]
            got.append([list(x) for x in _records(f)] + [f._rec.cleared, f._rec.n_pinned])
            if f._hot_turn.armed:
                assert f._turn_args[0] is srcs[j] and f._turn_args[2] is f._rec.out
        assert got[0] == got[1]
        assert filters[0]._hot_turn.armed == filters[1]._hot_turn.armed


@pytest.mark.parametrize("mod", [core, py], ids=["compiled", "twin"])
def test_clearing_turn_object_starts_a_short_new_list_itself(mod):
    """A short new list (a new conversation, or the history note put before the history) is
    started afresh by the turn itself, without the filter's ``_hot_apply``; a list that extends
    the records, one over ``TURN_MAX`` and one whose first scan clears go to ``_hot_apply``."""
    from jianmu_fast.message import Message

    hist = [system("sys"), human("q")]
    for i in range(30):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool("result " * 80, tool_call_id=f"c{i}"), ai("ok")]
    note = system("note")
    for m in hist + [note]:
        COUNTER.count_message(m)
        if m.role == "tool":
            COUNTER.count_text(m.content)
    f = ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300)
    object.__setattr__(f, "_hot_turn", mod.ClearingTurn(f, Message))
    calls = []
    real = f._hot_apply

    def counted(src, tools_schema=None):
        calls.append(len(src))
        return real(src, tools_schema)

    object.__setattr__(f, "_hot_apply", counted)

    def fresh(src):
        return ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300).apply(src)

    turn = f._hot_turn
    src = hist[:40]
    assert turn(src) == fresh(src) and calls == [40]
    for src in (hist[:3], hist[:1] + [note] + hist[1:6], hist[:2], [note, hist[1]]):
        assert turn(src) == fresh(src) and turn.armed
        assert len(calls) == 1  # started by the turn itself
        assert f._rec.messages == src and f._rec.n_pinned == (2 if src[1].role == "system" else 1)
        src.append(hist[len(src)])
        assert turn(src) == fresh(src) and len(calls) == 1  # then its ordinary turn
    assert turn(hist[:2]) == fresh(hist[:2]) and len(calls) == 1
    assert turn(hist[:2] + [hist[2]]) == fresh(hist[:3]) and calls[-1] == 3  # extends the records: resumed
    twin = hist[1].model_copy()  # equal (the same id), another object: extends by equality, resumed
    assert twin == hist[1] and twin is not hist[1]
    assert turn([hist[0], twin, hist[2], hist[3]]) == fresh(hist[:4]) and calls[-1] == 4
    other = human(hist[1].content)  # equal but for its id: unequal, started afresh by the turn
    assert other != hist[1]
    assert turn([hist[0], other, hist[2]]) == fresh([hist[0], other, hist[2]]) and calls[-1] == 4
    assert turn(hist[:20]) == fresh(hist[:20]) and calls[-1] == 20  # over TURN_MAX
    big = [system("s")] + [tool("result " * 400, tool_call_id=f"c{i}") for i in range(6)]
    for m in big:
        COUNTER.count_message(m)
        COUNTER.count_text(m.content) if m.role == "tool" else None
    g = ClearToolResultsFilter(1500, COUNTER, keep=2)
    object.__setattr__(g, "_hot_turn", mod.ClearingTurn(g, Message))
    g._hot_turn(hist[:3])
    out = g._hot_turn(big)  # its first scan clears: the general path
    assert out == ClearToolResultsFilter(1500, COUNTER, keep=2).apply(big) and out[1].content == "[cleared]"


@settings(max_examples=150, deadline=None)
@given(messages(n_max=40), st.data(), st.sampled_from([200, 2000]), st.sampled_from([0, 300, 2000]),
       st.integers(0, 3), st.booleans())
def test_clearing_turn_object_step_in_place_only_when_no_one_else_holds_the_output(hist, data, trigger, step, keep, hold):
    """A step's cleared copies go into the output list in place only when nothing but the
    filter and its turn reference it (the compiled turn; the twin copies): a list the caller
    still holds never changes but by appends while it is returned again, and either way every
    output is a fresh filter's ``apply``."""
    from jianmu_fast.message import Message

    ends = []
    while not ends or ends[-1] < len(hist):
        last = ends[-1] if ends else 0
        ends.append(data.draw(st.integers(last + 1, min(len(hist), last + 3)), label="end") if hist else 0)
        if not hist:
            break
    results = []
    for mod in (core, py):
        f = ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step)
        object.__setattr__(f, "_hot_turn", mod.ClearingTurn(f, Message))
        src: list = []
        held: list = []
        ids = []
        for n in ends:
            src.extend(hist[len(src):n])
            out = f._hot_turn(src, None)
            assert out == ClearToolResultsFilter(trigger, COUNTER, keep=keep, clear_at_least=step).apply(src)
            ids.append([m.content for m in out])
            if hold:
                held.append((out, list(out)))
            del out
        for out, snapshot in held:  # what the caller holds only ever grew
            assert all(a is b for a, b in zip(out, snapshot))
        results.append(ids)
    assert results[0] == results[1]


def test_compiled_step_edits_in_place_only_an_output_no_one_else_holds():
    from jianmu_fast.message import Message

    hist = [human("q")]
    for i in range(30):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool("result " * 80, tool_call_id=f"c{i}"), ai("ok")]
    for m in hist:
        COUNTER.count_message(m)
        if m.role == "tool":
            COUNTER.count_text(m.content)
    for hold in (False, True):
        f = ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300)
        turn = core.ClearingTurn(f, Message)
        object.__setattr__(f, "_hot_turn", turn)
        src, kept, same, new = [], [], 0, 0
        for m in hist:
            src.append(m)
            before, cleared = id(f._rec.out), f._rec.cleared
            out = turn(src)
            assert out == ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300).apply(src)
            if turn.changed is not None and f._rec.cleared > cleared:
                same += id(out) == before
                new += id(out) != before
            if hold:
                kept.append(out)
            del out
        assert (same, new > 0) == (0, True) if hold else (same > 0 and new == 0)


def test_clearing_turn_object_falls_back_off_its_thread_and_after_a_direct_call():
    """A call from another thread than the one that armed it, with tools, with another list, or
    after ``apply`` (which disarms it) is the filter's ``_hot_apply``; a change of a setting
    disarms it."""
    import threading

    from jianmu_fast.message import ai, human, tool

    hist = [human("q")]
    for i in range(30):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool("result " * 80, tool_call_id=f"c{i}"), ai("ok")]
    for m in hist:
        COUNTER.count_message(m)
        if m.role == "tool":
            COUNTER.count_text(m.content)
    f = ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300)
    calls = []
    real = f._hot_apply

    def counted(src, tools_schema=None):
        calls.append(len(src))
        return real(src, tools_schema)

    object.__setattr__(f, "_hot_apply", counted)
    turn, src = f._hot_turn, hist[:4]
    assert turn(src) == ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300).apply(src)
    assert turn.armed and calls == [4]
    src.append(hist[4])
    turn(src)
    assert calls == [4]  # the compiled (or twin) turn: no _hot_apply
    src.append(hist[5])
    box = []
    th = threading.Thread(target=lambda: box.append(turn(src)))
    th.start()
    th.join()
    assert calls == [4, 6] and box[0] == ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300).apply(src)
    src.append(hist[6])
    turn(src)  # armed by the other thread: falls back, and is armed for this one again
    assert calls == [4, 6, 7]
    f.apply(src)
    assert not turn.armed
    src.append(hist[7])
    turn(src)
    assert calls[-1] == 8 and turn.armed
    f.keep = 3
    assert not turn.armed
    src.append(hist[8])
    assert turn(src) == ClearToolResultsFilter(1500, COUNTER, keep=3, clear_at_least=300).apply(src)
    assert calls[-1] == 9
    assert turn(src, [{"type": "function", "function": {"name": "f", "parameters": {}}}]) is not None
    assert calls[-1] == 9 and len(calls) == 6


@pytest.mark.parametrize("mod", [core, py], ids=["compiled", "twin"])
def test_clearing_turn_object_drops_what_it_held_when_disarmed(mod):
    """A disarmed ``ClearingTurn`` references none of the filter's lists (``disarm()``: a change
    of a setting, ``apply``), so ``rearm`` has nothing to take up; ``disarm(hold=True)`` (the
    filter's locked path, which re-arms it) keeps them for ``rearm``."""
    import gc

    from jianmu_fast.message import Message, human

    f = ClearToolResultsFilter(1000, COUNTER, keep=1)
    turn = mod.ClearingTurn(f, Message)
    object.__setattr__(f, "_hot_turn", turn)
    src = [human("hello"), human("there")]
    turn(src)
    assert turn.armed

    def held_lists():
        seen = gc.get_referents(turn) if mod is core else gc.get_referents(*[x for x in vars(turn).values()])
        return [x for x in seen if type(x) is list and (x is src or x is f._rec.messages or x is f._rec.out)]

    assert held_lists()
    turn.disarm(hold=True)
    assert not turn.armed and held_lists()
    turn.rearm()
    assert turn.armed
    f.apply(src)  # disarms it for good
    assert not turn.armed and not held_lists()
    with pytest.raises(ValueError, match="nothing was armed"):
        turn.rearm()
    turn(src)  # the filter's locked path arms it again
    assert turn.armed and held_lists()
    f.keep = 2
    assert not turn.armed and not held_lists()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 2]), st.booleans()), max_size=20), st.data())
def test_place_cleared_twin_equals_compiled_and_the_loop(spec, data):
    """``place_cleared`` (both twins) places the cached copies of the clearable results in order and
    stops at the first one not cached, as the Python loop it replaces."""
    import weakref

    from jianmu_fast.message import tool

    msgs = [tool(f"r{i}", tool_call_id=f"c{i}") for i in range(len(spec))]
    copies = [tool("[cleared]", tool_call_id=f"c{i}") for i in range(len(spec))]
    cache = {id(m): (weakref.ref(m), c) for m, c, (_, cached) in zip(msgs, copies, spec) if cached}
    results, result_kinds = list(range(len(spec))), [k for k, _ in spec]
    start = data.draw(st.integers(0, len(spec)))
    stop = data.draw(st.integers(start, len(spec)))
    want_out, want = list(msgs), stop
    for r in range(start, stop):
        if result_kinds[r] != 2:
            continue
        if not spec[r][1]:
            want = r
            break
        want_out[r] = copies[r]
    for mod in (py, core):
        out = list(msgs)
        assert mod.place_cleared(out, msgs, results, result_kinds, start, stop, cache) == want
        assert out == want_out and all(a is b for a, b in zip(out, want_out))
    for mod in (py, core):
        with pytest.raises(ValueError, match="start <= stop"):
            mod.place_cleared([], [], [], [], 1, 0, {})
        with pytest.raises(TypeError, match="must be lists"):
            mod.place_cleared((), [], [], [], 0, 0, {})


@pytest.mark.parametrize("twin", [py, core], ids=["python", "compiled"])
def test_a_steps_copy_counts_are_kept_with_the_cleared_copies(twin):
    """A step hands on the copies' counts (``changed[3]``): the counter's cached counts the
    first time, then (a replayed history, a second conversation with the same results) the
    counts its cleared cache keeps with each copy; both the same counts as counting the copies,
    and the same prompts as the filter's own path."""
    from jianmu_fast.message import Message

    hist = [human("q")]
    for i in range(30):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool(f"result {i} " * 60, tool_call_id=f"c{i}"), ai("ok")]
    for m in hist:
        COUNTER.count_message(m)
        if m.role == "tool":
            COUNTER.count_text(m.content)
    f = ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300)
    turn = twin.ClearingTurn(f, Message)
    object.__setattr__(f, "_hot_turn", turn)
    steps = []
    for replay in range(2):
        src: list = []
        for m in hist:
            src.append(m)
            out = turn(src)
            assert out == ClearToolResultsFilter(1500, COUNTER, keep=2, clear_at_least=300).apply(src)
            if turn.changed is not None:
                new_out, positions, originals, counts = turn.changed
                assert counts == [COUNTER.count_message(new_out[p]) for p in positions]
                steps.append(replay)
            del out
        held = [e for e in f._cleared_cache._d.values() if e[0]() is not None]
        assert held and all(len(e) == 3 and e[2] == COUNTER.count_message(e[1]) for e in held)
    assert 0 in steps and 1 in steps
