"""Pure-Python reference of the compiled context-editing core (``csrc/_editing_core.pyx``).

This module is the specification: the compiled twin has the same names, signatures,
results and error messages, and ``tests/test_context_editing_core.py`` proves it on random
inputs.

``plan_clearing`` decides which tool results ``ClearToolResultsFilter`` clears, from
per-message records (computed once per distinct message and cached by the filter):

``counts``
    int64, the cost of each message as sent uncleared.
``kinds``
    int8, what each message is: ``0`` a message that starts a unit (a user message, a
    system message after the pinned prefix), ``1`` a tool result that is never cleared (its
    tool is in ``exclude_tools``; it still counts for ``keep``), ``2`` a tool result that may
    be cleared, ``3`` a message of the pinned prefix (the leading system messages; only at
    the start), ``4`` an assistant message (it starts a unit, but no prompt ends with it, so
    a step waits for the next message that is not an assistant message).
``savings``
    int64, the tokens clearing that result saves (its content, and with
    ``clear_tool_inputs`` its call's arguments); ``0`` where ``kinds != 2``.
``base``
    What the request costs before its messages: the request's fixed overhead and its tools.
``trigger``, ``step``, ``keep``
    ``trigger_tokens``, ``clear_at_least`` and ``keep`` of the filter.
``state``
    ``None``, or an int64 array of :data:`STATE_LEN` entries, zeros at first, updated in
    place: the scan's position and running values, so that the next call over a longer
    history (the same records, extended; the same ``base``, ``trigger``, ``step`` and
    ``keep``) scans only the new messages. A resumed scan returns what a fresh scan of the
    whole history returns.

The rule, a scan over the prefixes of the history (one message at a time), so the result
is a function of the messages only and never moves back as the history grows:

- ``total`` is the cost of the prefix as cleared so far (``base`` plus the counts, minus
  what was cleared), ``x = total - trigger`` what a budget of ``trigger`` tokens must drop;
  a result becomes *eligible* once ``keep`` newer results follow it.
- With ``step == 0``: at every message while ``x > 0``, every eligible result is cleared
  (the longest run of them that saves something).
- With ``step > 0`` the scan follows ``TokenBudgetFilter(trigger, eviction="chunked",
  chunk=step)`` (pinned prefix: the ``kinds == 3`` messages; units start at every message
  that is not a tool result, and at the first one after the pinned prefix). That filter
  cuts at the first unit start where the cost before it (after the pinned prefix, as
  cleared) reaches ``ceil(x / step) * step``, and keeps that cut while ``x`` stays at most
  ``limit``: the largest multiple of ``step`` that the cost before the cut reaches (``0``
  while ``x <= 0``: nothing is cut; the cut is capped at the newest unit start, which any
  growth moves). Its *room* is ``limit - x``, what the prompt may grow before the cut moves.
  When a message takes ``x`` past ``limit``, the cut moves (the prompt stops extending the
  previous one), and at that message, or at the next one that is not an assistant message,
  a *step* may be taken with no cache miss of its own. The candidates clear the oldest
  eligible results not yet cleared, as a run that saves at least ``step`` or the whole run
  of them; a candidate is kept if its room (the cut recomputed on the cleared costs) is at
  least nine tenths of the room without a step, and the step is the kept candidate that
  saves the most (the shortest such run). Then ``limit`` is recomputed.

Result: ``(cleared, total)``: the results (in order, counting every tool result, kinds 1
and 2 alike) whose clearable ones are cleared are the first ``cleared``; ``total`` is the
cost of the whole history as cleared. ``ValueError`` names a bad argument (``total`` plus
the counts must stay at most ``2**62``, so the compiled sums never overflow).
"""

from __future__ import annotations

import array
import threading

__all__ = ["ClearingTurn", "MAX_VALUE", "STATE_LEN", "TURN_MAX", "cap_hot_apply", "clearing_turn", "extend_capped", "extends", "place_cleared", "plan_clearing"]

MAX_VALUE = 1 << 53
MAX_SUM = 1 << 62
#: entries of ``state``: messages scanned, total, cleared, limit, step pending, pinned prefix,
#: tool results scanned
STATE_LEN = 7
#: the most new messages ``clearing_turn`` records in one call (more: the caller's general path)
TURN_MAX = 16


def _check(name, value):
    if value < 0 or value > MAX_VALUE:
        raise ValueError(f"{name} must be between 0 and 2**53, got {value}")


def _room(counts, kinds, savings, n_pinned, end, cleared, x, step):
    """Room of the chunked cut over ``[:end]`` with the first ``cleared`` results cleared."""
    if x <= 0:
        return -x
    target = (x + step - 1) // step * step
    acc = 0
    r = 0
    for j in range(n_pinned, end):
        k = kinds[j]
        tool = k == 1 or k == 2
        if (j == n_pinned or not tool) and acc >= target:
            return acc // step * step - x
        c = int(counts[j])
        if tool:
            if r < cleared:
                c -= int(savings[j])
            r += 1
        acc += c
    return 0  # no unit start reaches it: the cut is capped at the newest unit


