# cython: language_level=3
"""Compiled context-editing core: which tool results ``ClearToolResultsFilter`` clears.

Arithmetic only, over contiguous int64/int8 memoryviews, one pass over the new part of the
history (a resumable scan). The specification, with the meaning of every argument, is the
pure-Python twin ``jianmu_fast/_editing_core_py.py``; both have the same names, signatures,
results and error messages (proven by tests/test_context_editing_core.py).
"""

cimport cython
from cpython cimport array as carray
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE, PyList_GetSlice
from cpython.object cimport PyObject_GenericSetAttr, Py_SIZE
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.long cimport PyLong_FromVoidPtr
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport PyObject
from cpython.weakref cimport PyWeakref_GetObject
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR, PyUnicode_Compare
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport int64_t, int8_t
from libc.stdlib cimport free, malloc, realloc

import array

__all__ = ["ClearingTurn", "MAX_VALUE", "STATE_LEN", "TURN_MAX", "cap_hot_apply", "clearing_turn", "extend_capped", "extends", "place_cleared", "plan_clearing"]

MAX_VALUE = 1 << 53
STATE_LEN = 7
TURN_MAX = 16
cdef enum:
    C_TURN_MAX = 16
    C_STATE_LEN = 7  # (STATE_LEN, a compile-time constant on the turn's path)
cdef int64_t C_MAX = (<int64_t>1) << 53
cdef int64_t C_SUM = (<int64_t>1) << 62


cdef int _check(str name, int64_t value) except -1:
    if value < 0 or value > C_MAX:
        raise ValueError(f"{name} must be between 0 and 2**53, got {value}")
    return 0


cdef struct Prefix:
    # what ``_room_fast`` and a step's candidates read, over records ``[0, n)``: ``ps[j]`` the sum
    # of ``counts[:j]``, ``rs[j]`` the tool results among them, ``cs[r]`` the savings of the
    # first ``r`` results and ``pos[r]`` the index of result ``r`` (``r`` results so far);
    # ``cap`` entries allocated (``cap + 1`` for ``ps``, ``rs``, ``cs``). Extended as the records
    # grow (``_prefix_upto``): a ``ClearingTurn`` keeps one over the records it holds.
    int64_t *ps
    int64_t *rs
    int64_t *cs
    int64_t *pos
    Py_ssize_t cap
    Py_ssize_t n
    Py_ssize_t r


cdef void _prefix_free(Prefix *p) noexcept nogil:
    free(p.ps)
    free(p.rs)
    free(p.cs)
    free(p.pos)
    p.ps = p.rs = p.cs = p.pos = NULL
    p.cap = p.n = p.r = 0


cdef inline int _grow(int64_t **a, Py_ssize_t cap) noexcept nogil:
    """``a[0]`` reallocated to ``cap + 1`` entries: 0, or -1 when out of memory (``a[0]`` then
    unchanged, still owned by its ``Prefix``)."""
    cdef int64_t *q = <int64_t *>realloc(a[0], (cap + 1) * sizeof(int64_t))
    if q == NULL:
        return -1
    a[0] = q
    return 0


cdef int _prefix_upto(Prefix *p, const int64_t *counts, const int8_t *kinds, const int64_t *savings,
                      Py_ssize_t n) noexcept nogil:
    """``p`` over the records ``[0, n)`` (those up to ``p.n`` already in it): 0, or -1 when out
    of memory (``p`` then emptied)."""
    cdef Py_ssize_t j, cap
    cdef int8_t k
    if n > p.cap:
        cap = 2 * p.cap if 2 * p.cap > n else n
        if cap < 64:
            cap = 64
        if _grow(&p.ps, cap) or _grow(&p.rs, cap) or _grow(&p.cs, cap) or _grow(&p.pos, cap):
            _prefix_free(p)
            return -1
        p.cap = cap
    if p.n == 0:
        p.ps[0] = 0
        p.rs[0] = 0
        p.cs[0] = 0
        p.r = 0
    for j in range(p.n, n):
        k = kinds[j]
        if k == 1 or k == 2:
            p.pos[p.r] = j
            p.cs[p.r + 1] = p.cs[p.r] + savings[j]
            p.r += 1
        p.ps[j + 1] = p.ps[j] + counts[j]
        p.rs[j + 1] = p.r
    if n > p.n:
        p.n = n
    return 0


cdef int64_t _room_fast(const Prefix *p, const int8_t *kinds, Py_ssize_t n_pinned, Py_ssize_t end,
                        int64_t cleared, int64_t x, int64_t step) noexcept nogil:
    """``_room``, the same value, by a binary search over the prefix sums ``p`` (over at least
    ``[0, end)``): ``acc`` at ``j`` (what the loop of ``_room`` holds there) is ``ps[j] -
    ps[n_pinned] - cs[min(cleared, rs[j])]`` (no result is pinned), which never decreases as
    ``j`` grows (a saving is at most its message's count)."""
    cdef int64_t target, acc, r, base
    cdef Py_ssize_t lo, hi, mid
    cdef int8_t k
    if x <= 0:
        return -x
    target = (x + step - 1) // step * step
    base = p.ps[n_pinned]
    lo = n_pinned
    hi = end
    while lo < hi:  # the first j in [n_pinned, end) whose acc reaches target (end: none)
        mid = lo + (hi - lo) // 2
        r = p.rs[mid]
        if r > cleared:
            r = cleared
        if p.ps[mid] - base - p.cs[r] >= target:
            hi = mid
        else:
            lo = mid + 1
    while lo < end and lo != n_pinned:  # then the first unit start from there
        k = kinds[lo]
        if k != 1 and k != 2:
            break
        lo += 1
    if lo >= end:
        return 0
    r = p.rs[lo]
    if r > cleared:
        r = cleared
    acc = p.ps[lo] - base - p.cs[r]
    return acc // step * step - x


