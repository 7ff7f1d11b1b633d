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
``slice_outputs``
    every prompt's output list, ``prompt[:n_pinned] + prompt[lo:hi]``;
``group_states``, ``prefix_prompts``
    ``build_batch``'s states grouped by their history's first message, and the provided
    prompts of the states whose histories are prefixes of one history, from one provider
    output for the longest (``jianmu_fast.batch``).

This module is the specification: the compiled twin has the same names, signatures, results
and error messages, and ``tests/test_batch_core.py`` proves it on random inputs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["group_states", "intern_rows", "need_rows", "prefix_prompts", "slice_outputs", "table_records"]


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


def slice_outputs(prompts: Sequence[list[Any]], plans: np.ndarray) -> list[list[Any]]:
    """``[prompts[p][:n_pinned] + prompts[p][lo:hi] for each p]``, from ``plans[p]`` =
    ``(status, n_pinned, lo, hi)``; every output is a new list.

    >>> slice_outputs([["s", "a", "b", "c"], ["x"]], np.array([[0, 1, 2, 4], [0, 0, 0, 1]]))
    [['s', 'b', 'c'], ['x']]
    """
    if plans.ndim != 2 or plans.shape[0] != len(prompts) or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({len(prompts)}, 4), got {tuple(plans.shape)}")
    out = []
    for p, msgs in enumerate(prompts):
        if type(msgs) is not list:
            raise TypeError(f"prompts[{p}] must be a list, got {type(msgs).__name__}")
        k, lo, hi = int(plans[p, 1]), int(plans[p, 2]), int(plans[p, 3])
        if not 0 <= k <= lo <= hi <= len(msgs):
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {len(msgs)}, got {k}, {lo}, {hi}")
        out.append(msgs[:k] + msgs[lo:hi])
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


def prefix_prompts(head: list[Any], note_head: list[Any], tail: list[Any], hist: list[Any], base: list[Any],
                   srcs: list[Any], members: np.ndarray, out: list[Any]) -> list[int]:
    """For each ``i`` of ``members``, with ``src = srcs[i]`` a list whose items are
    ``base[:len(src)]`` (by identity) and ``k = len(src)``: ``out[i] =
    (note_head if hist[:k] differs from base[:k] else head) + hist[:k] + tail``, where
    "differs" means some ``hist[i]`` is neither ``base[i]`` nor equal to it (an annotated
    copy; a provider may hand back an equal object it made for an equal message before).
    ``hist`` is a provider's output for ``base``, one item per item. Returns the members
    that are not such prefixes (their ``out`` slots untouched), in order.

    >>> a, b, c, x = "a", "b", "c", "x2"
    >>> out = [None] * 5
    >>> prefix_prompts(["H"], ["H", "N"], [], [a, x, c], [a, b, c], [[a], [a, b], [b], "s", [a, b, c, a]],
    ...                np.arange(5), out), out
    ([2, 3, 4], [['H', 'a'], ['H', 'N', 'a', 'x2'], None, None, None])
    """
    for name, v in (("head", head), ("note_head", note_head), ("tail", tail), ("hist", hist), ("base", base),
                    ("srcs", srcs), ("out", out)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    n = len(base)
    if len(hist) != n:
        raise ValueError(f"hist has {len(hist)} items, base has {n}")
    for i in members:
        if not (0 <= i < len(srcs) and i < len(out)):
            raise ValueError(f"members must index srcs and out, got {int(i)}")
    first = next((i for i in range(n) if not (hist[i] is base[i] or hist[i] == base[i])), n)
    missed: list[int] = []
    for i in members.tolist():
        src = srcs[i]
        k = len(src) if type(src) is list else -1
        if k < 0 or k > n or any(src[j] is not base[j] for j in range(k)):
            missed.append(i)
        else:
            out[i] = (note_head if k > first else head) + hist[:k] + tail
    return missed