def plan_clearing(counts, kinds, savings, base, trigger, step, keep, state=None):
    """Which tool results to clear; see the module docstring.

    >>> import numpy as np
    >>> counts = np.array([50, 400, 10, 400, 10, 400], dtype=np.int64)   # user, 3 results
    >>> kinds = np.array([0, 2, 0, 2, 0, 2], dtype=np.int8)
    >>> savings = np.array([0, 390, 0, 390, 0, 390], dtype=np.int64)
    >>> plan_clearing(counts, kinds, savings, 3, 600, 0, 1)   # the 2 older results cleared
    (2, 493)
    >>> plan_clearing(counts, kinds, savings, 3, 600, 500, 1)  # one step of >= 500 saved
    (2, 493)
    >>> plan_clearing(counts, kinds, savings, 3, 5000, 0, 1)   # under the trigger
    (0, 1273)
    >>> st = np.zeros(STATE_LEN, dtype=np.int64)                # resumable: the same result
    >>> plan_clearing(counts[:4], kinds[:4], savings[:4], 3, 600, 500, 1, st)
    (1, 473)
    >>> plan_clearing(counts, kinds, savings, 3, 600, 500, 1, st)
    (2, 493)
    """
    n = len(counts)
    if len(kinds) != n or len(savings) != n:
        raise ValueError(f"counts, kinds and savings must have the same length, got {n}, {len(kinds)}, {len(savings)}")
    _check("base", base)
    _check("trigger", trigger)
    _check("step", step)
    _check("keep", keep)
    if state is None:
        done, total, cleared, limit, pending, n_pinned, n_results = 0, int(base), 0, 0, 0, 0, 0
    else:
        if len(state) != STATE_LEN:
            raise ValueError(f"state must have {STATE_LEN} entries, got {len(state)}")
        done = int(state[0])
        if done < 0 or done > n:
            raise ValueError(f"state[0] (messages scanned) must be between 0 and {n}, got {done}")
        if done == 0:
            total, cleared, limit, pending, n_pinned, n_results = int(base), 0, 0, 0, 0, 0
        else:
            total, cleared, limit, pending, n_pinned, n_results = (int(v) for v in state[1:STATE_LEN])
    check = total
    for i in range(done, n):
        if counts[i] < 0 or counts[i] > MAX_VALUE:
            raise ValueError(f"counts[{i}] must be between 0 and 2**53, got {counts[i]}")
        check += int(counts[i])
        if check > MAX_SUM:
            raise ValueError(f"base + sum(counts[:{i + 1}]) must be at most 2**62")
        k = kinds[i]
        if k < 0 or k > 4:
            raise ValueError(f"kinds[{i}] must be between 0 and 4, got {k}")
        if k == 3 and i != n_pinned:
            raise ValueError(f"kinds[{i}] is 3 (pinned) after a message that is not pinned")
        if k == 3:
            n_pinned += 1
        s = savings[i]
        if s < 0 or s > counts[i] or (k != 2 and s != 0):
            raise ValueError(f"savings[{i}] must be between 0 and counts[{i}], and 0 unless kinds[{i}] == 2, got {s}")
    positions = None  # the tool results' indices, found when a step is considered
    need = step if step > 0 else 1
    for i in range(done, n):
        total += int(counts[i])
        k = kinds[i]
        if k == 1 or k == 2:
            n_results += 1
        eligible = n_results - keep
        x = total - trigger
        if step == 0:
            if x > 0 and eligible > cleared:
                if positions is None:
                    positions = [j for j in range(n) if kinds[j] == 1 or kinds[j] == 2]
                best_k, best_saved, saved = -1, 0, 0
                for r in range(cleared, eligible):
                    saved += int(savings[positions[r]])
                    if saved >= need:
                        best_k, best_saved = r + 1, saved
                if best_k >= 0:
                    total -= best_saved
                    cleared = best_k
            continue
        if k == 3:
            continue
        if x > limit:
            pending = 1
        if not pending or k == 4:
            continue
        if eligible > cleared:
            if positions is None:
                positions = [j for j in range(n) if kinds[j] == 1 or kinds[j] == 2]
            r0 = _room(counts, kinds, savings, n_pinned, i + 1, cleared, x, step)
            best_k, best_saved, saved = -1, -1, 0
            for r in range(cleared, eligible):
                saved += int(savings[positions[r]])
                if saved > best_saved and (saved >= need or (r + 1 == eligible and saved > 0)):
                    room = _room(counts, kinds, savings, n_pinned, i + 1, r + 1, x - saved, step)
                    if 10 * room >= 9 * r0:
                        best_k, best_saved = r + 1, saved
            if best_k >= 0:
                total -= best_saved
                cleared = best_k
                x = total - trigger
        limit = x + _room(counts, kinds, savings, n_pinned, i + 1, cleared, x, step)
        pending = 0
    if state is not None:
        state[0], state[1], state[2], state[3], state[4], state[5], state[6] = (
            n, total, cleared, limit, pending, n_pinned, n_results)
    return (cleared, total)