cdef int _scan(const int64_t *counts, const int8_t *kinds, const int64_t *savings, Py_ssize_t n, Py_ssize_t done,
               int64_t trigger, int64_t step, int64_t keep, int64_t *sc, Prefix *kept=NULL) noexcept nogil:
    """``plan_clearing``'s scan of ``[done:n]`` over checked records; ``sc`` holds ``total,
    cleared, limit, pending, n_pinned, n_results`` (in and out). ``kept``: prefix sums over
    these records kept between calls (extended here when a step is considered), or NULL (made
    here when needed, and freed). -1 when out of memory (``sc`` then unchanged), else 0."""
    cdef Py_ssize_t i
    cdef int64_t k, total, cleared, limit, pending, n_pinned, n_results, need, eligible, x
    cdef int64_t best_k, best_saved, saved, r, r0, room
    cdef Prefix local
    cdef Prefix *pre = kept if kept != NULL else &local
    cdef bint ready = False  # pre covers [0, n)
    local.ps = local.rs = local.cs = local.pos = NULL
    local.cap = local.n = local.r = 0
    total, cleared, limit, pending, n_pinned, n_results = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
    need = step if step > 0 else 1
    for i in range(done, n):
        total += counts[i]
        k = kinds[i]
        if k == 1 or k == 2:
            n_results += 1
        eligible = n_results - keep
        x = total - trigger
        if step == 0:
            if x > 0 and eligible > cleared:
                if not ready:
                    if _prefix_upto(pre, counts, kinds, savings, n) != 0:
                        return -1
                    ready = True
                best_k = -1
                best_saved = 0
                saved = 0
                for r in range(cleared, eligible):
                    saved += savings[pre.pos[r]]
                    if saved >= need:
                        best_k = r + 1
                        best_saved = saved
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
        if not ready:
            if _prefix_upto(pre, counts, kinds, savings, n) != 0:
                return -1
            ready = True
        if eligible > cleared:
            r0 = _room_fast(pre, kinds, n_pinned, i + 1, cleared, x, step)
            best_k = -1
            best_saved = -1
            saved = 0
            for r in range(cleared, eligible):
                saved += savings[pre.pos[r]]
                if saved > best_saved and (saved >= need or (r + 1 == eligible and saved > 0)):
                    room = _room_fast(pre, kinds, n_pinned, i + 1, r + 1, x - saved, step)
                    if 10 * room >= 9 * r0:
                        best_k = r + 1
                        best_saved = saved
            if best_k >= 0:
                total -= best_saved
                cleared = best_k
                x = total - trigger
        limit = x + _room_fast(pre, kinds, n_pinned, i + 1, cleared, x, step)
        pending = 0
    _prefix_free(&local)
    sc[0], sc[1], sc[2], sc[3], sc[4], sc[5] = total, cleared, limit, pending, n_pinned, n_results
    return 0


def plan_clearing(const int64_t[::1] counts, const int8_t[::1] kinds, const int64_t[::1] savings,
                  int64_t base, int64_t trigger, int64_t step, int64_t keep, int64_t[::1] state=None):
    """Which tool results to clear: ``(cleared, total)``; see ``_editing_core_py``."""
    cdef Py_ssize_t n = counts.shape[0]
    cdef Py_ssize_t i, done
    cdef int64_t k, s, total, check, cleared, limit, pending, n_pinned, n_results, need, eligible, x
    cdef int64_t sc[6]
    cdef int failed = 0
    if kinds.shape[0] != n or savings.shape[0] != n:
        raise ValueError(
            f"counts, kinds and savings must have the same length, got {n}, {kinds.shape[0]}, {savings.shape[0]}")
    _check("base", base)
    _check("trigger", trigger)
    _check("step", step)
    _check("keep", keep)
    if state is None:
        done = 0
    else:
        if state.shape[0] != STATE_LEN:
            raise ValueError(f"state must have {STATE_LEN} entries, got {state.shape[0]}")
        if state[0] < 0 or state[0] > n:
            raise ValueError(f"state[0] (messages scanned) must be between 0 and {n}, got {state[0]}")
        done = <Py_ssize_t>state[0]
    if done == 0:
        total, cleared, limit, pending, n_pinned, n_results = base, 0, 0, 0, 0, 0
    else:
        total, cleared, limit, pending, n_pinned, n_results = state[1], state[2], state[3], state[4], state[5], state[6]
    check = total
    for i in range(done, n):
        if counts[i] < 0 or counts[i] > C_MAX:
            raise ValueError(f"counts[{i}] must be between 0 and 2**53, got {counts[i]}")
        check += counts[i]
        if check > C_SUM:
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
            raise ValueError(
                f"savings[{i}] must be between 0 and counts[{i}], and 0 unless kinds[{i}] == 2, got {s}")
    sc[0], sc[1], sc[2], sc[3], sc[4], sc[5] = total, cleared, limit, pending, n_pinned, n_results
    if n > 0:
        with nogil:
            failed = _scan(&counts[0], &kinds[0], &savings[0], n, done, trigger, step, keep, sc)
        if failed:
            raise MemoryError()
    total, cleared, limit, pending, n_pinned, n_results = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
    if state is not None:
        state[0] = n
        state[1] = total
        state[2] = cleared
        state[3] = limit
        state[4] = pending
        state[5] = n_pinned
        state[6] = n_results
    return (cleared, total)


