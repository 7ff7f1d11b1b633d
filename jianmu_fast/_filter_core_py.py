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

import numpy as np

__all__ = ["MAX_VALUE", "select_window", "select_windows"]

MAX_VALUE = 1 << 53


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