def extends(previous, current):
    """Whether the list ``current`` starts with the items of the list ``previous``
    (``current[:len(previous)] == previous``: the same objects, or equal ones). The compiled
    twin compares identities first without copying, which is what a growing history (the
    agent loop: the same objects, in a new list) costs.

    >>> a, b, c = object(), object(), object()
    >>> extends([a, b], [a, b, c]), extends([a, b], [a]), extends([a, c], [a, b, c]), extends([], [])
    (True, False, False, True)
    """
    if type(previous) is not list or type(current) is not list:
        raise TypeError(f"previous and current must be lists, got {type(previous).__name__} and {type(current).__name__}")
    return len(current) >= len(previous) and current[:len(previous)] == previous


def extend_capped(src, ref, out, cache, fits=0):
    """One turn of ``ToolResultCapFilter`` over a growing list: append ``src[len(ref):]`` to
    ``ref`` and, to ``out``, each of those messages as the cap outputs it: a message whose
    ``role`` is not ``"tool"`` as itself, a tool result as its cut found in ``cache`` (the
    filter's ``ObjectCache`` dict, ``{id(m): (weakref to m, cut)}``), or, with ``fits > 0``,
    one not in ``cache`` whose content is a str certainly within the cap (``fits``: the cap,
    passed only for a byte-level counter, whose tokens are at least one UTF-8 byte each: at
    most ``fits // 4`` characters, or ASCII of at most ``fits``) as itself, uncounted. It stops
    before the first other tool result not in ``cache`` (the caller computes that one) and
    returns ``len(ref)`` afterwards: ``len(src)`` when every new message was appended. ``ref``
    and ``out`` stay the same length; ``src`` is only read.

    >>> import weakref
    >>> from jianmu_fast.message import human, tool
    >>> a, b, c = human("q"), tool("long", tool_call_id="c1"), human("r")
    >>> ref, out = [], []
    >>> extend_capped([a, b, c], ref, out, {}), out == [a]      # b's cut is not cached
    (1, True)
    >>> cut = tool("cut", tool_call_id="c1")
    >>> extend_capped([a, b, c], ref, out, {id(b): (weakref.ref(b), cut)}), out == [a, cut, c]
    (3, True)
    >>> ref, out = [], []
    >>> extend_capped([a, b, c], ref, out, {}, fits=4), out == [a, b, c]  # b: 4 ASCII characters
    (3, True)
    """
    if type(src) is not list or type(ref) is not list or type(out) is not list or type(cache) is not dict:
        raise TypeError("src, ref and out must be lists and cache a dict")
    if type(fits) is not int or fits < 0:
        raise ValueError(f"fits must be an int >= 0, got {fits!r}")
    i = len(ref)
    if len(out) != i or len(src) < i:
        raise ValueError(f"need len(out) == len(ref) <= len(src), got {len(out)}, {i}, {len(src)}")
    while i < len(src):  # (a role's __eq__ may change src)
        m = src[i]
        if m.role == "tool":
            e = cache.get(id(m))
            if e is None or e[0]() is not m:
                c = m.content if fits else None
                if type(c) is not str or not (len(c) * 4 <= fits or (len(c) <= fits and c.isascii())):
                    break
                v = m  # certainly within the cap: itself
            else:
                v = e[1]
        else:
            v = m
        ref.append(m)
        out.append(v)
        i += 1
    return i


def cap_hot_apply(flt, src, tools_schema=None):
    """``ToolResultCapFilter._hot_apply`` (the class's method is this function; compiled, the
    agent loop's turn runs no Python frame): when ``src`` is the list of the filter's previous
    hot call (``flt._turn_args``: that list, the part of it recorded, the filter's own output,
    its cut cache and ``fits``) and ``extend_capped`` appends every new message, the
    filter's output, grown; otherwise ``flt._hot_rest(src, tools_schema)`` (a cut to make, or
    any other call).

    >>> from jianmu_fast.memory.context import ToolResultCapFilter
    >>> from jianmu_fast.message import human, tool
    >>> f, src = ToolResultCapFilter(20), [human("q")]
    >>> out = cap_hot_apply(f, src)                         # the locked path (_hot_rest)
    >>> src.append(human("r")); cap_hot_apply(f, src) is out, out == src
    (True, True)
    """
    args = flt._turn_args
    if type(args) is tuple and len(args) == 5 and src is args[0]:
        if extend_capped(src, args[1], args[2], args[3], args[4]) == len(src):
            return args[2]
    return flt._hot_rest(src, tools_schema)