def extends(previous, current):
    """Whether ``current`` starts with the items of ``previous``; see ``_editing_core_py``."""
    cdef Py_ssize_t n, i
    if type(previous) is not list or type(current) is not list:
        raise TypeError(f"previous and current must be lists, got {type(previous).__name__} and {type(current).__name__}")
    n = PyList_GET_SIZE(previous)
    if PyList_GET_SIZE(current) < n:
        return False
    for i in range(n):
        if PyList_GET_ITEM(previous, i) != PyList_GET_ITEM(current, i):
            # not the same object: equal objects still match, as ``==`` on the lists does
            if not (<object>PyList_GET_ITEM(previous, i) == <object>PyList_GET_ITEM(current, i)):
                return False
            if PyList_GET_SIZE(previous) != n or PyList_GET_SIZE(current) < n:
                return False  # a comparison changed a list: no longer a prefix we can vouch for
    return True


#: references to a ClearingTurn's output list that are the filter's own (its records' ``out``,
#: its ``_turn_args`` and the turn's ``out``): with no other, no one can see it change
cdef enum:
    OWN_REFS = 3

cdef str _TOOL = "tool"
cdef str _ASSISTANT = "assistant"
cdef str _SYSTEM = "system"


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    Py_ssize_t _refs "Py_REFCNT"(PyObject *o)  # (of a borrowed pointer: no temporary reference)


cdef inline bint _role_is(str role, str name) except -1:
    """``role == name`` for exact strs: by identity, then length and first character, inline
    (the roles differ there), and only then by ``PyUnicode_Compare``."""
    if role is name:
        return True
    if PyUnicode_GET_LENGTH(role) != PyUnicode_GET_LENGTH(name) or PyUnicode_GET_LENGTH(role) == 0:
        return PyUnicode_GET_LENGTH(role) == PyUnicode_GET_LENGTH(name)
    if PyUnicode_READ_CHAR(role, 0) != PyUnicode_READ_CHAR(name, 0):
        return False
    return PyUnicode_Compare(role, name) == 0


def extend_capped(src, ref, out, cache, fits=0):
    """One turn of ``ToolResultCapFilter`` over a growing list; see ``_editing_core_py``."""
    return _extend_capped(src, ref, out, cache, fits)


cdef Py_ssize_t _extend_capped(object src, object ref, object out, object cache, object fits) except -1:
    cdef Py_ssize_t i, n, k, f
    cdef object m, v, e, role, c
    if type(src) is not list or type(ref) is not list or type(out) is not list or type(cache) is not dict:
        raise TypeError("src, ref and out must be lists and cache a dict")
    if type(fits) is not int or fits < 0:
        raise ValueError(f"fits must be an int >= 0, got {fits!r}")
    f = fits if fits < PY_SSIZE_T_MAX // 8 else PY_SSIZE_T_MAX // 8
    i = PyList_GET_SIZE(ref)
    if PyList_GET_SIZE(out) != i or PyList_GET_SIZE(src) < i:
        raise ValueError(f"need len(out) == len(ref) <= len(src), got {PyList_GET_SIZE(out)}, {i}, {PyList_GET_SIZE(src)}")
    n = PyList_GET_SIZE(src)
    while i < n:
        m = <object>PyList_GET_ITEM(src, i)
        role = m.role
        if role is _TOOL or role == _TOOL:
            e = (<dict>cache).get(PyLong_FromVoidPtr(<void *>m))  # id(m)
            if e is None or <object>PyWeakref_GetObject((<tuple>e)[0]) is not m:
                if f == 0:
                    break
                c = m.content
                if type(c) is not str:
                    break
                k = PyUnicode_GET_LENGTH(c)
                if not (k * 4 <= f or (k <= f and PyUnicode_IS_ASCII(c))):
                    break
                v = m  # certainly within the cap: itself
            else:
                v = (<tuple>e)[1]
        else:
            v = m
        PyList_Append(ref, m)
        PyList_Append(out, v)
        n = PyList_GET_SIZE(src)  # (a role's __eq__ may have changed src)
        i += 1
    return i


def cap_hot_apply(flt, src, tools_schema=None):
    """``ToolResultCapFilter._hot_apply`` (no Python frame on the agent loop's turn); see
    ``_editing_core_py``."""
    args = flt._turn_args
    if type(args) is tuple and len(<tuple>args) == 5 and src is (<tuple>args)[0]:
        if _extend_capped(src, (<tuple>args)[1], (<tuple>args)[2], (<tuple>args)[3], (<tuple>args)[4]) == PyList_GET_SIZE(src):
            return (<tuple>args)[2]
    return flt._hot_rest(src, tools_schema)


cdef int _is_array(object a, str name, char code) except -1:
    if type(a) is not carray.array or (<carray.array>a).ob_descr.typecode != code:
        raise TypeError(f"{name} must be an array.array of typecode {chr(code)!r}")
    return 0


