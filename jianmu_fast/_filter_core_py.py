"""Pure-Python reference of the compiled filter core (``csrc/_filter_core.pyx``).

This module is the specification: the compiled twin has the same names, signatures,
results and error messages, and ``tests/test_filter_core.py`` proves it on random inputs.

Terms
-----
``counts``
    One non-negative cost per message (tokens, or 1 per message for a message-count limit).
    ``counts[:n_pinned]`` is the pinned prefix, always kept and always paid for.
``unit_starts``
    Where each unit (a message, or an assistant tool-call message with its tool results)
    starts: strictly increasing indices, the first equal to ``n_pinned``, all below
    ``len(counts)``. Unit ``u`` spans ``unit_starts[u]`` up to the next start (the last one
    up to ``len(counts)``). No units when ``len(counts) == n_pinned``.
``budget``
    The most the output may cost, pinned prefix included.
``from_start``
    ``True``: drop the oldest units and keep the longest run of newest units that fits.
    ``False``: drop the newest units and keep the longest run of oldest units that fits.
``MAX_VALUE``
    ``2**53``: every count, ``budget`` and ``chunk`` lies in ``[0, MAX_VALUE]`` (else
    ``ValueError``). Inside that range the compiled core never overflows: sums that could
    exceed int64 (a pinned prefix or a unit of many huge messages) saturate at ``2**62``,
    which is larger than any budget, so every decision equals the exact one.
``chunk``
    ``0`` (exact eviction) or a positive step (chunked eviction, ``from_start`` only): when
    the units do not all fit, the cost to drop, ``total - (budget - pinned)``, is rounded up
    to a multiple of ``chunk`` and the cut goes to the first unit boundary at or past it, but
    never past the start of the newest unit and never before the exact cut. The cut then
    stays put while the history grows, until the limit is crossed again, which keeps the
    start of the prompt byte-stable for prompt caches. With ``from_start=False`` the kept
    prefix is stable anyway and ``chunk`` changes nothing.

Result
------
``(lo, hi)``: the kept non-pinned messages are ``[lo, hi)``; the output is the pinned
prefix plus that run. ``lo == hi`` means no unit could be kept (the pinned prefix alone is
over the budget, or the unit to keep first does not fit beside it); callers decide how to
report that. Work is linear in the units visited: with exact eviction and
``from_start=True`` the walk starts at the newest unit and stops after the first unit that
does not fit, so a caller may hand in only a tail of the history that can possibly be kept.
Validation of the arguments is linear in the arrays handed in.
"""

from __future__ import annotations

import array
import hashlib
import operator
import weakref
from itertools import islice

import numpy as np

__all__ = ["KNOWN_MAX", "MAX_VALUE", "ROLE_CODES", "Records", "counts_of", "plan_window", "plan_windows", "sanitize_window", "sanitize_windows", "select_window", "select_windows", "summarizing_trim"]

MAX_VALUE = 1 << 53
#: the most new messages whose counts ``Records.window`` takes from its ``known`` argument
KNOWN_MAX = 16


def _check_range(where, name, value):
    if value < 0 or value > MAX_VALUE:
        raise ValueError(f"{where}{name} must be between 0 and 2**53, got {value}")


def _validate(counts, unit_starts, n_pinned, budget, chunk, where=""):
    n = len(counts)
    if n_pinned < 0 or n_pinned > n:
        raise ValueError(f"{where}n_pinned must be between 0 and len(counts) ({n}), got {n_pinned}")
    _check_range(where, "budget", budget)
    _check_range(where, "chunk", chunk)
    for i in range(n):
        if counts[i] < 0 or counts[i] > MAX_VALUE:
            raise ValueError(f"{where}counts[{i}] must be between 0 and 2**53, got {counts[i]}")
    n_units = len(unit_starts)
    if n == n_pinned:
        if n_units != 0:
            raise ValueError(f"{where}unit_starts must be empty when every message is pinned")
        return
    if n_units == 0 or unit_starts[0] != n_pinned:
        first = unit_starts[0] if n_units else None
        raise ValueError(f"{where}unit_starts[0] must equal n_pinned ({n_pinned}), got {first}")
    for u in range(1, n_units):
        if unit_starts[u] <= unit_starts[u - 1]:
            raise ValueError(f"{where}unit_starts must be strictly increasing (at index {u})")
    if unit_starts[n_units - 1] >= n:
        raise ValueError(f"{where}unit_starts[{n_units - 1}] must be below len(counts) ({n})")


def _select(counts, unit_starts, n_pinned, budget, from_start, chunk):
    n = len(counts)
    n_units = len(unit_starts)
    pinned = sum(int(c) for c in counts[:n_pinned])
    if n_units == 0 or pinned > budget:
        return (n, n) if from_start else (n_pinned, n_pinned)
    avail = budget - pinned

    def unit_cost(u):
        end = unit_starts[u + 1] if u + 1 < n_units else n
        return sum(int(c) for c in counts[unit_starts[u]:end])

    if not from_start:
        kept, k = 0, 0
        while k < n_units and kept + unit_cost(k) <= avail:
            kept += unit_cost(k)
            k += 1
        return (n_pinned, int(unit_starts[k]) if k < n_units else n)

    def keep_newest(avail):
        kept, k = 0, n_units
        while k > 0 and kept + unit_cost(k - 1) <= avail:
            kept += unit_cost(k - 1)
            k -= 1
        return k

    k = keep_newest(avail)
    lo = int(unit_starts[k]) if k < n_units else n
    if chunk == 0 or k == 0:
        return (lo, n)
    # The cost to drop, x = total - avail, rounded up to a multiple of chunk; the cut is the
    # first unit boundary where what was dropped reaches that: the same as keeping the newest
    # units within avail - ((-x) mod chunk), which needs only x mod chunk (no large sums).
    x_mod = (sum(int(c) for c in counts[n_pinned:]) - avail) % chunk
    j = keep_newest(avail - (chunk - x_mod) % chunk)
    lo_chunk = int(unit_starts[j]) if j < n_units else n
    return (max(lo, min(lo_chunk, int(unit_starts[n_units - 1]))), n)


def select_window(counts, unit_starts, n_pinned, budget, from_start, chunk=0):
    """Decide which messages of one prompt to keep; see the module docstring.

    >>> import numpy as np
    >>> counts = np.array([5, 3, 4, 2, 6], dtype=np.int64)   # 1 pinned + 4 messages
    >>> starts = np.array([1, 2, 4], dtype=np.int64)          # units [1], [2, 3], [4]
    >>> select_window(counts, starts, 1, 13, True)   # 5 pinned + 6: unit [2, 3] would need 6 more
    (4, 5)
    >>> select_window(counts, starts, 1, 13, False)  # 5 pinned + 3: unit [2, 3] would need 6 more
    (1, 2)
    """
    _validate(counts, unit_starts, n_pinned, budget, chunk)
    return _select(counts, unit_starts, n_pinned, budget, bool(from_start), chunk)