def _array(a, name, code):
    if type(a) is not array.array or a.typecode != code:
        raise TypeError(f"{name} must be an array.array of typecode {code!r}")


def _check_turn_args(src, ref, out, counts, kinds, savings, results, result_kinds, state):
    """The types ``clearing_turn`` and ``ClearingTurn.arm`` take, else ``TypeError`` naming the argument."""
    if (type(src) is not list or type(ref) is not list or type(out) is not list or type(results) is not list
            or type(result_kinds) is not list):
        raise TypeError("src, ref, out, results and result_kinds must be lists")
    _array(counts, "counts", "q")
    _array(kinds, "kinds", "b")
    _array(savings, "savings", "q")
    _array(state, "state", "q")


def _new_records(src, k, n, counter, placeholder_cost, n_pinned, message_cls, pinned=False):
    """The records of the new messages ``src[k:n]`` from ``counter``'s caches (see
    ``clearing_turn``): ``(counts, kinds, savings)``, or ``-3`` when a message's count (or a
    tool result's content count) is not cached, ``-1`` when a message cannot be recorded here
    (content that is not a str, a system message where the pinned prefix may grow, a value of
    an unexpected type, ``src`` changed; with ``message_cls``, a message of another type).
    With ``pinned`` (a fresh start), a system message where the pinned prefix may grow is
    pinned (kind 3), as the filter's ``_append`` records it. ``clearing_turn`` and
    ``ClearingTurn`` share it (the compiled twin's ``_new_records`` too)."""
    msgs_cache = counter._msgs
    if type(msgs_cache) is not dict:
        return -1
    texts = None  # the text cache, read only for an entry without the content count
    new_counts, new_kinds, new_savings = [], [], []
    for i in range(k, n):
        m = src[i]
        if message_cls is not None and type(m) is not message_cls:
            return -1
        e = msgs_cache.get(id(m))
        if e is None or type(e) is not tuple or e[0]() is not m:
            return -3  # (an entry of another message, whose id m reuses: counting m replaces it)
        c = e[1]
        if type(c) is not int or c < 0 or c > MAX_VALUE:
            return -1
        full = len(e) == 4  # (weakref, count, role, content count): the entry _fill writes
        role = e[2] if full else m.role
        if type(role) is not str:
            return -1
        saving = 0
        if role == "tool":
            if full:
                t = e[3]
                if t is None:
                    return -1  # (content that is not a str)
            else:
                content = m.content
                if type(content) is not str:
                    return -1
                if texts is None:
                    texts = counter._texts
                    if type(texts) is not dict:
                        return -1
                t = texts.get(content)
                if t is None:
                    return -3
            if type(t) is not int:
                return -1
            saving = min(max(0, t - placeholder_cost), c)
            kind = 2
        elif role == "assistant":
            kind = 4
        elif role == "system" and i == n_pinned:
            if not pinned:
                return -1
            kind = 3
            n_pinned += 1
        else:
            kind = 0
        if len(src) != n:
            return -1  # (a role's __eq__ changed src)
        new_counts.append(c)
        new_kinds.append(kind)
        new_savings.append(saving)
    return new_counts, new_kinds, new_savings


def _append_records(new, held, records):
    """Append the records ``records`` (``_new_records``') of the messages ``new`` to the held
    ``(ref, out, counts, kinds, savings, results, result_kinds)``: ``ref`` and ``out`` by the
    messages themselves, ``results`` by the indices of the tool results among them."""
    ref, out, counts, kinds, savings, results, result_kinds = held
    new_counts, new_kinds, new_savings = records
    k = len(ref)
    counts.extend(new_counts)
    kinds.extend(new_kinds)
    savings.extend(new_savings)
    for j, kind in enumerate(new_kinds):
        if kind == 2:
            results.append(k + j)
            result_kinds.append(2)
    ref.extend(new)
    out.extend(new)