cdef int _check_turn_args(object src, object ref, object out, object results, object result_kinds,
                          object counts, object kinds, object savings, object state) except -1:
    """The argument checks shared by ``clearing_turn`` and ``ClearingTurn.arm`` (the twin's
    ``_check_turn_args``)."""
    if (type(src) is not list or type(ref) is not list or type(out) is not list or type(results) is not list
            or type(result_kinds) is not list):
        raise TypeError("src, ref, out, results and result_kinds must be lists")
    _is_array(counts, "counts", b'q')
    _is_array(kinds, "kinds", b'b')
    _is_array(savings, "savings", b'q')
    _is_array(state, "state", b'q')
    return 0


cdef int _new_records(list src, Py_ssize_t k, Py_ssize_t n, dict msgs_cache, object counter, object mcls,
                      int64_t placeholder_cost, Py_ssize_t n_pinned, int64_t *new_counts, int8_t *new_kinds,
                      int64_t *new_savings, int miss, Py_ssize_t *pinned=NULL) except -2:
    """The records of ``src[k:n]`` (count, kind, saving) into the three buffers: 0, or ``miss``
    where a message's count or a result's content count is not cached, -1 for anything else
    (``mcls``: the exact message type required, or None). With ``pinned`` (a fresh start), a
    system message at ``*pinned`` is pinned (kind 3) and ``*pinned`` counts it, as the filter's
    ``_append`` records it; without, it is -1. Shared by ``clearing_turn`` and
    ``ClearingTurn._turn`` / ``_restart`` (the twin's ``_new_records``)."""
    cdef Py_ssize_t i, j
    cdef int64_t c, t, saving
    cdef int8_t kind
    cdef bint full
    cdef object m, e, content, tv, cv, texts = None
    cdef object role
    cdef str srole
    for i in range(k, n):
        j = i - k
        m = <object>PyList_GET_ITEM(src, i)
        if mcls is not None and type(m) is not mcls:
            return -1
        e = msgs_cache.get(PyLong_FromVoidPtr(<void *>m))  # id(m)
        if e is None or type(e) is not tuple or <object>PyWeakref_GetObject((<tuple>e)[0]) is not m:
            return miss  # (an entry of another message, whose id m reuses: counting m replaces it)
        cv = (<tuple>e)[1]
        if type(cv) is not int:
            return -1
        c = cv
        if c < 0 or c > C_MAX:
            return -1
        full = PyTuple_GET_SIZE(e) == 4  # (ref, count, role, content count): _fill's entry
        role = (<tuple>e)[2] if full else m.role
        if type(role) is not str:
            return -1
        srole = <str>role  # (an exact str)
        saving = 0
        if _role_is(srole, _TOOL):
            if full:
                tv = (<tuple>e)[3]
                if tv is None:
                    return -1  # (content that is not a str)
            else:
                content = m.content
                if type(content) is not str:
                    return -1
                if texts is None:  # (the text cache: only for an entry without the content count)
                    texts = counter._texts
                    if type(texts) is not dict:
                        return -1
                tv = (<dict>texts).get(content)
                if tv is None:
                    return miss
            if type(tv) is not int:
                return -1
            t = tv
            saving = t - placeholder_cost
            if saving < 0:
                saving = 0
            if saving > c:
                saving = c
            kind = 2
        elif _role_is(srole, _ASSISTANT):
            kind = 4
        elif _role_is(srole, _SYSTEM) and i == n_pinned:
            if pinned == NULL:
                return -1
            kind = 3
            n_pinned += 1
        else:
            kind = 0
        if PyList_GET_SIZE(src) != n:
            return -1  # (a role's __eq__ changed src)
        new_counts[j] = c
        new_kinds[j] = kind
        new_savings[j] = saving
    if pinned != NULL:
        pinned[0] = n_pinned
    return 0


