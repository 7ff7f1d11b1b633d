"""Pure-Python reference of the compiled batch core (``csrc/_batch_core.pyx``).

The batch path (``jianmu_fast.memory.context._batch_plan``) turns many prompts (lists of
Messages, sharing most of their messages) into one table of records, plans every prompt in
compiled code, and slices the outputs. The Python-object work around the planner lives here,
so that it runs as C loops in the compiled twin:

``intern_rows``
    one pass over every prompt's references: each distinct object (by identity) gets a row,
    each prompt becomes a run of row numbers (CSR: ``rows`` and ``offsets``);
``table_records``
    one pass over the distinct messages: role code, the interned ids of the calls an
    assistant message makes (CSR: ``call_off``/``call_ids``) and the interned id a tool
    result answers (``-1``: none, or empty);
``need_rows``
    the distinct rows a planning round asks to count;
``text_sides``
    the distinct messages split in two by their text, for two counting threads;
``gather_rows``
    every prompt's output list, ``prompt[:n_pinned] + prompt[lo:hi]``, read through its rows
    (the prompt lists themselves are not needed);
``group_states``, ``prefix_groups``, ``pack_rows``
    ``build_batch``'s states grouped by their history's first message; which of them are
    prefixes of their group's longest history (one provider output serves them all); and
    ``intern_rows``' result for every provided prompt without building the prompt lists of
    those states (``head + [note] + history[:k] + tail``: their rows are copied from one row
    array per group).

This module is the specification: the compiled twin has the same names, signatures, results
and error messages, and ``tests/test_batch_core.py`` proves it on random inputs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["gather_rows", "group_states", "intern_rows", "need_rows", "pack_rows", "prefix_groups", "table_records",
           "text_sides"]


def intern_rows(prompts: Sequence[Any], cls: type) -> tuple[np.ndarray, np.ndarray, list[Any], list[int]]:
    """``(rows, offsets, distinct, bad)``: prompt ``p`` is ``distinct[r]`` for ``r`` in
    ``rows[offsets[p]:offsets[p+1]]``; ``distinct`` holds each object once, in order of first
    appearance. A prompt that is not a ``list`` whose items are all of exact type ``cls`` is
    listed in ``bad`` and gets no rows.

    >>> a, b = object(), object()
    >>> rows, off, distinct, bad = intern_rows([[a, b], [a], "x", [b, b]], object)
    >>> rows.tolist(), off.tolist(), distinct == [a, b], bad
    ([0, 1, 0, 1, 1], [0, 2, 3, 3, 5], True, [2])
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a type, got {type(cls).__name__}")
    rowmap: dict[int, int] = {}
    distinct: list[Any] = []
    rows: list[int] = []
    offsets = [0]
    bad: list[int] = []
    for p, msgs in enumerate(prompts):
        if type(msgs) is not list or any(type(m) is not cls for m in msgs):
            bad.append(p)
        else:
            for m in msgs:
                r = rowmap.get(id(m))
                if r is None:
                    r = rowmap[id(m)] = len(distinct)
                    distinct.append(m)
                rows.append(r)
        offsets.append(len(rows))
    return np.array(rows, dtype=np.int64), np.array(offsets, dtype=np.int64), distinct, bad