def clearing_turn(src, ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings):
    """One turn of ``ClearToolResultsFilter`` (without ``exclude_tools`` or
    ``clear_tool_inputs``, over a counter with an additive message count) when the history
    only grew: the records of the new messages ``src[len(ref):]`` from the counter's caches,
    appended to the running records, and the scan's decision when nothing needs the full
    ``plan_clearing``.

    ``ref`` (the messages recorded), ``out`` (their output), ``counts``, ``kinds`` and
    ``savings`` (``array.array`` of typecodes ``q``, ``b``, ``q``: ``plan_clearing``'s
    records), ``results`` and ``result_kinds`` (the tool results' indices and kinds) and
    ``state`` (``array.array("q")`` of :data:`STATE_LEN` entries: ``plan_clearing``'s state,
    having scanned every record) are the filter's, extended in place. ``counter`` has the
    caches of ``CachedChatCounter`` (``_msgs``: ``{id(m): (weakref to m, count, role,
    content count)}``, as ``_fill`` writes them, or ``(weakref to m, count)``; ``_texts``:
    ``{text: count}``, for the content count of the shorter entries); ``settings`` is ``(placeholder_cost, trigger, step,
    keep)``. A new message's record: its cached count; kind ``2`` and saving ``count of its
    content - placeholder_cost`` (clipped to ``[0, count]``) for a tool result with a text
    content, ``4`` for an assistant message, ``0`` otherwise.

    Returns ``-1`` when it recorded nothing (a count or a content count not cached, content
    that is not a str, a system message where the pinned prefix may grow, more than
    :data:`TURN_MAX` new messages, or records that are not in step: the caller's general
    path); ``0`` when the records were appended, ``ref`` and ``out`` extended (``out`` by the
    new messages themselves) and ``state`` advanced: the scan takes no step and computes no
    room over them (``plan_clearing`` would return the same and leave the same state); ``1``
    when the records were appended, ``ref`` and ``out`` extended, and ``state`` left for
    ``plan_clearing`` (resumed) to scan the new messages: a step may be taken, or the room of
    the chunked cut is to be computed.

    >>> import array
    >>> from jianmu_fast.memory.context import TiktokenTokenCounter
    >>> from jianmu_fast.message import human
    >>> counter = TiktokenTokenCounter("o200k_base")
    >>> first, m = human("hello"), human("hi")
    >>> ref, out = [first], [first]
    >>> counts, kinds, savings = array.array("q", [8]), array.array("b", [0]), array.array("q", [0])
    >>> state = array.array("q", [1, 11, 0, 0, 0, 0, 0])   # one message scanned, total 11
    >>> rec = (ref, out, counts, kinds, savings, [], [], state)
    >>> clearing_turn([first, m], *rec, counter, (3, 1000, 250, 3))   # m's count is not cached yet
    -1
    >>> counter.count_message(m), clearing_turn([first, m], *rec, counter, (3, 1000, 250, 3))
    (5, 0)
    >>> list(counts), list(state), out == [first, m]
    ([8, 5], [2, 16, 0, 0, 0, 0, 0], True)
    """
    _check_turn_args(src, ref, out, counts, kinds, savings, results, result_kinds, state)
    placeholder_cost, trigger, step, keep = settings
    k = len(ref)
    n = len(src)
    if (n < k or len(out) != k or len(counts) != k or len(kinds) != k or len(savings) != k
            or len(state) != STATE_LEN or state[0] != k):
        return -1
    if k == 0 or n - k > TURN_MAX:
        return -1  # (a fresh scan starts from ``base``: plan_clearing's)
    got = _new_records(src, k, n, counter, placeholder_cost, state[5], None)
    if type(got) is int:
        return -1
    new_counts, new_kinds, new_savings = got
    total, cleared, limit, pending, n_results = state[1], state[2], state[3], state[4], state[6]
    work = False
    for c, kind in zip(new_counts, new_kinds):
        total += c
        if total > MAX_SUM:
            work = True  # (plan_clearing raises the error)
            break
        if kind == 2:
            n_results += 1
        x = total - trigger
        if step == 0:
            if x > 0 and n_results - keep > cleared:
                work = True
                break
            continue
        if x > limit:
            pending = 1
        if pending and kind != 4:
            work = True
            break
    _append_records(src[k:n], (ref, out, counts, kinds, savings, results, result_kinds), got)
    if work:
        return 1
    state[0], state[1], state[4], state[6] = n, total, pending, n_results
    return 0


def _copy_counts(counter, cache, originals, copies):
    """The counts of the cleared ``copies`` of ``originals`` in ``counter``'s message cache
    (``counter._msgs``, ``{id(m): (weakref to m, count, ...)}``), a list of ints, or None when
    one is not there. An entry of the filter's cleared cache ``cache`` (``{id(m): (weakref to
    m, copy)}``) keeps the count it was given as its third item and gives it next time (the
    copy's count by this counter; a new counter makes a new cache)."""
    msgs = getattr(counter, "_msgs", None)
    if type(msgs) is not dict:
        return None
    out = []
    for m, c in zip(originals, copies):
        e = cache.get(id(m))
        if not (e is not None and type(e) is tuple and e[0]() is m and e[1] is c):
            e = None
        if e is not None and len(e) == 3:
            out.append(e[2])
            continue
        ce = msgs.get(id(c))
        if ce is None or type(ce) is not tuple or len(ce) < 2 or ce[0]() is not c or type(ce[1]) is not int:
            return None
        if e is not None and len(e) == 2:
            cache[id(m)] = (e[0], c, ce[1])
        out.append(ce[1])
    return out