def clearing_turn(src, ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings):
    """One turn of ``ClearToolResultsFilter`` when the history only grew; see ``_editing_core_py``."""
    cdef int64_t new_counts[C_TURN_MAX]
    cdef int8_t new_kinds[C_TURN_MAX]
    cdef int64_t new_savings[C_TURN_MAX]
    cdef int64_t placeholder_cost, trigger, step, keep, c, t, saving, total, cleared, limit, pending, n_results, x
    cdef int64_t *st
    cdef Py_ssize_t k, n, i, j, n_pinned
    cdef int8_t kind
    cdef bint work = 0
    cdef int got
    cdef object m, e, role, content, tv, cv
    cdef object msgs_cache, texts
    _check_turn_args(src, ref, out, results, result_kinds, counts, kinds, savings, state)
    placeholder_cost, trigger, step, keep = settings
    k = PyList_GET_SIZE(ref)
    n = PyList_GET_SIZE(src)
    if (n < k or PyList_GET_SIZE(out) != k or len(counts) != k or len(kinds) != k or len(savings) != k
            or len(state) != STATE_LEN):
        return -1
    st = <int64_t *>(<carray.array>state).data.as_longlongs
    if st[0] != k:
        return -1
    if k == 0 or n - k > C_TURN_MAX:
        return -1  # (a fresh scan starts from ``base``: plan_clearing's)
    msgs_cache = counter._msgs
    if type(msgs_cache) is not dict:
        return -1
    n_pinned = <Py_ssize_t>st[5]
    got = _new_records(src, k, n, msgs_cache, counter, None, placeholder_cost, n_pinned, new_counts, new_kinds,
                       new_savings, -1)
    if got != 0:
        return got
    total, cleared, limit, pending, n_results = st[1], st[2], st[3], st[4], st[6]
    for j in range(n - k):
        total += new_counts[j]
        if total > C_SUM:
            work = 1  # (plan_clearing raises the error)
            break
        kind = new_kinds[j]
        if kind == 2:
            n_results += 1
        x = total - trigger
        if step == 0:
            if x > 0 and n_results - keep > cleared:
                work = 1
                break
            continue
        if x > limit:
            pending = 1
        if pending and kind != 4:
            work = 1
            break
    carray.resize_smart(<carray.array>counts, n)
    carray.resize_smart(<carray.array>kinds, n)
    carray.resize_smart(<carray.array>savings, n)
    for j in range(n - k):
        (<carray.array>counts).data.as_longlongs[k + j] = new_counts[j]
        (<carray.array>kinds).data.as_schars[k + j] = new_kinds[j]
        (<carray.array>savings).data.as_longlongs[k + j] = new_savings[j]
        if new_kinds[j] == 2:
            PyList_Append(results, k + j)
            PyList_Append(result_kinds, 2)
    for i in range(k, n):
        m = <object>PyList_GET_ITEM(src, i)
        PyList_Append(ref, m)
        PyList_Append(out, m)
    if work:
        return 1
    st = <int64_t *>(<carray.array>state).data.as_longlongs
    st[0] = n
    st[1] = total
    st[4] = pending
    st[6] = n_results
    return 0


cdef bint _ids_differ(object a, object b):
    """Two messages of the message class whose ``id`` fields are different strs: unequal, as
    ``a == b`` says (a field differs), without running its Python code."""
    cdef object x, y
    try:
        x = (<dict>a.__dict__).get("id") if type(a.__dict__) is dict else None
        y = (<dict>b.__dict__).get("id") if type(b.__dict__) is dict else None
    except Exception:
        return False
    return type(x) is str and type(y) is str and not (x == y)


