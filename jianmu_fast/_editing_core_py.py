"""Pure-Python reference of the compiled context-editing core (``csrc/_editing_core.pyx``).

This module is the specification: the compiled twin has the same names, signatures,
results and error messages, and ``tests/test_context_editing_core.py`` proves it on random
inputs.

``plan_clearing`` decides which tool results ``ClearToolResultsFilter`` clears, from
per-message records (computed once per distinct message and cached by the filter):

``counts``
    int64, the cost of each message as sent uncleared.
``kinds``
    int8, ``0`` not a tool result, ``1`` a tool result that is never cleared (its tool is in
    ``exclude_tools``; it still counts for ``keep``), ``2`` a tool result that may be cleared.
``savings``
    int64, the tokens clearing that result saves (its content, and with
    ``clear_tool_inputs`` its call's arguments); ``0`` where ``kinds != 2``.
``base``
    What the request costs before its messages: the request's fixed overhead and its tools.
``trigger``, ``step``, ``keep``
    ``trigger_tokens``, ``clear_at_least`` and ``keep`` of the filter.

The rule, a scan over the prefixes of the history (one message at a time), so the result
is a function of the messages only and never moves back as the history grows:

- ``total`` is the cost of the prefix as cleared so far (``base`` plus the counts, minus
  what was cleared); a result becomes *eligible* once ``keep`` newer results follow it;
  ``pending`` is what clearing every eligible, not yet cleared result would save.
- With ``step == 0``: whenever ``total > trigger``, every eligible result is cleared (a step).
- With ``step > 0``: the level of ``total`` is ``0`` up to ``trigger``, then
  ``ceil((total - trigger) / step)``. A step is taken when a message raises the level and the
  eligible results not yet cleared would save at least ``step``. These are exactly the
  moments when ``TokenBudgetFilter(trigger, eviction="chunked", chunk=step)`` moves its cut,
  so with those settings a step costs no prompt-cache miss of its own. A step clears the
  oldest of those results, as many as leave ``total`` with the most room below the next
  level boundary (the longest such run on ties), saving at least ``step``: the next cut move
  is then as far away as it can be.

Result: ``(cleared, total)``: the results (in order, counting every tool result, kinds 1
and 2 alike) whose clearable ones are cleared are the first ``cleared``; ``total`` is the
cost of the whole history as cleared. ``ValueError`` names a bad argument (``base`` plus
all counts must stay at most ``2**62``, so the compiled sums never overflow).
"""

from __future__ import annotations

__all__ = ["MAX_VALUE", "plan_clearing"]

MAX_VALUE = 1 << 53
MAX_SUM = 1 << 62


def _check(name, value):
    if value < 0 or value > MAX_VALUE:
        raise ValueError(f"{name} must be between 0 and 2**53, got {value}")


def _level(total, trigger, step, prev):
    if total <= trigger:
        return 0
    if step > 0:
        return (total - trigger + step - 1) // step
    return prev + 1


def _room(total, trigger, step):
    if step == 0:
        return 0
    if total <= trigger:
        return trigger - total + step
    return trigger + (total - trigger + step - 1) // step * step - total


def plan_clearing(counts, kinds, savings, base, trigger, step, keep):
    """Which tool results to clear; see the module docstring.

    >>> import numpy as np
    >>> counts = np.array([50, 400, 10, 400, 10, 400], dtype=np.int64)   # user, 3 results
    >>> kinds = np.array([0, 2, 0, 2, 0, 2], dtype=np.int8)
    >>> savings = np.array([0, 390, 0, 390, 0, 390], dtype=np.int64)
    >>> plan_clearing(counts, kinds, savings, 3, 600, 0, 1)   # the 2 older results cleared
    (2, 493)
    >>> plan_clearing(counts, kinds, savings, 3, 600, 500, 1)  # steps of >= 500 saved
    (2, 493)
    >>> plan_clearing(counts, kinds, savings, 3, 5000, 0, 1)   # under the trigger
    (0, 1273)
    """
    n = len(counts)
    if len(kinds) != n or len(savings) != n:
        raise ValueError(f"counts, kinds and savings must have the same length, got {n}, {len(kinds)}, {len(savings)}")
    _check("base", base)
    _check("trigger", trigger)
    _check("step", step)
    _check("keep", keep)
    total = int(base)
    for i in range(n):
        if counts[i] < 0 or counts[i] > MAX_VALUE:
            raise ValueError(f"counts[{i}] must be between 0 and 2**53, got {counts[i]}")
        total += int(counts[i])
        if total > MAX_SUM:
            raise ValueError(f"base + sum(counts[:{i + 1}]) must be at most 2**62")
        k = kinds[i]
        if k < 0 or k > 2:
            raise ValueError(f"kinds[{i}] must be 0, 1 or 2, got {k}")
        s = savings[i]
        if s < 0 or s > counts[i] or (k != 2 and s != 0):
            raise ValueError(f"savings[{i}] must be between 0 and counts[{i}], and 0 unless kinds[{i}] == 2, got {s}")
    total = int(base)
    n_results = 0
    cleared = 0
    positions = []
    need = step if step > 0 else 1
    level_prev = 0
    for i in range(n):
        total += int(counts[i])
        if kinds[i]:
            positions.append(i)
            n_results += 1
        level = _level(total, trigger, step, level_prev)
        eligible = n_results - keep
        if level > level_prev and eligible > cleared:
            best_k, best_room, best_saved, saved = -1, -1, 0, 0
            for k in range(cleared, eligible):
                saved += int(savings[positions[k]])
                if saved >= need:
                    room = _room(total - saved, trigger, step)
                    if room >= best_room:
                        best_k, best_room, best_saved = k + 1, room, saved
            if best_k >= 0:
                total -= best_saved
                cleared = best_k
                level = _level(total, trigger, step, level)
        level_prev = level
    return (cleared, total)