class ClearingTurn:
    """``ClearToolResultsFilter``'s hot turn as one call (the builder calls it in place of the
    filter's ``_hot_apply``): ``turn(src, tools_schema)`` returns what
    ``flt._hot_apply(src, tools_schema)`` returns.

    ``arm(src, ref, out, counts, kinds, savings, results, result_kinds, state, counter,
    settings)`` (``clearing_turn``'s arguments, which the filter's locked path sets after a
    turn) makes it hold the filter's records for the next call from this thread with the same
    ``src``; ``disarm()`` (any change of a setting, and any call that leaves the records
    unarmed) makes every call the filter's ``_hot_apply`` and drops what it held;
    ``disarm(hold=True)`` (the filter's locked path, at its start) keeps it for ``rearm()``
    (armed again with it, for the calling thread). An armed call from the arming thread, with ``src`` and no tools,
    whose new messages ``clearing_turn`` would record (not ``-1``) records them, scans them and
    returns ``out`` when no step was taken; every other call is ``flt._hot_apply(src,
    tools_schema)`` (after the records and the scan, for a step), but for a short other list
    (at most :data:`TURN_MAX` messages that the records do not extend: a new conversation, or
    the history note put before the history), which the turn starts afresh itself when it can
    (``_restart``: the held records refilled in place, a new output list, the scan from the
    start; one that clears goes to ``_hot_apply``).

    The compiled twin runs no Python code in that turn (exact types only: a ``message_cls``
    instance, ``str`` roles and contents, ``int`` counts and dict look-ups by ``int`` and
    ``str`` keys), so no other thread runs while it does and it takes no lock; this one takes
    ``flt._lock`` (without waiting: busy, it is ``_hot_apply``).

    The turn's records are ``clearing_turn``'s, and its decision ``plan_clearing``'s scan
    resumed over them (a move of the chunked cut included); a step (``state[2]``, the results
    cleared, grew) gives the filter a new output list with the cleared copies (``_step``, under
    the filter's lock), or, when that cannot be done here, leaves them to ``flt._hot_apply``,
    which finds the records scanned and the state ahead of its output. ``changed`` is None
    but after a call whose step ``_step`` took: then ``(out, positions, originals, counts)``,
    the new list, the positions it replaced (ascending), the messages they held, which keep
    their role and ids, and the copies' counts from the counter's message cache (None when
    one is not there) (the builder hands it to the next stage's records: ``Records.hint``).
    ``counted`` is ``(ref, counts, counter)`` of what ``arm`` holds (None once dropped): the
    filter's records, ``counts[i]`` the counter's count of ``ref[i]``, which the budget filter
    after it reads for the turn's new messages instead of looking them up again
    (``Records.window``'s ``known``).
    (The compiled twin puts the copies into the output list itself when nothing but the
    filter and the turn reference it, so no one can see the difference.)

    >>> from jianmu_fast.memory.context import ClearToolResultsFilter, TiktokenTokenCounter
    >>> from jianmu_fast.message import human
    >>> f = ClearToolResultsFilter(1000, TiktokenTokenCounter("o200k_base"), keep=1)
    >>> turn, src = f._hot_turn, [human("hello")]
    >>> out = turn(src)                       # the filter's locked path, which arms the turn
    >>> turn.armed, out == src
    (True, True)
    >>> src.append(human("hi")); f.counter.count_message(src[-1]) > 0
    True
    >>> turn(src) is out, out == src        # one call: records appended, out extended
    (True, True)
    """

    def __init__(self, flt, message_cls):
        self.flt = flt
        self.message_cls = message_cls
        self.armed = False
        self._held = None
        self.changed = None
        self.counted = None

    def arm(self, src, ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings):
        """Hold the records of the filter's last turn, for calls from this thread with ``src``."""
        _check_turn_args(src, ref, out, counts, kinds, savings, results, result_kinds, state)
        placeholder_cost, trigger, step, keep = settings
        self._held = (src, ref, out, counts, kinds, savings, results, result_kinds, state, counter,
                      (int(placeholder_cost), int(trigger), int(step), int(keep)), threading.get_ident())
        self.counted = (ref, counts, counter)
        self.armed = True

    def disarm(self, hold=False):
        """Every call is the filter's ``_hot_apply`` until ``arm``. What the last ``arm`` held
        is dropped (no list of the filter's stays referenced), unless ``hold``: then
        ``rearm`` may take it up again."""
        self.armed = False
        if not hold:
            self._held = None
            self.counted = None

    def rearm(self):
        """Armed again with what the last ``arm`` held, for calls from this thread (the filter's
        locked path, when its records are those it armed with)."""
        if self._held is None:
            raise ValueError("rearm: nothing was armed")
        self._held = self._held[:11] + (threading.get_ident(),)
        self.armed = True

    def __call__(self, src, tools_schema=None):
        """The filter's ``_hot_apply(src, tools_schema)``."""
        held = self._held
        self.changed = None
        if (self.armed and held is not None and src is held[0] and (tools_schema is None or not tools_schema)
                and threading.get_ident() == held[11]):
            got, out = self._locked_turn(held)
            if out is not None:
                return out
            if got == -3:  # a new message not counted yet (the loop's usual turn): counted, then again
                self.flt._warm(src, len(held[1]))
                if self.armed:
                    got, out = self._locked_turn(held)
                    if out is not None:
                        return out
        elif (self.armed and held is not None and type(src) is list and (tools_schema is None or not tools_schema)
                and threading.get_ident() == held[11]):
            out = self._restart(held, src)  # another list: a fresh start (a new conversation, a note put first)
            if out is not None:
                return out
        return self.flt._hot_apply(src, tools_schema)

    def _restart(self, held, src):
        """A fresh start on ``src`` (not the held list, at most ``TURN_MAX`` messages, and not an
        extension of the held records: ``extends`` says no), in place of the filter's general
        path: the records made anew from the counter's caches (the held lists and arrays emptied
        and refilled, a new output list), the scan from the start, under the filter's lock.
        None, with nothing changed, when that cannot be done here (a count not cached after
        ``_warm``, a message the records cannot take, a scan that clears, the lock busy, the
        filter's records not the held ones): the filter's ``_hot_apply`` does it then."""
        flt = self.flt
        ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings = held[1:11]
        placeholder_cost, trigger, step, keep = settings
        n, k = len(src), len(ref)
        if n == 0 or n > TURN_MAX:
            return None
        if n >= k:  # extends(ref, src) is False: its first message that is not ref's is unequal
            i = next((i for i in range(k) if src[i] is not ref[i]), None)
            if i is None:
                return None
            try:
                if src[i] == ref[i]:
                    return None  # (equal messages: the general path resumes)
            except Exception:
                return None
            if not self.armed or len(src) != n:
                return None
        got = _new_records(src, 0, n, counter, placeholder_cost, 0, self.message_cls, True)
        if got == -3:  # counted, then again
            flt._warm(src, 0)
            if not self.armed or len(src) != n or threading.get_ident() != self._held[11]:
                return None
            got = _new_records(src, 0, n, counter, placeholder_cost, 0, self.message_cls, True)
        if type(got) is int:
            return None
        new_counts, new_kinds, new_savings = got
        lock = flt._lock
        if self._held is not held or not lock.acquire(False):
            return None
        try:
            rec, args = flt._rec, flt._turn_args
            if (rec.out is not out or rec.messages is not ref or rec.state is not state or rec.counts is not counts
                    or rec.kinds is not kinds or rec.savings is not savings or rec.results is not results
                    or rec.result_kinds is not result_kinds or type(args) is not tuple or len(args) != 11
                    or args[0] is not held[0] or args[2] is not out or rec.calls or rec.owner
                    or type(rec.base) is not int or not 0 <= rec.base <= MAX_VALUE):
                return None
            # the scan from the start (plan_clearing's over the new records); one that clears is left
            # to the general path (its cleared copies)
            scan = array.array("q", bytes(8 * STATE_LEN))
            fresh = (array.array("q", new_counts), array.array("b", new_kinds), array.array("q", new_savings))
            if plan_clearing(*fresh, rec.base, trigger, step, keep, scan)[0] != 0:
                return None
            new_out = src[:]
            ref[:] = src
            del results[:], result_kinds[:]
            counts[:], kinds[:], savings[:] = fresh
            for j, kind in enumerate(new_kinds):
                if kind == 2:
                    results.append(j)
                    result_kinds.append(2)
            state[:] = scan
            rec.out, rec.cleared, rec.n_pinned, rec.shared = new_out, 0, new_kinds.count(3), True
            object.__setattr__(flt, "_turn_args", (src, ref, new_out) + args[3:])
            self._held = (src, ref, new_out) + held[3:]
            return new_out
        finally:
            lock.release()

    def _locked_turn(self, held):
        """``(got, out)``: the turn under the filter's lock (``got`` -1 when the lock is taken or
        the turn no longer holds ``held``), ``out`` the output list or ``None``."""
        lock = self.flt._lock
        if self._held is not held or not lock.acquire(False):
            return -1, None
        try:
            got = self._turn(held) if self._held is held else -1
            if got >= 0:
                return got, (held[2] if got == 0 else self._step(held))
            return got, None
        finally:
            lock.release()

    def _step(self, held):
        """A step ``_turn`` took (``state[2]``, the results cleared, grew past the filter's
        ``cleared``): the filter's output as a new list with the newly cleared results' copies
        (cached, or made by the filter's ``_cleared_result``), made the filter's and held (the
        caller holds the filter's lock); None, with nothing changed, when the filter's records
        are not the held ones or a copy fails (its ``_hot_apply`` does it then)."""
        flt = self.flt
        _, ref, out, _, _, _, results, result_kinds, state = held[:9]
        rec, args = flt._rec, flt._turn_args
        if (rec.out is not out or rec.messages is not ref or rec.state is not state or rec.results is not results
                or rec.result_kinds is not result_kinds or type(args) is not tuple or len(args) != 11
                or args[2] is not out):
            return None
        start, stop, n = rec.cleared, state[2], len(ref)
        if stop <= start or stop > len(results) or stop > len(result_kinds) or len(out) != n:
            return None
        cache = flt._cleared_cache._d
        if type(cache) is not dict:
            return None
        new_out = out[:]
        patched, originals = [], []
        for r in range(start, stop):
            kind = result_kinds[r]
            if not (type(kind) is int and kind == 2):
                continue
            i = results[r]
            if i < 0 or i >= n:
                return None
            m = ref[i]
            e = cache.get(id(m))
            if e is not None and type(e) is tuple and e[0]() is m:
                c = e[1]
            else:
                try:
                    c = flt._cleared_result(m)
                except Exception:
                    return None  # (the filter's path reports it)
                if len(ref) != n or len(new_out) != n:
                    return None
            new_out[i] = c
            patched.append(i)
            originals.append(m)
        rec.out = new_out
        rec.cleared = stop
        object.__setattr__(flt, "_turn_args", args[:2] + (new_out,) + args[3:])
        self._held = held[:2] + (new_out,) + held[3:]
        self.changed = (new_out, patched, originals, _copy_counts(held[9], cache, originals, [new_out[i] for i in patched]))
        return new_out

    def call(self, src, tools_schema=None):
        """``self(src, tools_schema)`` (what the builder calls: a method, which the compiled twin
        is called through without an argument tuple)."""
        return self(src, tools_schema)

    def _turn(self, held):
        """The new messages' records (``clearing_turn``'s) and ``plan_clearing``'s resumed scan
        over the held records: ``0`` when they were recorded and scanned with no step taken,
        ``1`` when a step was taken (``_step`` places the cleared copies),
        ``-3`` with nothing changed when a new message's count (or a result's content count) is
        not cached (the call has ``flt._warm(src, len(ref))`` count them and tries once more),
        ``-1`` with nothing changed otherwise."""
        src, ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings, _ = held
        placeholder_cost, trigger, step, keep = settings
        k, n = len(ref), len(src)
        if k == 0 or n < k or n - k > TURN_MAX:
            return -1
        if (len(out) != k or len(counts) != k or len(kinds) != k or len(savings) != k
                or len(state) != STATE_LEN or state[0] != k):
            return -1
        got = _new_records(src, k, n, counter, placeholder_cost, state[5], self.message_cls)
        if type(got) is int:
            return got
        if state[1] + sum(got[0]) > MAX_SUM:
            return -1  # (plan_clearing raises the error)
        _append_records(src[k:n], (ref, out, counts, kinds, savings, results, result_kinds), got)
        cleared = state[2]
        # the scan of the new messages (plan_clearing's, resumed): a move of the cut included
        plan_clearing(counts, kinds, savings, 0, trigger, step, keep, state)
        return 1 if state[2] != cleared else 0