@cython.auto_pickle(False)
cdef class ClearingTurn:
    """``ClearToolResultsFilter``'s hot turn as one compiled call; see ``_editing_core_py``."""
    cdef readonly object flt
    cdef readonly bint armed
    cdef readonly object changed
    cdef readonly object counted
    cdef object src, message_cls, counter
    cdef list ref, out, results, result_kinds
    cdef carray.array counts, kinds, savings, state
    cdef int64_t placeholder_cost, trigger, step, keep
    cdef unsigned long owner
    cdef Prefix pre  # the scan's prefix sums over the held records (emptied when they are replaced)

    def __cinit__(self, *args, **kwargs):
        self.pre.ps = self.pre.rs = self.pre.cs = self.pre.pos = NULL
        self.pre.cap = self.pre.n = self.pre.r = 0

    def __dealloc__(self):
        _prefix_free(&self.pre)

    def __init__(self, flt, message_cls):
        self.flt = flt
        self.message_cls = message_cls
        self.armed = 0

    def arm(self, src, ref, out, counts, kinds, savings, results, result_kinds, state, counter, settings):
        """Hold the records of the filter's last turn (``clearing_turn``'s arguments), for calls
        from this thread with ``src``."""
        _check_turn_args(src, ref, out, results, result_kinds, counts, kinds, savings, state)
        self.placeholder_cost, self.trigger, self.step, self.keep = settings
        self.src, self.ref, self.out, self.results, self.result_kinds = src, ref, out, results, result_kinds
        self.counts, self.kinds, self.savings, self.state = counts, kinds, savings, state
        self.counter = counter
        self.counted = (ref, counts, counter)
        self.pre.n = 0  # (records the prefix sums may not be of)
        self.owner = PyThread_get_thread_ident()
        self.armed = 1

    def disarm(self, bint hold=False):
        """Every call is the filter's ``_hot_apply`` until ``arm``; what it held is dropped
        unless ``hold`` (then ``rearm`` may take it up again)."""
        self.armed = 0
        if not hold:
            self.pre.n = 0
            self.src = self.ref = self.out = self.results = self.result_kinds = None
            self.counts = self.kinds = self.savings = self.state = None
            self.counter = None
            self.counted = None

    def rearm(self):
        """Armed again with what the last ``arm`` held, for calls from this thread (the filter's
        locked path, when its records are those it armed with)."""
        if self.src is None:
            raise ValueError("rearm: nothing was armed")
        self.owner = PyThread_get_thread_ident()
        self.armed = 1

    def __call__(self, src, tools_schema=None):
        """The filter's ``_hot_apply(src, tools_schema)`` (see ``call``)."""
        return self.call(src, tools_schema)

    def call(self, src, tools_schema=None):
        """``self(src, tools_schema)`` (what the builder calls: a method, called without an
        argument tuple)."""
        cdef int got
        cdef object out
        self.changed = None
        if (self.armed and src is self.src and (tools_schema is None or not tools_schema)
                and PyThread_get_thread_ident() == self.owner):
            got = self._turn()
            if got == -3:  # a new message not counted yet (the loop's usual turn): counted, then again
                self.flt._warm(src, PyList_GET_SIZE(self.ref))
                if self.armed and src is self.src and PyThread_get_thread_ident() == self.owner:
                    got = self._turn()
            if got == 0:
                return self.out
            if got == 1:  # a step, scanned: its cleared copies in a new list
                out = self._step()
                if out is not None:
                    return out
        elif (self.armed and type(src) is list and (tools_schema is None or not tools_schema)
                and PyThread_get_thread_ident() == self.owner):
            out = self._restart(<list>src)  # another list: a fresh start (a new conversation, a note put first)
            if out is not None:
                return out
        return self.flt._hot_apply(src, tools_schema)

    cdef object _restart(self, list src):
        """A fresh start on ``src`` (not the held list, at most ``TURN_MAX`` messages, and not
        an extension of the held records: ``extends`` says no), in place of the filter's general
        path: the records made anew from the counter's caches (the held lists and arrays
        emptied and refilled, a new output list), the scan from the start, under the filter's
        lock. None, with nothing changed, when that cannot be done here (a count not cached
        after ``_warm``, a message the records cannot take, a scan that clears, the lock busy,
        the filter's records not the held ones): the filter's ``_hot_apply`` does it then."""
        cdef int64_t new_counts[C_TURN_MAX]
        cdef int8_t new_kinds[C_TURN_MAX]
        cdef int64_t new_savings[C_TURN_MAX]
        cdef int64_t sc[6]
        cdef int64_t base, total
        cdef int64_t *st
        cdef Py_ssize_t n = PyList_GET_SIZE(src), k, i, j, pinned = 0
        cdef int got
        cdef object flt = self.flt, rec, lock, args, msgs_cache, texts, a, b
        cdef list ref = self.ref, new_out
        if n == 0 or n > C_TURN_MAX or ref is None or self.out is None or self.state is None:
            return None
        # extends(ref, src) is False: src is shorter, or its first message that is not ref's is unequal
        k = PyList_GET_SIZE(ref)
        if n >= k:
            for i in range(k):
                if PyList_GET_ITEM(src, i) != PyList_GET_ITEM(ref, i):
                    break
            else:
                return None
            a = <object>PyList_GET_ITEM(src, i)
            b = <object>PyList_GET_ITEM(ref, i)
            if not (type(a) is self.message_cls and type(b) is self.message_cls and _ids_differ(a, b)):
                try:
                    if a == b:
                        return None  # (equal messages: the general path resumes)
                except Exception:
                    return None
            if not self.armed or PyList_GET_SIZE(src) != n:
                return None
        msgs_cache = self.counter._msgs
        if type(msgs_cache) is not dict:
            return None
        got = _new_records(src, 0, n, msgs_cache, self.counter, self.message_cls, self.placeholder_cost, 0, new_counts,
                           new_kinds, new_savings, -3, &pinned)
        if got == -3:  # counted, then again
            flt._warm(src, 0)
            if not self.armed or PyList_GET_SIZE(src) != n or PyThread_get_thread_ident() != self.owner:
                return None
            msgs_cache = self.counter._msgs
            if type(msgs_cache) is not dict:
                return None
            pinned = 0
            got = _new_records(src, 0, n, msgs_cache, self.counter, self.message_cls, self.placeholder_cost, 0, new_counts,
                               new_kinds, new_savings, -3, &pinned)
        if got != 0:
            return None
        lock = flt._lock
        if not lock.acquire(False):
            return None
        try:
            rec = flt._rec
            args = flt._turn_args
            if (rec.out is not self.out or rec.messages is not ref or rec.state is not self.state
                    or rec.counts is not self.counts or rec.kinds is not self.kinds or rec.savings is not self.savings
                    or rec.results is not self.results or rec.result_kinds is not self.result_kinds
                    or type(args) is not tuple or PyTuple_GET_SIZE(args) != 11 or (<tuple>args)[0] is not self.src
                    or (<tuple>args)[2] is not self.out or rec.calls or rec.owner or type(rec.base) is not int):
                return None
            base = rec.base
            if base < 0 or base > C_MAX:
                return None
            # the scan from the start (plan_clearing's over the new records); one that clears is left
            # to the general path (its cleared copies)
            total = base
            for j in range(n):
                total += new_counts[j]
            sc[0], sc[1], sc[2], sc[3], sc[4], sc[5] = base, 0, 0, 0, pinned, 0
            if _scan(new_counts, new_kinds, new_savings, n, 0, self.trigger, self.step, self.keep, sc) != 0 or sc[1] != 0:
                return None
            new_out = PyList_GetSlice(src, 0, n)
            self.pre.n = 0
            del ref[:]
            ref.extend(src)
            del self.results[:]
            del self.result_kinds[:]
            carray.resize_smart(self.counts, n)
            carray.resize_smart(self.kinds, n)
            carray.resize_smart(self.savings, n)
            for j in range(n):
                self.counts.data.as_longlongs[j] = new_counts[j]
                self.kinds.data.as_schars[j] = new_kinds[j]
                self.savings.data.as_longlongs[j] = new_savings[j]
                if new_kinds[j] == 2:
                    PyList_Append(self.results, j)
                    PyList_Append(self.result_kinds, 2)
            st = <int64_t *>self.state.data.as_longlongs
            st[0] = n
            st[1], st[2], st[3], st[4], st[5], st[6] = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
            rec.out = new_out
            rec.cleared = 0
            rec.n_pinned = pinned
            rec.shared = True
            PyObject_GenericSetAttr(flt, "_turn_args", (src, ref, new_out) + (<tuple>args)[3:])
            self.src = src
            self.out = new_out
            return new_out
        finally:
            lock.release()

    cdef object _step(self):
        """A step ``_turn`` took (``state[2]``, the results cleared, grew past the filter's
        ``cleared``): the filter's output as a new list with the newly cleared results' copies
        (cached, or made by the filter's ``_cleared_result``), made the filter's and held, under
        the filter's lock; None, with nothing changed, when the lock is busy, the filter's
        records are not the held ones or a copy fails (its ``_hot_apply`` does it then). When
        nothing but the filter's records, its ``_turn_args`` and this turn reference the output
        list (``OWN_REFS``), nobody can see it change: the copies are put in it in place (no copy
        of the whole list; the twin always copies, which no one can tell apart)."""
        cdef Py_ssize_t r, i, start, stop, n, j
        cdef object flt = self.flt, rec, lock, args, m, e, c, kind, cache, key, ce, cc, msgs
        cdef list new_out, patched, originals, copies, counts
        lock = flt._lock
        if not lock.acquire(False):
            return None
        try:
            rec = flt._rec
            args = flt._turn_args
            if (rec.out is not self.out or rec.messages is not self.ref or rec.state is not self.state
                    or rec.results is not self.results or rec.result_kinds is not self.result_kinds
                    or type(args) is not tuple or PyTuple_GET_SIZE(args) != 11 or (<tuple>args)[2] is not self.out):
                return None
            start = rec.cleared
            stop = <Py_ssize_t>self.state.data.as_longlongs[2]
            n = PyList_GET_SIZE(self.ref)
            if (stop <= start or stop > PyList_GET_SIZE(self.results) or stop > PyList_GET_SIZE(self.result_kinds)
                    or PyList_GET_SIZE(self.out) != n):
                return None
            cache = flt._cleared_cache._d
            if type(cache) is not dict:
                return None
            patched, originals, copies = [], [], []
            # the copies' counts (changed[3]): the count a cache entry holds with its copy (its
            # third item), else the counter's cached count of the copy, then kept in the entry
            # (the same count: the copy's, by this counter; a new counter makes a new cache);
            # None when one is not there (the twin's _copy_counts)
            msgs = getattr(self.counter, "_msgs", None)
            counts = [] if type(msgs) is dict else None
            for r in range(start, stop):
                kind = <object>PyList_GET_ITEM(self.result_kinds, r)
                if not (type(kind) is int and kind == 2):
                    continue
                i = <object>PyList_GET_ITEM(self.results, r)
                if i < 0 or i >= n:
                    return None
                m = <object>PyList_GET_ITEM(self.ref, i)
                key = PyLong_FromVoidPtr(<void *>m)  # id(m)
                e = (<dict>cache).get(key)
                cc = None
                if e is not None and type(e) is tuple and <object>PyWeakref_GetObject((<tuple>e)[0]) is m:
                    c = (<tuple>e)[1]
                    if PyTuple_GET_SIZE(e) == 3:
                        cc = (<tuple>e)[2]
                else:
                    e = None
                    try:
                        c = flt._cleared_result(m)
                    except Exception:
                        return None  # (the filter's path reports it)
                    if (PyList_GET_SIZE(self.ref) != n or PyList_GET_SIZE(self.out) != n or rec.out is not self.out
                            or flt._turn_args is not args):
                        return None
                    e = (<dict>cache).get(key)  # (the entry _cleared_result made)
                    if not (e is not None and type(e) is tuple and PyTuple_GET_SIZE(e) == 2
                            and <object>PyWeakref_GetObject((<tuple>e)[0]) is m and (<tuple>e)[1] is c):
                        e = None
                if counts is not None:
                    if cc is None:
                        ce = (<dict>msgs).get(PyLong_FromVoidPtr(<void *>c))  # id(c)
                        if (ce is not None and type(ce) is tuple and PyTuple_GET_SIZE(ce) >= 2
                                and <object>PyWeakref_GetObject((<tuple>ce)[0]) is c and type((<tuple>ce)[1]) is int):
                            cc = (<tuple>ce)[1]
                            if e is not None and PyTuple_GET_SIZE(e) == 2:
                                (<dict>cache)[key] = ((<tuple>e)[0], c, cc)
                    if cc is None:
                        counts = None
                    else:
                        PyList_Append(counts, cc)
                PyList_Append(patched, i)
                PyList_Append(originals, m)
                PyList_Append(copies, c)
            if _refs(<PyObject *>self.out) == OWN_REFS:  # no one else holds it: in place
                new_out = self.out
                for j in range(PyList_GET_SIZE(patched)):
                    i = <object>PyList_GET_ITEM(patched, j)
                    new_out[i] = <object>PyList_GET_ITEM(copies, j)
                rec.cleared = stop
            else:
                new_out = PyList_GetSlice(self.out, 0, n)
                for j in range(PyList_GET_SIZE(patched)):
                    i = <object>PyList_GET_ITEM(patched, j)
                    new_out[i] = <object>PyList_GET_ITEM(copies, j)
                rec.out = new_out
                rec.cleared = stop
                PyObject_GenericSetAttr(flt, "_turn_args", (<tuple>args)[:2] + (new_out,) + (<tuple>args)[3:])
                self.out = new_out
            self.changed = (new_out, patched, originals, counts)
            return new_out
        finally:
            lock.release()

    cdef int _turn(self) except -2:
        """The new messages' records (``clearing_turn``'s) and ``plan_clearing``'s resumed scan
        over the held records: 0 when they were recorded and scanned with no step taken (the
        output is the held ``out``, extended), 1 when a step was taken (``_step`` places the
        cleared copies), -3 with nothing changed when a new message's
        count (or a result's content count) is not cached, -1 with nothing changed otherwise. It runs no
        Python code (exact types only, dict look-ups by int and exact str keys, no tracked
        allocation), so no other thread runs while it does."""
        cdef int64_t sc[6]
        cdef int64_t c, t, saving, total, cleared, limit, pending, n_results, x
        cdef int64_t *st
        cdef Py_ssize_t k, n, i, j, n_pinned
        cdef int8_t kind
        cdef int got
        cdef object m, e, role, content, tv, cv, msgs_cache, texts, mcls
        cdef list src = <list>self.src, ref = self.ref, out = self.out
        k = PyList_GET_SIZE(ref)
        n = PyList_GET_SIZE(src)
        if k == 0 or n < k or n - k > C_TURN_MAX:
            return -1
        if (PyList_GET_SIZE(out) != k or Py_SIZE(self.counts) != k
                or Py_SIZE(self.kinds) != k or Py_SIZE(self.savings) != k or Py_SIZE(self.state) != C_STATE_LEN):
            return -1
        st = <int64_t *>self.state.data.as_longlongs
        if st[0] != k:
            return -1
        msgs_cache = self.counter._msgs
        if type(msgs_cache) is not dict:
            return -1
        mcls = self.message_cls
        n_pinned = <Py_ssize_t>st[5]
        # the new records go straight to the held arrays' tails (no buffer to copy from: fewer
        # cache lines touched per turn); the arrays are cut back to k when they are not taken
        carray.resize_smart(self.counts, n)
        carray.resize_smart(self.kinds, n)
        carray.resize_smart(self.savings, n)
        got = _new_records(src, k, n, msgs_cache, self.counter, mcls, self.placeholder_cost, n_pinned,
                           <int64_t *>self.counts.data.as_longlongs + k, <int8_t *>self.kinds.data.as_schars + k,
                           <int64_t *>self.savings.data.as_longlongs + k, -3)
        if got == 0:
            total = st[1]
            for j in range(k, n):
                total += self.counts.data.as_longlongs[j]
                if total > C_SUM:
                    got = -1  # (plan_clearing raises the error)
                    break
        if got != 0:
            carray.resize_smart(self.counts, k)
            carray.resize_smart(self.kinds, k)
            carray.resize_smart(self.savings, k)
            return got
        for j in range(k, n):
            if self.kinds.data.as_schars[j] == 2:
                PyList_Append(self.results, j)
                PyList_Append(self.result_kinds, 2)
        for i in range(k, n):
            m = <object>PyList_GET_ITEM(src, i)
            PyList_Append(ref, m)
            PyList_Append(out, m)
        # the scan of the new messages (plan_clearing's, resumed): a move of the cut included
        st = <int64_t *>self.state.data.as_longlongs
        cleared = st[2]
        sc[0], sc[1], sc[2], sc[3], sc[4], sc[5] = st[1], st[2], st[3], st[4], st[5], st[6]
        if _scan(<const int64_t *>self.counts.data.as_longlongs, <const int8_t *>self.kinds.data.as_schars,
                 <const int64_t *>self.savings.data.as_longlongs, n, k,
                 self.trigger, self.step, self.keep, sc, &self.pre) != 0:
            return 1  # (out of memory: the state is left for plan_clearing)
        st[0] = n
        st[1], st[2], st[3], st[4], st[5], st[6] = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
        return 1 if sc[1] != cleared else 0