def select_windows(counts, offsets, unit_starts, unit_offsets, n_pinned, budgets, from_start, chunk=0):
    """Decide many prompts at once over CSR-packed arrays.

    Prompt ``p`` has counts ``counts[offsets[p]:offsets[p+1]]`` and unit starts
    ``unit_starts[unit_offsets[p]:unit_offsets[p+1]]`` (indices local to the prompt), pins
    ``n_pinned[p]`` messages and has budget ``budgets[p]``. Returns two int64 arrays
    ``(lo, hi)`` of local indices, equal to ``select_window`` on each prompt.

    >>> import numpy as np
    >>> i64 = lambda *x: np.array(x, dtype=np.int64)
    >>> lo, hi = select_windows(i64(5, 3, 4, 2, 6, 1, 1), i64(0, 5, 7), i64(1, 2, 4, 0, 1),
    ...                         i64(0, 3, 5), i64(1, 0), i64(13, 1), True)
    >>> lo.tolist(), hi.tolist()
    ([4, 1], [5, 2])
    """
    n_prompts = len(n_pinned)
    if len(budgets) != n_prompts:
        raise ValueError(f"budgets has {len(budgets)} entries, n_pinned has {n_prompts}")
    for name, off, size in (("offsets", offsets, len(counts)), ("unit_offsets", unit_offsets, len(unit_starts))):
        if len(off) != n_prompts + 1:
            raise ValueError(f"{name} must have len(n_pinned) + 1 = {n_prompts + 1} entries, got {len(off)}")
        if off[0] != 0 or off[n_prompts] != size:
            raise ValueError(f"{name} must start at 0 and end at {size}")
        for p in range(n_prompts):
            if off[p + 1] < off[p]:
                raise ValueError(f"{name} must be non-decreasing (at index {p + 1})")
    _check_range("", "chunk", chunk)
    lo = np.empty(n_prompts, dtype=np.int64)
    hi = np.empty(n_prompts, dtype=np.int64)
    for p in range(n_prompts):
        c = counts[offsets[p]:offsets[p + 1]]
        us = unit_starts[unit_offsets[p]:unit_offsets[p + 1]]
        _validate(c, us, int(n_pinned[p]), int(budgets[p]), chunk, f"prompt {p}: ")
        lo[p], hi[p] = _select(c, us, int(n_pinned[p]), int(budgets[p]), bool(from_start), chunk)
    return lo, hi


# -- per-prompt plans over message records (issue 13) -----------------------------------------
#
# A prompt is described by one record per message: ``roles`` (int8: 0 system, 1 user,
# 2 assistant, 3 tool) and ``counts`` (int64, ``-1`` where not counted yet). ``plan_window``
# finds the pinned prefix (the leading messages whose role bit is set in ``pinned_mask``),
# splits the rest into units (a unit starts at the first message after the pinned prefix
# and at every message that is not a tool result) and selects the window exactly as
# ``select_window`` does, or says which counts it still needs.

ROLE_CODES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}
TOOL = 3
ASSISTANT = 2
_SAT = 1 << 62  # Records.folds: token sums stay at most this (int64 in the compiled twin)


def _pinned(roles, pinned_mask):
    n = len(roles)
    k = 0
    while k < n and (pinned_mask >> int(roles[k])) & 1:
        k += 1
    return k


def _unit_start_at_or_before(roles, i, n_pinned):
    while i > n_pinned and roles[i] == TOOL:
        i -= 1
    return i