def table_records(
    distinct: Sequence[Any], role_codes: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(roles, call_off, call_ids, result_ids)`` of messages (``role``, ``tool_calls``,
    ``tool_call_id``): ``roles`` (int8) by ``role_codes``; the calls of an assistant message
    (code 2) ``call_ids[call_off[i]:call_off[i+1]]``, each call's ``"id"``; the id a tool
    result (code 3) answers ``result_ids[i]``. Ids are interned to ints in order of first
    appearance (calls before the result, message by message); ``-1`` is a missing or empty id.

    >>> from jianmu_fast.message import ai, human, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> recs = table_records([human("q"), ai(None, tool_calls=call), tool("r", tool_call_id="c1")],
    ...                      {"system": 0, "user": 1, "assistant": 2, "tool": 3})
    >>> [a.tolist() for a in recs]
    [[1, 2, 3], [0, 0, 1, 1], [0], [-1, -1, 0]]
    """
    n = len(distinct)
    roles = np.empty(n, dtype=np.int8)
    call_off = np.zeros(n + 1, dtype=np.int64)
    result_ids = np.full(n, -1, dtype=np.int64)
    ids: list[int] = []
    intern: dict[Any, int] = {}
    for i, m in enumerate(distinct):
        code = role_codes[m.role]
        roles[i] = code
        if code == 3:
            key = m.tool_call_id
            result_ids[i] = intern.setdefault(key, len(intern)) if key else -1
        elif code == 2:
            calls = m.tool_calls
            if calls:
                for c in calls:
                    key = c.get("id")
                    ids.append(intern.setdefault(key, len(intern)) if key else -1)
        call_off[i + 1] = len(ids)
    return roles, call_off, np.array(ids, dtype=np.int64), result_ids


def text_sides(msgs: Sequence[Any]) -> tuple[list[Any], list[Any], np.ndarray, np.ndarray]:
    """``(side0, side1, at0, at1)``: ``msgs`` split in two for two counting threads, so that a
    text two messages share is counted by one of them. A message whose ``content`` is a
    ``str`` and whose ``tool_calls`` and ``name`` are ``None`` goes to side ``hash(content) &
    1``, any other to side 0 (attributes read in that order, only as far as needed);
    ``at0``/``at1`` are the positions of each side's messages in ``msgs``, ascending.

    >>> from jianmu_fast.message import ai, human
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> msgs = [human("a"), ai(None, tool_calls=call), human("a"), human("b", name="ann")]
    >>> side0, side1, at0, at1 = text_sides(msgs)
    >>> sorted(at0.tolist() + at1.tolist()), [msgs[i] for i in at0] == side0, {1, 3} <= set(at0.tolist())
    ([0, 1, 2, 3], True, True)
    >>> (0 in at0) == (2 in at0)  # the same text, the same side
    True
    """
    sides: tuple[list[int], list[int]] = ([], [])
    for i, m in enumerate(msgs):
        c = m.content
        simple = type(c) is str and m.tool_calls is None and m.name is None
        sides[hash(c) & 1 if simple else 0].append(i)
    return ([msgs[i] for i in sides[0]], [msgs[i] for i in sides[1]], np.array(sides[0], dtype=np.int64),
            np.array(sides[1], dtype=np.int64))


def need_rows(rows: np.ndarray, offsets: np.ndarray, plans: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The rows a planning round asks to count, ascending, each once: for every prompt ``p``
    whose plan (``plans[p]``, ``plan_windows``' ``(status, n_pinned, lo, hi)``) has status 1,
    the rows of its positions ``[lo, hi)`` whose count is ``-1``.

    >>> i64 = lambda *x: np.array(x, dtype=np.int64)
    >>> need_rows(i64(0, 1, 2, 2, 3), i64(0, 3, 5), i64(1, 0, 1, 3, 0, 0, 0, 2).reshape(2, 4),
    ...           i64(-1, -1, -1, -1)).tolist()
    [1, 2]
    """
    n_prompts = len(offsets) - 1
    _check_plans(plans, offsets, n_prompts, len(rows))
    n_tab = len(counts)
    want: set[int] = set()
    for p in range(n_prompts):
        if plans[p, 0] != 1:
            continue
        base = int(offsets[p])
        for x in range(base + int(plans[p, 2]), base + int(plans[p, 3])):
            r = int(rows[x])
            if r < 0 or r >= n_tab:
                raise ValueError(f"rows[{x}] must index the records (0..{n_tab - 1}), got {r}")
            if counts[r] < 0:
                want.add(r)
    return np.array(sorted(want), dtype=np.int64)


def gather_rows(distinct: list[Any], rows: np.ndarray, offsets: np.ndarray, plans: np.ndarray) -> list[list[Any]]:
    """Every output list, read through the rows: prompt ``p`` is ``distinct[r]`` for ``r`` in
    ``rows[offsets[p]:offsets[p+1]]`` (``intern_rows``' or ``pack_rows``' CSR), and its output
    is ``prompt[:n_pinned] + prompt[lo:hi]`` from ``plans[p]`` = ``(status, n_pinned, lo, hi)``
    (any status); every output is a new list.

    >>> i64 = lambda *x: np.array(x, dtype=np.int64)
    >>> gather_rows(["s", "a", "b", "c"], i64(0, 1, 2, 3, 1), i64(0, 4, 5),
    ...             i64(0, 1, 2, 4, 0, 0, 0, 1).reshape(2, 4))
    [['s', 'b', 'c'], ['a']]
    """
    if type(distinct) is not list:
        raise TypeError(f"distinct must be a list, got {type(distinct).__name__}")
    n_prompts = len(offsets) - 1
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    if offsets[0] != 0 or offsets[n_prompts] != len(rows):
        raise ValueError(f"offsets must start at 0 and end at {len(rows)}")
    if plans.ndim != 2 or plans.shape[0] != n_prompts or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({n_prompts}, 4), got {tuple(plans.shape)}")
    for p in range(n_prompts):
        if offsets[p + 1] < offsets[p]:
            raise ValueError(f"offsets must be non-decreasing (at index {p + 1})")
    n_tab = len(distinct)
    out = []
    for p in range(n_prompts):
        base, size = int(offsets[p]), int(offsets[p + 1] - offsets[p])
        k, lo, hi = int(plans[p, 1]), int(plans[p, 2]), int(plans[p, 3])
        if not 0 <= k <= lo <= hi <= size:
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {size}, got {k}, {lo}, {hi}")
        items = []
        for x in [*range(base, base + k), *range(base + lo, base + hi)]:
            r = int(rows[x])
            if not 0 <= r < n_tab:
                raise ValueError(f"rows[{x}] must index distinct (0..{n_tab - 1}), got {r}")
            items.append(distinct[r])
        out.append(items)
    return out


def _check_plans(plans: np.ndarray, offsets: np.ndarray, n_prompts: int, n_rows: int) -> None:
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    if offsets[0] != 0 or offsets[n_prompts] != n_rows:
        raise ValueError(f"offsets must start at 0 and end at {n_rows}")
    if plans.ndim != 2 or plans.shape[0] != n_prompts or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({n_prompts}, 4), got {tuple(plans.shape)}")
    for p in range(n_prompts):
        size = int(offsets[p + 1] - offsets[p])
        if size < 0:
            raise ValueError(f"offsets must be non-decreasing (at index {p + 1})")
        if plans[p, 0] == 1 and not 0 <= plans[p, 2] <= plans[p, 3] <= size:
            raise ValueError(f"prompt {p}: need 0 <= lo <= hi <= {size}, got {plans[p, 2]}, {plans[p, 3]}")


def group_states(states: Sequence[Any], key: str) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """``(srcs, order, group_off, tops, rest)``: the histories of ``states`` grouped by the
    identity of their first message. ``srcs[i]`` is ``states[i][key]`` when ``states[i]`` is a
    ``dict`` (exactly) holding a list there, else ``None``; state ``i`` joins the group of
    ``srcs[i][0]`` when that list is not empty, else ``rest`` (ascending). Group ``g`` (in
    order of first appearance) is ``order[group_off[g]:group_off[g+1]]`` (ascending) and
    ``tops[g]`` its first member with the longest history.

    >>> a, b = object(), object()
    >>> srcs, order, off, tops, rest = group_states([{"m": [a, b]}, {"m": []}, {"m": [b]}, {"m": [a]}, 7], "m")
    >>> order.tolist(), off.tolist(), tops.tolist(), rest
    ([0, 3, 2], [0, 2, 3], [0, 2], [1, 4])
    """
    srcs: list[Any] = []
    groups: dict[int, list[int]] = {}
    rest: list[int] = []
    for i, st in enumerate(states):
        src = st.get(key) if type(st) is dict else None
        if type(src) is not list:
            src = None
        srcs.append(src)
        if src:
            groups.setdefault(id(src[0]), []).append(i)
        else:
            rest.append(i)
    order: list[int] = []
    off = [0]
    tops: list[int] = []
    for members in groups.values():
        order.extend(members)
        off.append(len(order))
        tops.append(max(members, key=lambda i: len(srcs[i])))
    return (srcs, np.array(order, dtype=np.int64), np.array(off, dtype=np.int64), np.array(tops, dtype=np.int64),
            rest)


def prefix_groups(hists: list[Any], srcs: list[Any], order: np.ndarray, group_off: np.ndarray,
                  tops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(gid, firsts)``: the states whose history is a prefix of their group's longest one.

    Group ``g`` (``group_states``' result) has the members ``order[group_off[g]:group_off[g+1]]``
    and the base ``srcs[tops[g]]`` (a list); ``hists[g]`` is a provider's output for the base,
    one item per item, or ``None`` (no usable output). ``gid[i] = g`` for a member of a group
    with an output whose ``srcs[i]`` is a list whose items are ``base[:len(srcs[i])]`` (by
    identity); ``-1`` for every other state (``len(srcs)`` of them in all). ``firsts[g]`` is the
    first ``j`` where ``hists[g][j]`` is neither ``base[j]`` nor equal to it (an annotated copy;
    a provider may hand back an equal object it made for an equal message before),
    ``len(base)`` when there is none, ``-1`` for a group without an output.

    >>> a, b, c, x = "a", "b", "c", "x2"
    >>> i64 = lambda *v: np.array(v, dtype=np.int64)
    >>> gid, firsts = prefix_groups([[a, x, c]], [[a], [a, b, c], [a, c]], i64(0, 1, 2), i64(0, 3), i64(1))
    >>> gid.tolist(), firsts.tolist()
    ([0, 0, -1], [1])
    """
    for name, v in (("hists", hists), ("srcs", srcs)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    n_groups, n_srcs, n_order = len(tops), len(srcs), len(order)
    if len(hists) != n_groups or len(group_off) != n_groups + 1:
        raise ValueError(f"hists and group_off must have {n_groups} and {n_groups + 1} items, "
                         f"got {len(hists)} and {len(group_off)}")
    gid = np.full(n_srcs, -1, dtype=np.int64)
    firsts = np.full(n_groups, -1, dtype=np.int64)
    for g in range(n_groups):
        a, b, top = int(group_off[g]), int(group_off[g + 1]), int(tops[g])
        if not 0 <= a <= b <= n_order:
            raise ValueError(f"group_off must be non-decreasing within 0..{n_order}, got {a}, {b} at group {g}")
        if not 0 <= top < n_srcs:
            raise ValueError(f"tops[{g}] must index srcs, got {top}")
        base = srcs[top]
        if type(base) is not list:
            raise TypeError(f"srcs[{top}] (the base of group {g}) must be a list, got {type(base).__name__}")
        hist = hists[g]
        if hist is None:
            for x in range(a, b):
                if not 0 <= order[x] < n_srcs:
                    raise ValueError(f"order[{x}] must index srcs, got {int(order[x])}")
            continue
        if type(hist) is not list or len(hist) != len(base):
            raise ValueError(f"hists[{g}] must be None or a list as long as its base ({len(base)} items)")
        first = 0
        while first < len(hist) and first < len(base) and (hist[first] is base[first] or hist[first] == base[first]):
            first += 1
        firsts[g] = first
        if len(srcs) != n_srcs or len(hists) != n_groups:
            raise RuntimeError("srcs or hists changed size while the history was compared")
        n = len(base)
        for x in range(a, b):
            i = int(order[x])
            if not 0 <= i < n_srcs:
                raise ValueError(f"order[{x}] must index srcs, got {i}")
            src = srcs[i]
            if type(src) is list and len(src) <= n and all(src[j] is base[j] for j in range(len(src))):
                gid[i] = g
    return gid, firsts


def pack_rows(head: list[Any], tail: list[Any], notes: list[Any], hists: list[Any], firsts: np.ndarray,
              srcs: list[Any], gid: np.ndarray, prompts: list[Any], cls: type) -> tuple[np.ndarray, np.ndarray, list[Any], list[int]]:
    """``intern_rows(full, cls)`` (its four results), where ``full[i]`` is the provided prompt
    of state ``i``: for ``g = gid[i] >= 0`` (``prefix_groups``) and ``k = len(srcs[i])``,
    ``head + [notes[g]] + hists[g][:k] + tail`` when ``notes[g]`` is not ``None`` and
    ``k > firsts[g]`` (the prefix holds an annotated message), else ``head + hists[g][:k] +
    tail``; ``prompts[i]`` when ``gid[i] < 0``. The compiled twin builds no such list: a
    group's rows are looked up once and copied into each member's run.

    >>> i64 = lambda *v: np.array(v, dtype=np.int64)
    >>> h, t, n, a, b = "H", "T", "N", "a", "b"
    >>> rows, off, distinct, bad = pack_rows([h], [], [n], [[a, b]], i64(1), [[a], [a, b], None],
    ...                                      i64(0, 0, -1), [None, None, [t, h]], str)
    >>> rows.tolist(), off.tolist(), distinct, bad
    ([0, 1, 0, 2, 1, 3, 4, 0], [0, 2, 6, 8], ['H', 'a', 'N', 'b', 'T'], [])
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a type, got {type(cls).__name__}")
    for name, v in (("head", head), ("tail", tail), ("notes", notes), ("hists", hists), ("srcs", srcs),
                    ("prompts", prompts)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    n_groups, n = len(hists), len(prompts)
    if len(notes) != n_groups or len(firsts) != n_groups:
        raise ValueError(f"notes and firsts must have one item per group ({n_groups}), got {len(notes)} and {len(firsts)}")
    if len(srcs) != n or len(gid) != n:
        raise ValueError(f"srcs and gid must have one item per prompt ({n}), got {len(srcs)} and {len(gid)}")
    full: list[Any] = []
    for i in range(n):
        g = int(gid[i])
        if g < 0:
            full.append(prompts[i])
            continue
        if g >= n_groups:
            raise ValueError(f"gid[{i}] must be below {n_groups}, got {g}")
        hist, src = hists[g], srcs[i]
        if type(hist) is not list or type(src) is not list or len(src) > len(hist):
            raise ValueError(f"state {i}: srcs[{i}] and hists[{g}] must be lists, the first no longer than the second")
        k, note = len(src), notes[g]
        full.append(head + ([note] if note is not None and k > firsts[g] else []) + hist[:k] + tail)
    return intern_rows(full, cls)