def place_cleared(out, msgs, results, result_kinds, Py_ssize_t start, Py_ssize_t stop, cache):
    """Put the cached cleared copies of the clearable results ``start:stop`` in ``out``; see
    ``_editing_core_py``."""
    cdef Py_ssize_t r, i
    cdef object kind, m, e
    if (type(out) is not list or type(msgs) is not list or type(results) is not list or type(result_kinds) is not list
            or type(cache) is not dict):
        raise TypeError("out, msgs, results and result_kinds must be lists and cache a dict")
    if start < 0 or stop < start or stop > PyList_GET_SIZE(results) or stop > PyList_GET_SIZE(result_kinds):
        raise ValueError(f"need 0 <= start <= stop <= len(results), got {start}, {stop}, {len(results)}")
    for r in range(start, stop):
        kind = <object>PyList_GET_ITEM(result_kinds, r)
        if not (type(kind) is int and kind == 2):
            continue
        i = <object>PyList_GET_ITEM(results, r)
        if i < 0 or i >= PyList_GET_SIZE(msgs) or i >= PyList_GET_SIZE(out):
            raise IndexError(f"results[{r}] = {i} is out of range")
        m = <object>PyList_GET_ITEM(msgs, i)
        e = (<dict>cache).get(PyLong_FromVoidPtr(<void *>m))  # id(m)
        if e is None or type(e) is not tuple or <object>PyWeakref_GetObject((<tuple>e)[0]) is not m:
            return r
        out[i] = (<tuple>e)[1]
    return stop