def place_cleared(out, msgs, results, result_kinds, start, stop, cache):
    """Put the cleared copies of the clearable results (``result_kinds[r] == 2``) among
    ``results[start:stop]`` (indices into ``msgs`` and ``out``) in ``out``, from ``cache``
    (``{id(m): (weakref to m, copy)}``, ``ObjectCache``'s), in order; returns ``stop``, or the
    position ``r`` of the first one not cached (``out`` placed up to it: the caller makes that
    copy and goes on from ``r + 1``).

    >>> import weakref
    >>> from jianmu_fast.message import tool
    >>> a, b, a2 = tool("x", tool_call_id="1"), tool("y", tool_call_id="2"), tool("[cleared]", tool_call_id="1")
    >>> out = [a, b]
    >>> place_cleared(out, [a, b], [0, 1], [2, 2], 0, 2, {id(a): (weakref.ref(a), a2)}), out[0] is a2
    (1, True)
    """
    if (type(out) is not list or type(msgs) is not list or type(results) is not list or type(result_kinds) is not list
            or type(cache) is not dict):
        raise TypeError("out, msgs, results and result_kinds must be lists and cache a dict")
    if start < 0 or stop < start or stop > len(results) or stop > len(result_kinds):
        raise ValueError(f"need 0 <= start <= stop <= len(results), got {start}, {stop}, {len(results)}")
    for r in range(start, stop):
        kind = result_kinds[r]
        if not (type(kind) is int and kind == 2):
            continue
        i = results[r]
        if i < 0 or i >= len(msgs) or i >= len(out):
            raise IndexError(f"results[{r}] = {i} is out of range")
        m = msgs[i]
        e = cache.get(id(m))
        if e is None or type(e) is not tuple or e[0]() is not m:
            return r
        out[i] = e[1]
    return stop