def plan_window(roles, counts, pinned_mask, budget, from_start, chunk=0, pinned_free=False):
    """Plan one prompt from its records: ``(status, n_pinned, lo, hi)``.

    ``status == 0``: decided; the output is ``[:n_pinned] + [lo:hi]`` (``lo == hi``: no unit
    fits beside the pinned prefix, as in ``select_window``). ``status == 1``: count every
    message of ``[lo:hi)`` whose count is ``-1`` and call again: the pinned prefix first (its
    counts are needed unless ``pinned_free``, which makes pinned messages cost 0), then, with
    exact eviction of the oldest units, tails found walking back from the newest unit in
    growing steps (32 messages, then what the budget left allows at the average cost per
    message so far, plus a quarter, at least half of what was walked); other modes need every
    count after the pinned prefix. A walk starts its steps on unit starts.

    >>> import numpy as np
    >>> roles = np.array([0, 1, 2, 3, 1], dtype=np.int8)   # system, user, call, result, user
    >>> counts = np.array([5, -1, -1, -1, 4], dtype=np.int64)
    >>> plan_window(roles, counts, 1, 12, True)             # the newest unit fits; [2:4] unknown
    (1, 1, 2, 4)
    >>> counts[1:4] = [3, 2, 2]
    >>> plan_window(roles, counts, 1, 12, True)             # 5 + 4 + (2 + 2) > 12
    (0, 1, 4, 5)
    """
    n = len(roles)
    if len(counts) != n:
        raise ValueError(f"counts has {len(counts)} entries, roles has {n}")
    _check_range("", "budget", budget)
    _check_range("", "chunk", chunk)
    for i in range(n):
        if counts[i] < -1 or counts[i] > MAX_VALUE:
            raise ValueError(f"counts[{i}] must be -1 (not counted) or between 0 and 2**53, got {counts[i]}")
        if not 0 <= roles[i] <= 3:
            raise ValueError(f"roles[{i}] must be 0..3, got {roles[i]}")
    n_pinned = _pinned(roles, pinned_mask)
    if not pinned_free and any(counts[i] < 0 for i in range(n_pinned)):
        return (1, n_pinned, 0, n_pinned)
    pinned = 0 if pinned_free else sum(int(c) for c in counts[:n_pinned])
    if n_pinned == n or pinned > budget:
        return (0, n_pinned, n, n) if from_start else (0, n_pinned, n_pinned, n_pinned)
    avail = budget - pinned
    if not (from_start and chunk == 0):
        if any(counts[i] < 0 for i in range(n_pinned, n)):
            return (1, n_pinned, n_pinned, n)
    else:
        # walk back from the newest unit; stop at the first unit that does not fit
        kept = 0
        end = n
        while end > n_pinned:
            s = _unit_start_at_or_before(roles, end - 1, n_pinned)
            unit = counts[s:end]
            if any(c < 0 for c in unit):
                walked = n - end
                per = max(1, kept // walked) if walked else 1
                step = 32 if not walked else max(walked // 2, (avail - kept) // per * 5 // 4 + 2)
                lo = _unit_start_at_or_before(roles, max(n_pinned, end - step), n_pinned)
                return (1, n_pinned, min(lo, s), end)
            cost = sum(int(c) for c in unit)
            if kept + cost > avail:
                break
            kept += cost
            end = s
        return (0, n_pinned, end if end < n else n, n)
    starts = [n_pinned] + [i for i in range(n_pinned + 1, n) if roles[i] != TOOL]
    sub = [0] * n_pinned + [int(c) for c in counts[n_pinned:]]
    lo, hi = _select(sub, starts, n_pinned, avail, from_start, chunk)
    return (0, n_pinned, lo, hi)


def sanitize_window(roles, call_off, call_ids, result_ids, n_pinned, lo, hi):
    """The decision of ``sanitize_tool_call_history`` over the prompt ``[:n_pinned] + [lo:hi]``.

    ``call_off`` (``len(roles) + 1`` offsets) and ``call_ids`` hold each message's call ids
    (interned ints; an assistant message without calls has none), ``result_ids`` each tool
    result's id; ``-1`` is a missing (or empty) id. Returns ``(status, drops)``: ``0``, the
    prompt is valid; ``1``, leave out the broken historical units ``drops`` (pairs of
    positions in the prompt, ``[a, b)``); ``2``, the pure-Python sanitizer must decide (a
    missing id it may fill, or a broken newest unit: its exact error).

    >>> import numpy as np
    >>> i64 = lambda *x: np.array(x, dtype=np.int64)
    >>> roles = np.array([1, 2, 3, 1, 2, 3, 1], dtype=np.int8)      # a call answered by a wrong id
    >>> sanitize_window(roles, i64(0, 0, 1, 1, 1, 2, 2, 2), i64(7, 8), i64(-1, -1, 7, -1, -1, 9, -1), 0, 0, 7)
    (1, [(4, 6)])
    """
    n = len(roles)
    if len(call_off) != n + 1 or len(result_ids) != n:
        raise ValueError(f"call_off needs {n + 1} entries and result_ids {n}, got {len(call_off)} and {len(result_ids)}")
    if not (0 <= n_pinned <= lo <= hi <= n):
        raise ValueError(f"need 0 <= n_pinned <= lo <= hi <= {n}, got {n_pinned}, {lo}, {hi}")
    idx = list(range(n_pinned)) + list(range(lo, hi))
    m = len(idx)
    drops = []
    pending = False
    i = 0
    while i < m:
        p = idx[i]
        r = roles[p]
        nc = int(call_off[p + 1] - call_off[p])
        if r == TOOL or (r == ASSISTANT and nc > 0):
            j = i + 1
            while j < m and roles[idx[j]] == TOOL:
                j += 1
            if r == TOOL:
                ok = False
            else:
                cids = [int(c) for c in call_ids[call_off[p]:call_off[p + 1]]]
                rids = [int(result_ids[idx[x]]) for x in range(i + 1, j)]
                if -1 in cids or -1 in rids:
                    return (2, [])
                ok = j - i - 1 == nc and len(set(cids)) == nc and set(cids) == set(rids)
            pending = not ok
            if not ok:
                drops.append((i, j))
            i = j
            continue
        if pending and r != 0:
            pending = False
        i += 1
    if pending:
        return (2, [])
    return (1, drops) if drops else (0, [])


def _check_rows(rows, offsets, n_tab):
    n_prompts = len(offsets) - 1
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    if offsets[0] != 0 or offsets[n_prompts] != len(rows):
        raise ValueError(f"offsets must start at 0 and end at {len(rows)}")
    for p in range(n_prompts):
        if offsets[p + 1] < offsets[p]:
            raise ValueError(f"offsets must be non-decreasing (at index {p + 1})")
    for i in range(len(rows)):
        if rows[i] < 0 or rows[i] >= n_tab:
            raise ValueError(f"rows[{i}] must index the records (0..{n_tab - 1}), got {rows[i]}")
    return n_prompts


def plan_windows(rows, offsets, roles, counts, pinned_mask, budget, from_start, chunk=0, pinned_free=False):
    """``plan_window`` for many prompts over one table of records: prompt ``p`` is the
    records ``rows[offsets[p]:offsets[p+1]]`` (so a message shared by prompts has one record).
    Returns an int64 array of shape ``(n_prompts, 4)``: ``plan_window``'s tuple per prompt
    (positions local to the prompt; an empty prompt plans ``(0, 0, 0, 0)``).

    >>> import numpy as np
    >>> roles = np.array([0, 1, 1], dtype=np.int8); counts = np.array([5, 3, 4], dtype=np.int64)
    >>> plan_windows(np.array([0, 1, 2, 0, 2], dtype=np.int64), np.array([0, 3, 5], dtype=np.int64),
    ...              roles, counts, 1, 9, True).tolist()
    [[0, 1, 2, 3], [0, 1, 1, 2]]
    """
    n_tab = len(roles)
    if len(counts) != n_tab:
        raise ValueError(f"counts has {len(counts)} entries, roles has {n_tab}")
    for i in range(n_tab):
        if counts[i] < -1 or counts[i] > MAX_VALUE:
            raise ValueError(f"counts[{i}] must be -1 (not counted) or between 0 and 2**53, got {counts[i]}")
        if not 0 <= roles[i] <= 3:
            raise ValueError(f"roles[{i}] must be 0..3, got {roles[i]}")
    _check_range("", "budget", budget)
    _check_range("", "chunk", chunk)
    n_prompts = _check_rows(rows, offsets, n_tab)
    out = np.zeros((n_prompts, 4), dtype=np.int64)
    for p in range(n_prompts):
        r = rows[offsets[p]:offsets[p + 1]]
        if len(r):
            out[p] = plan_window(roles[r], counts[r], pinned_mask, budget, from_start, chunk, pinned_free)
    return out


def sanitize_windows(rows, offsets, roles, call_off, call_ids, result_ids, n_pinned, lo, hi):
    """``sanitize_window``'s status (without the drops) for many planned prompts over one
    table of records (see ``plan_windows``); ``n_pinned``, ``lo``, ``hi`` are local positions.

    >>> import numpy as np
    >>> i64 = lambda *x: np.array(x, dtype=np.int64)
    >>> roles = np.array([1, 2, 3], dtype=np.int8)          # user, call c7, result for c7
    >>> sanitize_windows(i64(0, 1, 2, 0, 1), i64(0, 3, 5), roles, i64(0, 0, 1, 1), i64(7), i64(-1, -1, 7),
    ...                  i64(0, 0), i64(0, 0), i64(3, 2)).tolist()
    [0, 2]
    """
    n_tab = len(roles)
    n_prompts = _check_rows(rows, offsets, n_tab)
    if len(call_off) != n_tab + 1 or len(result_ids) != n_tab:
        raise ValueError(f"call_off needs {n_tab + 1} entries and result_ids {n_tab}, got {len(call_off)} and {len(result_ids)}")
    if len(n_pinned) != n_prompts or len(lo) != n_prompts or len(hi) != n_prompts:
        raise ValueError(f"n_pinned, lo and hi need {n_prompts} entries each")
    for i in range(n_tab):
        if call_off[i + 1] < call_off[i] or call_off[i] < 0 or call_off[i + 1] > len(call_ids):
            raise ValueError(f"call_off must be non-decreasing offsets into call_ids (at index {i + 1})")
    for p in range(n_prompts):
        size = offsets[p + 1] - offsets[p]
        if not (0 <= n_pinned[p] <= lo[p] <= hi[p] <= size):
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {size}, got {n_pinned[p]}, {lo[p]}, {hi[p]}")
    out = np.zeros(n_prompts, dtype=np.int64)
    for p in range(n_prompts):
        r = rows[offsets[p]:offsets[p + 1]]
        if not len(r):
            continue
        off = [0]
        ids = []
        for q in r:
            ids.extend(call_ids[call_off[q]:call_off[q + 1]])
            off.append(len(ids))
        out[p] = sanitize_window(roles[r], np.array(off, dtype=np.int64), np.array(ids, dtype=np.int64),
                                 result_ids[r], int(n_pinned[p]), int(lo[p]), int(hi[p]))[0]
    return out


def _unequal(x, y):
    """True when ``x`` and ``y`` cannot be equal Messages: their ``content`` are different strs
    (a Message equals another only with the same content), so ``Records.match`` skips the
    costlier ``==``. Treating them as unequal is always safe: the records are redone."""
    try:
        cx, cy = x.content, y.content
    except Exception:
        return False
    return type(cx) is str and type(cy) is str and cx != cy


class Records:
    """The records of one prompt that grows in place (the agent loop): per message its role
    code, its count (``-1`` until counted), the interned ids of its calls (``call_off`` /
    ``call_ids``) and the interned id it answers (``result_ids``; ``-1`` a missing or empty
    id), as ``plan_window`` and ``sanitize_window`` read them, plus the messages themselves.

    The next prompt that starts with the recorded messages (``match``) only appends records
    (``advance``), so a turn of the agent loop costs its new messages. A prompt that shares
    only a prefix with them (a message edited, inserted or deleted in the middle, as context
    editing does) keeps the records of that common prefix and re-appends the rest
    (``truncate`` then ``extend``), so an edit costs the messages after it. ``plan`` and
    ``sanitize`` equal ``plan_window`` and ``sanitize_window`` over ``roles``, ``counts``,
    ``call_off``, ``call_ids`` and ``result_ids``. A prompt that differs from the records
    only at a few positions whose new messages keep their records' roles and ids (a clearing
    step's cleared results) is patched in place: those records take the new messages and
    counts, nothing is re-appended. The compiled twin keeps prefix sums of
    the counted tail, extended with each record, so that ``plan`` is a binary search
    (O(log n) plus the messages of one unit) instead of a walk over the kept messages; and
    ``sanitize_window``'s scan of all records as one prompt (per position: whether a unit
    starts there, and counts of the units before it with a missing id or broken, and the last
    one that sets the pending state), resumed at its last unit as records are appended, so
    that ``sanitize`` (and ``window``'s check) of a prompt whose bounds are unit starts of that
    scan costs the new records, not the prompt; other bounds are scanned as here.
    ``message_type`` is the type every appended message must have (``advance`` returns
    ``-2`` otherwise); records read ``role``, ``tool_call_id`` and ``tool_calls``.

    The summarizing budget (``SummarizingBudgetFilter``) works over the records of its inner
    budget: ``window(..., insert=)`` puts its summary message in while the cut stays put (and
    hands back the plan when it moved), ``folds`` / ``fold_keys`` read its rolling summary's
    fold points (and their content keys, over ``joined`` digests) off the records.

    >>> from jianmu_fast.message import Message, ai, human, system, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> history = [system("s"), human("q")]
    >>> rec = Records(Message)
    >>> rec.advance(history, lambda new: [5] * len(new)), rec.n
    (2, 2)
    >>> history += [ai(None, tool_calls=call), tool("r", tool_call_id="c1")]
    >>> rec.advance(history, lambda new: [4, 9]), rec.counts.tolist(), rec.result_ids.tolist()
    (2, [5, 5, 4, 9], [-1, -1, -1, 0])
    >>> rec.plan(18, 1, True)         # system pinned (5); the call and its result (13) fit
    (0, 1, 2, 4)
    >>> rec.advance(history, len), rec.advance(history[1:], len), rec.advance(history + [{}], len)
    (0, -1, -2)
    >>> history[1] = human("edited")  # the same role (and ids): the record takes it, recounted
    >>> rec.advance(history, lambda new: [7] * len(new)), rec.counts.tolist(), rec.n, rec.version
    (0, [5, 7, 4, 9], 4, 1)
    >>> history[1] = ai("edited")  # another role: the records from there on are redone; the
    >>> # edited one lies before the last plan's window (it starts at 2): left uncounted
    >>> rec.advance(history, lambda new: [4, 9]), rec.counts.tolist(), rec.n
    (3, [5, -1, 4, 9], 4)
    """

    def __init__(self, message_type=object):
        self._type = message_type
        self._msgs = []
        self._intern = {}
        self._roles = []
        self._counts = []
        self._rids = []
        self._off = [0]
        self._ids = []
        self._common = 0  # after a failed match: how many leading messages msgs shares
        self._last_lo = 0  # the window start of the last decided plan
        self._version = 0  # bumped when recorded messages are dropped or patched
        self._patch = None  # positions match found patchable (see _apply_patch)
        self._patch_counts = None  # the hint's counts of those messages, or None (see hint)
        self._hint = None  # (msgs, patched, originals, counts) for the next match (see hint)

    @property
    def n(self):
        """How many messages are recorded."""
        return len(self._msgs)

    @property
    def msgs(self):
        """A copy of the recorded messages."""
        return list(self._msgs)

    @property
    def version(self):
        """How many times recorded messages were dropped (``truncate``, a rewind) or patched
        (``_apply_patch``): while it stays the same, the records only grew, so the message at
        each position below ``n`` is the one recorded there (or an equal one, see ``match``).
        The summarizing budget resumes its rolling summary over the records on that promise,
        without comparing."""
        return self._version

    @property
    def roles(self):
        return np.array(self._roles, dtype=np.int8)

    @property
    def counts(self):
        return np.array(self._counts, dtype=np.int64)

    @property
    def call_off(self):
        return np.array(self._off, dtype=np.int64)

    @property
    def call_ids(self):
        return np.array(self._ids, dtype=np.int64)

    @property
    def result_ids(self):
        return np.array(self._rids, dtype=np.int64)

    @property
    def interned(self):
        """How many distinct call ids were interned."""
        return len(self._intern)

    def _interned(self, key):
        return self._intern.setdefault(key, len(self._intern)) if key else -1

    def match(self, msgs):
        """``len(msgs) - n`` when the list ``msgs`` starts with the recorded messages, each the
        same object or an equal one (which then replaces the recorded one), or differs from
        them only at a few positions whose new message can take the record with only its
        count changed (``_patchable``: the same type, role and ids, as a cleared tool result
        or a message edited in place; at most ``32 + n // 8`` of them, listed for ``advance``
        and ``window`` to apply, see ``_apply_patch``), else ``-1``. (A message whose
        ``content`` is a str other than the recorded one's is not compared: ``_unequal``.)"""
        self._patch = self._patch_counts = None
        h, self._hint = self._hint, None
        if h is not None and h[0] is msgs:
            k = self._match_hinted(msgs, h[1], h[2], h[3])
            if k != -3:
                return k
            self._patch = self._patch_counts = None
        n = len(self._msgs)
        m = len(msgs)
        patch = []
        limit = 32 + n // 8
        for i in range(min(m, n)):
            a, b = msgs[i], self._msgs[i]
            if a is not b:
                eq = not _unequal(a, b) and a == b
                if len(msgs) < m:  # the comparison changed the list
                    self._common = 0
                    return -1
                if eq:
                    self._msgs[i] = a
                    continue
                if len(patch) < limit and self._patchable(a, i):
                    if len(msgs) < m:
                        self._common = 0
                        return -1
                    patch.append(i)
                    continue
                self._common = patch[0] if patch else i
                return -1
        if m < n:
            self._common = patch[0] if patch else m
            return -1
        if patch:
            self._patch = patch
        return m - n

    def hint(self, msgs, patched, originals, counts=None):
        """Tell the next ``match`` (``advance``, ``window``) what changed, when it is given
        this very list ``msgs``: ``msgs`` holds the recorded messages, but at the positions
        ``patched`` (ascending, below ``n``; lists), where it may hold a message that replaces
        ``originals[j]`` keeping its role and ids (a clearing step's cleared copy: the caller
        vouches for it). ``match`` then compares the rest as blocks of identical objects and
        patches each such position whose record is ``originals[j]`` with no further look at
        the message (but its type); when ``msgs`` differs anywhere else, or a position's record
        is not its original, the hint is dropped and ``match`` compares as usual. Any ``match``
        consumes the hint. (The result is ``match``'s without the hint, but that a message
        equal to its original is patched rather than adopted.) ``counts`` (a list as long as
        ``patched``, or None): the counts of the messages at those positions, which the patch
        then takes instead of asking ``count`` (the caller vouches that they are what
        ``count`` would return: the clearing's own counts of its copies).

        >>> from jianmu_fast.message import Message, human, tool
        >>> a, b, c = human("q"), tool("long result", tool_call_id="1"), human("r")
        >>> rec = Records(Message)
        >>> rec.extend([a, b], [1, 11])
        >>> b2 = tool("[cleared]", tool_call_id="1")
        >>> msgs = [a, b2, c]
        >>> rec.hint(msgs, [1], [b])
        >>> rec.advance(msgs, lambda new: [len(m.content) for m in new]), rec.counts.tolist(), rec.msgs[1] is b2
        (1, [1, 9, 1], True)
        """
        if len(patched) != len(originals):
            raise ValueError(f"patched and originals must have the same length, got {len(patched)} and {len(originals)}")
        if counts is not None and (type(counts) is not list or len(counts) != len(patched)):
            raise ValueError("counts must be None or a list as long as patched")
        self._hint = (msgs, patched, originals, counts)

    def _match_hinted(self, msgs, patched, originals, counts=None):
        """``match`` on a hint (see ``hint``); ``-3`` when the hint does not hold."""
        n, m = len(self._msgs), len(msgs)
        if m < n or len(patched) != len(originals):
            return -3
        patch = []
        patch_counts = []
        prev = 0
        for j, (p, orig) in enumerate(zip(patched, originals)):
            if type(p) is not int or p < prev or p >= n:
                return -3
            if any(x is not y for x, y in zip(msgs[prev:p], self._msgs[prev:p])):
                return -3
            a, b = msgs[p], self._msgs[p]
            if a is not b:
                if b is not orig or type(a) is not self._type:
                    return -3
                patch.append(p)
                if counts is not None:
                    patch_counts.append(counts[j])
            prev = p + 1
        if any(x is not y for x, y in zip(msgs[prev:n], self._msgs[prev:n])):
            return -3
        self._patch = patch or None
        self._patch_counts = patch_counts if patch and counts is not None else None
        return m - n

    def _patchable(self, m, i):
        """Whether the message ``m`` can take record ``i`` with only its count changed: a
        ``message_type`` with record ``i``'s role and ids (the id it answers, or its calls'
        ids in order); False when reading them fails."""
        try:
            if type(m) is not self._type:
                return False
            code = ROLE_CODES.get(m.role)
            if code is None or code != self._roles[i]:
                return False
            if code == TOOL:
                key = m.tool_call_id
                return (self._intern.get(key, -2) if key else -1) == self._rids[i]
            a = self._off[i]
            nc = self._off[i + 1] - a
            calls = m.tool_calls if code == ASSISTANT else None
            if not calls:
                return nc == 0
            if len(calls) != nc:
                return False
            for j, call in enumerate(calls):
                key = call.get("id")
                if (self._intern.get(key, -2) if key else -1) != self._ids[a + j]:
                    return False
            return True
        except Exception:
            return False

    def _apply_patch(self, msgs, count):
        """Give the records ``match`` found patchable their new messages and the counts
        ``count(new)`` returns (``None``: not counted; roles and ids stay), or those the hint
        gave (see ``hint``); a new ``version``: messages changed."""
        idx = self._patch
        counts = self._patch_counts  # (the hint's)
        self._patch = self._patch_counts = None
        new = [msgs[i] for i in idx]
        if counts is None:
            counts = count(new)
        if counts is None:  # (not counted, as ``extend`` takes it)
            counts = [-1] * len(idx)
        if len(counts) != len(idx):
            raise ValueError(f"counts has {len(counts)} entries, new has {len(idx)}")
        vals = []
        for j, x in enumerate(counts):
            if not -1 <= x <= MAX_VALUE:
                raise ValueError(f"counts[{idx[j]}] must be -1 (not counted) or between 0 and 2**53, got {x}")
            vals.append(int(x))
        for i, m, v in zip(idx, new, vals):
            self._msgs[i] = m
            self._counts[i] = v
        self._version += 1

    def _rewind(self):
        """After a failed ``match``: keep the records of the messages the list shares with
        the recorded ones (``truncate``) and return their number, or ``0`` (nothing changes;
        the caller starts over) when it shares none or when the id table holds more than
        twice the ids in use plus 64 (ids are only ever added: fresh records forget them)."""
        k = self._common
        if k == 0 or len(self._intern) > 2 * (len(self._ids) + len(self._msgs)) + 64:
            return 0
        self.truncate(k)
        return k

    def truncate(self, k):
        """Keep only the records of the first ``k`` messages (interned ids stay interned)."""
        if not 0 <= k <= len(self._msgs):
            raise ValueError(f"k must be between 0 and {len(self._msgs)}, got {k}")
        del self._msgs[k:], self._roles[k:], self._counts[k:], self._rids[k:]
        del self._ids[self._off[k]:], self._off[k + 1:]
        self._version += 1

    def advance(self, msgs, count):
        """Record the list ``msgs``: the records of the longest prefix it shares with the
        recorded messages (as ``match`` compares them) are kept, those after it dropped, and
        the messages after it appended, with the counts ``count(new)`` returns (not called
        when nothing is new). After such a rewind to ``k`` messages, the appended ones before
        the start of the last decided plan's window stay uncounted (``count`` gets the rest):
        the planner asks for them only if they can be kept, as for fresh records of a long
        prompt. Returns how many were appended; ``-1`` if ``msgs`` shares no
        prefix with them or the id table is due for a fresh start (nothing changes); ``-2``
        if an appended item is not a ``message_type`` (the records then hold the common
        prefix, still the start of ``msgs``)."""
        return self._advance(msgs, count, self.match(msgs))

    def _advance(self, msgs, count, k, known=None):
        """``advance`` after ``match`` returned ``k``; ``known``: see ``window``."""
        skip = 0
        if k < 0:
            if not self._rewind():
                return -1
            k = len(msgs) - len(self._msgs)
            skip = min(k, self._last_lo - len(self._msgs))
        elif self._patch:
            self._apply_patch(msgs, count)
        if k == 0:
            return 0
        new = msgs[len(self._msgs):]
        for m in new:
            if type(m) is not self._type:
                return -2
        if skip > 0:
            self.extend(new[:skip])
            new = new[skip:]
        elif known is not None:
            ref, counts = known[0], known[1]
            n, m = len(self._msgs), len(msgs)
            if m - n <= KNOWN_MAX and len(ref) >= m and len(counts) >= m and all(msgs[i] is ref[i] for i in range(n, m)):
                self.extend(new, counts[n:m].tolist())  # (the caller's counts of these very messages)
                return k
        self.extend(new, count(new))
        return k

    def extend(self, new, counts=None):
        """Append the records of the list ``new``, with ``counts`` (ints, ``-1`` for not
        counted yet; ``None``: none counted)."""
        k = len(new)
        n = len(self._msgs)
        if counts is not None and len(counts) != k:
            raise ValueError(f"counts has {len(counts)} entries, new has {k}")
        roles, cnts, rids, off, ids = [], [], [], [], []
        n_ids = len(self._ids)
        for i in range(k):
            m = new[i]
            code = ROLE_CODES[m.role]
            v = -1
            if counts is not None:
                v = counts[i]
                if not -1 <= v <= MAX_VALUE:
                    raise ValueError(f"counts[{n + i}] must be -1 (not counted) or between 0 and 2**53, got {v}")
            roles.append(code)
            cnts.append(int(v))
            if code == TOOL:
                rids.append(self._interned(m.tool_call_id))
            else:
                rids.append(-1)
                if code == ASSISTANT and m.tool_calls:
                    for call in m.tool_calls:
                        ids.append(self._interned(call.get("id")))
            off.append(n_ids + len(ids))
        self._roles += roles
        self._counts += cnts
        self._rids += rids
        self._off += off
        self._ids += ids
        self._msgs.extend(new)

    def set_counts(self, index, values):
        """Set the counts of the records at positions ``index`` to ``values``."""
        n = len(self._msgs)
        if len(values) != len(index):
            raise ValueError(f"values has {len(values)} entries, index has {len(index)}")
        for j in range(len(index)):
            if not 0 <= index[j] < n:
                raise ValueError(f"index[{j}] must be a record position (0..{n - 1}), got {index[j]}")
            if not -1 <= values[j] <= MAX_VALUE:
                raise ValueError(f"values[{j}] must be -1 (not counted) or between 0 and 2**53, got {values[j]}")
        for j in range(len(index)):
            self._counts[int(index[j])] = int(values[j])

    def plan(self, budget, pinned_mask, from_start, chunk=0, pinned_free=False):
        """``plan_window`` over the records."""
        got = plan_window(self.roles, self.counts, pinned_mask, budget, from_start, chunk, pinned_free)
        if got[0] == 0:
            self._last_lo = got[2]
        return got

    def window(self, msgs, count, budget, settings, sanitize, insert=None, known=None):
        """The agent loop's turn in one call: ``advance(msgs, count)``, then ``plan(budget,
        *settings)`` (``settings``: ``(pinned_mask, from_start, chunk, pinned_free)``); when
        that plan is decided and keeps something besides the pinned prefix, returns
        ``(msgs[:n_pinned] + msgs[lo:hi], clean)``, ``clean`` being ``sanitize and
        self.sanitize(n_pinned, lo, hi) == 0``. Otherwise returns ``None``: the caller takes
        the general path (the records stay advanced when ``msgs`` extended them, or when it
        shares a prefix with them: see ``advance``).

        ``insert=(message, at, lo)``: the turn of a stage that puts ``message`` after the
        pinned prefix while the window's cut stays at ``lo`` (the summarizing budget's
        summary of ``msgs[at:lo]``). Only a prompt that extends the recorded messages (``match
        >= 0``; otherwise None, the records unchanged) is planned; when its plan keeps exactly
        ``at`` pinned messages and cuts at ``lo``, the result is ``(msgs[:at] + [message] +
        msgs[lo:hi], clean)`` (``clean`` of the window without ``message``); when the plan is
        another (the cut moved), ``(msgs[:n_pinned] + msgs[lo:hi], clean, n_pinned, lo)`` of
        that plan (the caller puts its own message in); None as without ``insert``.

        ``known=(ref, counts, ...)``: a list and an ``array.array("q")`` such that ``counts[i]``
        is what ``count([ref[i]])`` would return (the caller vouches for it: the clearing stage's
        records of the same counter, ``ClearingTurn.counted``). When the messages the turn
        appends (after a match, not a rewind) are at most :data:`KNOWN_MAX`, and each
        ``msgs[i]`` is ``ref[i]`` (``i < len(counts)``), their counts are taken from ``counts``
        and ``count`` is not called; otherwise ``known`` is ignored.

        >>> from jianmu_fast.message import Message, human, system
        >>> history, note = [system("s"), human("a"), human("b")], system("summary of a")
        >>> rec = Records(Message)
        >>> [m.content for m in rec.window(history, lambda new: [1] * len(new), 2, (1, True, 0, False), False)[0]]
        ['s', 'b']
        >>> history.append(human("c"))
        >>> out, clean, at, lo = rec.window(history, lambda new: [1] * len(new), 2, (1, True, 0, False), False, (note, 1, 2))
        >>> [m.content for m in out], at, lo     # the cut moved: the plain window and its plan
        (['s', 'c'], 1, 3)
        >>> [m.content for m in rec.window(history, len, 3, (1, True, 0, False), False, (note, 1, 2))[0]]
        ['s', 'summary of a', 'b', 'c']
        """
        if insert is not None:
            if type(insert) is not tuple or len(insert) != 3:
                raise ValueError(f"insert must be (message, at, lo), got {insert!r}")
            message, at, want_lo = insert[0], operator.index(insert[1]), operator.index(insert[2])
        if known is not None and (type(known) is not tuple or len(known) < 2 or type(known[0]) is not list
                                  or type(known[1]) is not array.array or known[1].typecode != "q"):
            raise TypeError("known must be a tuple (ref, counts, ...): a list and an array.array of typecode 'q'")
        if insert is not None and (self.match(msgs) < 0 or self._patch):  # (a changed message: the summary may be of it)
            return None
        if self._advance(msgs, count, self.match(msgs), known) < 0:
            return None
        if len(settings) != 4:
            raise ValueError(f"settings must be (pinned_mask, from_start, chunk, pinned_free), got {settings!r}")
        mask, from_start, chunk, pinned_free = settings
        _check_range("", "budget", budget)
        _check_range("", "chunk", chunk)
        if not self._msgs:
            return None
        status, n_pinned, lo, hi = self.plan(budget, mask, from_start, chunk, pinned_free)
        if status or n_pinned == len(self._msgs) or lo == hi or len(msgs) < len(self._msgs):
            return None  # (the last test: count() shortened msgs; the caller starts over)
        clean = bool(sanitize) and self.sanitize(n_pinned, lo, hi) == 0
        if insert is None:
            return msgs[:n_pinned] + msgs[lo:hi], clean
        if n_pinned != at or lo != want_lo:
            return msgs[:n_pinned] + msgs[lo:hi], clean, n_pinned, lo  # the cut moved
        return msgs[:n_pinned] + [message] + msgs[lo:hi], clean

    def sanitize(self, n_pinned, lo, hi):
        """``sanitize_window``'s status over the records."""
        return sanitize_window(self.roles, self.call_off, self.call_ids, self.result_ids, n_pinned, lo, hi)[0]

    def joined(self, values, lo, hi):
        """``values[id(m)]`` for the recorded messages ``m`` of ``[lo, hi)``, concatenated (each
        a bytes), or ``None`` when one of them has no entry: the summarizing budget's content
        digests (its dict holds the messages too, so an id names one message while its entry
        lives).

        >>> from jianmu_fast.message import Message, human
        >>> a, b = human("a"), human("b")
        >>> rec = Records(Message)
        >>> rec.extend([a, b])
        >>> rec.joined({id(a): b"A", id(b): b"B"}, 0, 2), rec.joined({id(a): b"A"}, 0, 2), rec.joined({}, 1, 1)
        (b'AB', None, b'')
        """
        n = len(self._msgs)
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"need 0 <= lo <= hi <= {n}, got {lo}, {hi}")
        parts = []
        for m in self._msgs[lo:hi]:
            v = values.get(id(m))
            if v is None:
                return None
            if type(v) is not bytes:
                raise TypeError(f"values: expected bytes, got {type(v).__name__}")
            parts.append(v)
        return b"".join(parts)

    def fold_keys(self, lo, first, hi, acc, units, level, fold, key, known, values):
        """``folds(first, hi, acc, units, level, fold)`` with the content key of the span up to
        each point and up to ``hi``: a sha256 chain over the recorded messages' ``values``
        (``joined``), from the fold point ``lo <= first`` whose key is ``key``: each piece's
        key is ``sha256(the key before it + the piece's values).digest()``, the first piece
        ``[lo, first point)`` (or ``[lo, hi)``) after ``key``. ``known``: the key of ``[lo,
        first)`` when the caller has it (the end key of the span it resumes), used as the key of
        a point at ``first`` instead of hashing that piece again; ``None``: every key hashed.
        Returns ``([(i, tokens, units, key) for each point] + [(hi, -1, units at hi, key up to
        hi)], units, acc)``, or ``None`` when ``folds`` or ``joined`` would be None.

        >>> import hashlib
        >>> from jianmu_fast.message import Message, human
        >>> ms = [human("a"), human("b"), human("c")]
        >>> rec = Records(Message)
        >>> rec.extend(ms, [4, 4, 4])
        >>> values = {id(m): m.content.encode() for m in ms}
        >>> ends, units, acc = rec.fold_keys(0, 0, 3, 0, 0, 5, 5, b"", None, values)
        >>> [e[:3] for e in ends], units, acc
        ([(2, 8, 2), (3, -1, 3)], 3, 12)
        >>> ends[0][3] == hashlib.sha256(b"ab").digest(), ends[1][3] == hashlib.sha256(ends[0][3] + b"c").digest()
        (True, True)
        >>> rec.fold_keys(0, 2, 3, 8, 2, 5, 5, b"", ends[0][3], values)[0] == ends  # resumed at 2
        True
        """
        if not 0 <= lo <= first <= hi:
            raise ValueError(f"need 0 <= lo <= first <= hi, got {lo}, {first}, {hi}")
        if type(key) is not bytes or (known is not None and type(known) is not bytes):
            bad = key if type(key) is not bytes else known
            raise TypeError(f"key and known: expected bytes (known: or None), got {type(bad).__name__}")
        got = self.folds(first, hi, acc, units, level, fold)
        if got is None:
            return None
        points, units, acc = got
        ends = []
        start = lo
        for e, before, n_units in [*points, (hi, -1, units)]:
            if known is not None and e == first and before >= 0:
                key = known
            else:
                piece = self.joined(values, start, e)
                if piece is None:
                    return None
                key = hashlib.sha256(key + piece).digest()
            ends.append((e, before, n_units, key))
            start = e
        return ends, units, acc

    def fold_step(self, chain, a, b, fold, values, by_content):
        """The summarizing budget's rolling summary resumed over these records, when every step
        is cached (its moved cut's common case, one call): ``chain`` is the summarizer's 14-tuple
        ``(span, records, version, a, lo, cum, units0, key, text, end, acc, units, known, out)``
        (see ``SummarizingBudgetFilter._summary_text``). When it was made over these records
        (``records`` is ``self`` at this ``version``, its span starting at ``a``) and the span
        ``[a, b)`` is longer than its ``end``, the fold points and keys past its last fold point
        are ``fold_keys(a + lo, a + end, b, acc, units, (cum // fold + 1) * fold, fold, key,
        known, values)``, and each key's summary is looked up in ``by_content``: the chain of
        ``[a, b)`` (``span`` None, ``out`` its ``(summary, units)``), or None when the chain does
        not apply, ``fold_keys`` is None or a summary is not cached (the caller's general path).
        ``fold``: an int in ``[1, 2**53]``.

        >>> from jianmu_fast.message import Message, human
        >>> ms = [human("a"), human("b"), human("c")]
        >>> rec = Records(Message)
        >>> rec.extend(ms, [4, 4, 4])
        >>> values = {id(m): m.content.encode() for m in ms}
        >>> ends, units, acc = rec.fold_keys(0, 0, 2, 0, 0, 5, 5, b"", None, values)
        >>> chain = (None, rec, rec.version, 0, 0, 0, 0, b"", None, 2, acc, units, ends[-1][3], ("ab", 2))
        >>> got = rec.fold_keys(0, 2, 3, acc, units, 5, 5, b"", ends[-1][3], values)[0]
        >>> by_content = {got[0][3]: "ab", got[1][3]: "abc"}
        >>> new = rec.fold_step(chain, 0, 3, 5, values, by_content)
        >>> new[4:7], new[7] == ends[-1][3], new[8:10], new[13]
        ((2, 8, 2), True, ('ab', 3), ('abc', 3))
        >>> rec.fold_step(chain, 0, 3, 5, values, {}) is None, rec.fold_step(chain, 0, 2, 5, values, by_content)
        (True, None)
        """
        if type(chain) is not tuple or len(chain) != 14:
            raise TypeError(f"chain: expected a 14-tuple, got {type(chain).__name__}")
        if type(fold) is not int or not 1 <= fold <= 2**53:
            raise ValueError(f"fold must be between 1 and 2**53, got {fold}")
        if chain[1] is not self or chain[3] != a or chain[2] != self.version or not chain[9] < b - a:
            return None
        _, _, version, _, lo, cum, units0, key, text, end, acc, units, known, _ = chain
        got = self.fold_keys(a + lo, a + end, b, acc, units, (cum // fold + 1) * fold, fold, key, known, values)
        if got is None:
            return None
        ends, units, acc = got
        point_units = 0
        out = None
        for hi, before, n_units, k in ends:
            t = by_content.get(k)
            if t is None:
                return None
            if before >= 0:
                text, lo, cum, key, point_units = t, hi - a, before, k, n_units
            else:
                known = k
                out = (t, units0 + units)
        return (None, self, version, a, lo, cum, units0 + point_units, key, text, b - a, acc, units - point_units,
                known, out)

    def folds(self, lo, hi, acc, units, level, fold):
        """Where a span folds, read off the records ``[lo, hi)`` (the summarizing budget's
        rolling summary): walking from ``lo`` with ``acc`` tokens and ``units`` units before
        it, each unit start ``i`` (a record that is not a tool result) whose tokens before it
        reach ``level`` is a point ``(i, tokens before it, units before it)``, and ``level``
        becomes the next multiple of ``fold`` above those tokens. Returns ``(points, units,
        acc)`` at ``hi``, or ``None`` when a count in ``[lo, hi)`` is not known or the tokens
        pass ``2**62`` (the caller counts the messages itself). ``acc``, ``units`` and
        ``level`` are ints in ``[0, 2**62]``, ``fold`` in ``[1, 2**53]``.

        >>> from jianmu_fast.message import Message, ai, human, tool
        >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        >>> rec = Records(Message)
        >>> rec.extend([human("a"), ai(None, tool_calls=call), tool("r", tool_call_id="c1"), human("b")], [6, 3, 9, 4])
        >>> rec.folds(0, 4, 0, 0, 5, 5)  # the call starts at 6 >= 5 tokens, then human("b") at 18 >= 10
        ([(1, 6, 1), (3, 18, 2)], 3, 22)
        >>> rec.set_counts([2], [-1]); rec.folds(0, 4, 0, 0, 5, 5) is None
        True
        """
        n = len(self._msgs)
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"need 0 <= lo <= hi <= {n}, got {lo}, {hi}")
        for name, v in (("acc", acc), ("units", units), ("level", level)):
            if not 0 <= v <= _SAT:
                raise ValueError(f"{name} must be between 0 and 2**62, got {v}")
        if not 1 <= fold <= MAX_VALUE:
            raise ValueError(f"fold must be between 1 and 2**53, got {fold}")
        if min(self._counts[lo:hi], default=0) < 0:
            return None
        points = []
        for i in range(lo, hi):
            if self._roles[i] != TOOL:
                if acc >= level:
                    points.append((i, acc, units))
                    level = (acc // fold + 1) * fold
                units += 1
            acc += self._counts[i]
            if acc > _SAT:
                return None
        return points, units, acc


# -- SummarizingBudgetFilter's turn (jianmu_fast.memory.context.editing.summarizing) ---------------


def summarizing_trim(flt, messages, tools_schema, sanitize):
    """``SummarizingBudgetFilter._trim`` (the class's method is this function; compiled, a
    turn whose cut did not move runs no Python frame). Under ``flt._lock``: when the filter
    remembers a turn (``flt._hot``: inner filter, its records, their count function, settings,
    budget, whether the budget is constant without tools, the summary to put in) and
    ``messages`` is a list, with no tools and a constant budget, one ``Records.window(...,
    insert=)`` call over the inner filter's records; its output when the cut did not move (the
    last summary put in, or nothing dropped and all kept), and when it moved with the new
    summary at hand (``_moved_summary``). Everything else is
    ``flt._trim_rest(messages, tools_schema, sanitize, got)``, still under the lock, ``got``
    being what the window gave: a moved cut's ``(kept, clean, n_pinned, cut)``, ``1`` for
    no answer (None, or an output that is not the remembered turn's), ``0`` when it raised,
    None when it was not called.

    >>> from jianmu_fast.memory.context.editing import SummarizingBudgetFilter
    >>> from jianmu_fast.message import human, system
    >>> f = SummarizingBudgetFilter(60, summarize=lambda ms: "s", summary_max_tokens=10)
    >>> msgs = [system("Be brief."), human("hi")]
    >>> summarizing_trim(f, msgs, None, True) == (msgs, True)   # the general path remembers the turn
    True
    >>> msgs.append(human("again")); summarizing_trim(f, msgs, None, True)[0] == msgs
    True
    """
    got = None
    with flt._lock:
        hot = flt._hot
        if (type(hot) is tuple and len(hot) == 7 and type(messages) is list
                and (tools_schema is None or not tools_schema)):
            f, rec, count, cfg, budget, bare, insert = hot
            if bare:
                try:
                    got = rec.window(messages, count, budget, cfg, sanitize, insert)
                except Exception:
                    got = 0
                else:
                    if got is None:
                        got = 1
                    elif len(got) == 2:
                        if insert is not None or len(got[0]) == len(messages):
                            return got
                        got = 1
                    else:
                        try:
                            out = _moved_summary(flt, hot, got)
                        except Exception:  # (_trim_rest's _moved raises it as the filter's error)
                            out = None
                        if out is not None:
                            return out
        return flt._trim_rest(messages, tools_schema, sanitize, got)


def _moved_summary(flt, hot, got):
    """``summarizing_trim``'s turn whose cut moved (``got``: the window's ``(kept, clean,
    n_pinned, cut)``), when the new span's rolling summary resumes in one ``Records.fold_step``
    call (the span extends the last one over the same records, every step cached) and its
    summary message was made already: ``(kept with it put in, clean)``, the filter's chain and
    remembered turn updated, as its ``_moved`` leaves them. None, with nothing changed,
    otherwise (``_moved`` then)."""
    kept, clean, n_pinned, cut = got
    chain = flt._chain
    if chain is None or cut <= n_pinned:
        return None
    rec = hot[1]
    step = rec.fold_step(chain, n_pinned, cut, flt._fold, flt._digests, flt._by_content)
    if step is None or step[13] is None:
        return None
    text, units = step[13]
    summary = flt._messages.get((cut - n_pinned, units, text))
    if summary is None:
        return None
    flt._chain = step
    kept.insert(n_pinned, summary)
    flt._hot = (hot[0], rec, hot[2], hot[3], hot[4], hot[5], (summary, n_pinned, cut))
    return kept, clean


# -- a cached counter's counts (jianmu_fast.memory.context._count_cache) ----------------------


def counts_of(counter, ms, where="messages"):
    """One count per message of ``ms`` (a list or tuple) by ``counter``, a
    ``CachedChatCounter``: its message cache first (an entry counts for the very object its
    weak reference points to), then, for the misses, ``_fill``. See ``_count_cache`` for the
    caches and the formula; ``where`` names ``ms`` in a coercion error."""
    get = counter._msgs.get
    out = []
    missing = None
    i = 0
    for m in ms:
        e = get(id(m))
        if e is not None and e[0]() is m:
            out.append(e[1])
        else:
            out.append(0)
            if missing is None:
                missing = [i]
            else:
                missing.append(i)
        i += 1
    if missing is not None:
        _fill(counter, ms, missing, out, where)
    return out


def _fill(counter, ms, missing, out, where):
    """Count ``ms[i]`` for ``i in missing`` into ``out``: texts found in the text cache are
    added at once, the others are tokenized together by ``counter._encode_counts`` (each
    distinct text once, in order of first use); then one acquisition of ``counter._lock``
    stores the new texts (``_put_texts``) and the messages that may be cached: each one
    that was not coerced here and whose counted lists are frozen (the message cache then
    evicts its oldest entries down to three quarters of ``cache_size`` when over it). A
    message's entry is ``(weakref to it, count, role, content count)``, the content count
    that of its content when that is a str, else None: what the clearing's records need
    (``_editing_core``), in the one look-up that finds the count."""
    message_type = counter._message_type
    tget = counter._texts.get
    role_base = counter._role_base
    count_id = counter.COUNT_TOOL_CALL_ID
    # (index, message, cost known so far, texts still to add: None, a str or a list, cacheable,
    #  role, content count: an int, the content (a str still to count) or None (not a str))
    rows = []
    need = {}
    for i in missing:
        m = ms[i]
        if type(m) is not message_type:
            m = counter._coerce(m, f"{where}[{i}]" if where == "messages" else where)
        role = m.role
        fixed = role_base.get(role)
        if fixed is None:
            fixed = counter._role_cost(role)
        c = m.content
        tc = m.tool_calls
        if tc is None and type(c) is str and m.name is None and (not count_id or m.tool_call_id is None):
            n = tget(c)
            if n is None:
                need[c] = None
                rows.append((i, m, fixed, c, m is ms[i], role, c))
            else:
                rows.append((i, m, fixed + n, None, m is ms[i], role, n))
            continue
        cc = None
        if type(c) is str:
            cc = tget(c)
            if cc is None:
                cc = c
        texts = []
        if isinstance(c, str):
            texts.append(c)
        elif c:
            for block in c:
                if block.get("type") == "text":
                    texts.append(block["text"])
                else:
                    fixed += counter._image_tokens
        if m.name:
            texts.append(m.name)
            fixed += counter.PER_NAME
        if count_id and m.tool_call_id:
            texts.append(m.tool_call_id)
        if tc:
            per_call = counter.PER_TOOL_CALL
            for call in tc:
                fn = call["function"]
                fixed += per_call
                texts.append(fn["name"])
                args = fn.get("arguments")
                if args:
                    texts.append(args)
        rest = []
        for t in texts:
            n = tget(t)
            if n is None:
                need[t] = None
                rest.append(t)
            else:
                fixed += n
        keep = m is ms[i] and type(c) is not list and (tc is None or type(tc) is counter._frozen_list)
        rows.append((i, m, fixed, rest or None, keep, role, cc))
    got = {}
    new = []
    counts = []
    if need:
        new = list(need)
        encode = counter._direct_encode  # what _encode_counts does for one text, without its frame
        size = 0
        if encode is not None and counter._auto_chars >= 0:  # engine="auto" still counting
            size = sum(map(len, new))
            if counter._auto_chars + size >= counter.AUTO_FASTOKENS_CHARS:
                encode = None  # _encode_counts applies the rule
        if encode is not None:
            try:
                counts = [len(encode(t)) for t in new]
                if size:
                    counter._auto_chars += size
            except UnicodeEncodeError:
                counts = counter._encode_counts(new)
        else:
            counts = counter._encode_counts(new)
        got = dict(zip(new, counts))
    ref = weakref.ref
    with counter._lock:  # one acquisition for both caches
        if need:  # counter._put_texts, inline: new texts (each at most 1/64 of the bound) kept
            texts_cache = counter._texts
            longest = counter.MAX_CACHED_CHARS >> 6
            added = 0
            for t, n in zip(new, counts):
                if len(t) <= longest and t not in texts_cache:
                    texts_cache[t] = n
                    added += len(t)
            if added:
                counter._chars += added
            if len(texts_cache) > counter.cache_size or counter._chars > counter.MAX_CACHED_CHARS:
                counter._evict_texts()
        cache = counter._msgs
        for i, m, total, rest, keep, role, cc in rows:
            if rest is not None:
                if type(rest) is str:
                    total += got[rest]
                else:
                    for t in rest:
                        total += got[t]
            out[i] = total
            if keep:
                if type(cc) is str:
                    cc = got[cc]
                cache[id(m)] = (ref(m), total, role, cc)
        size = counter.cache_size
        if len(cache) > size:
            for key in list(islice(iter(cache), len(cache) - (size * 3) // 4)):
                del cache[key]
