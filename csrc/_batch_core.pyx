# cython: language_level=3
"""Compiled batch core: the Python-object passes around the batch planner, as C loops.

``intern_rows`` maps every prompt's references to rows of one table (a C hash table keyed by
the object's address: no int objects, no dict), ``table_records`` reads the records of the
distinct messages, ``need_rows`` collects the rows a planning round asks to count (a mark
array), ``slice_outputs`` builds every output list by copying item pointers. The
specification, with the meaning of every argument, is the pure-Python twin
``jianmu_fast/_batch_core_py.py``; both have the same names, signatures, results and error
messages (proven by tests/test_batch_core.py).
"""

from libc.stdint cimport int64_t, int8_t, uintptr_t
from libc.stdlib cimport calloc, free

import numpy as np

__all__ = ["group_states", "intern_rows", "need_rows", "prefix_prompts", "slice_outputs", "table_records"]


cdef extern from "Python.h":
    ctypedef struct PyObject
    PyObject* PyList_GET_ITEM(PyObject* lst, Py_ssize_t i) nogil
    Py_ssize_t PyList_GET_SIZE(PyObject* lst) nogil
    void PyList_SET_ITEM(PyObject* lst, Py_ssize_t i, PyObject* o) nogil
    object PyList_New(Py_ssize_t n)
    int PyList_Append(object lst, object o) except -1
    void Py_INCREF(PyObject* o) nogil


cdef extern from *:
    """
    static inline void* jf_type_of(PyObject* o) { return (void*)Py_TYPE(o); }
    static inline int jf_is_list(PyObject* o) { return PyList_CheckExact(o); }
    """
    void* jf_type_of(PyObject* o) nogil
    int jf_is_list(PyObject* o) nogil


cdef struct Slot:
    uintptr_t key  # the object's address; 0: empty
    int64_t row


cdef inline uintptr_t _hash(uintptr_t k) noexcept nogil:
    k = (k >> 4) * <uintptr_t>0x9E3779B97F4A7C15ULL
    return k ^ (k >> 31)


cdef Slot* _grow(Slot* table, Py_ssize_t cap, Py_ssize_t new_cap) noexcept nogil:
    """A table of ``new_cap`` slots holding ``table``'s entries (``table`` is freed)."""
    cdef Slot* out = <Slot*>calloc(new_cap, sizeof(Slot))
    cdef Py_ssize_t i
    cdef uintptr_t h, mask = <uintptr_t>(new_cap - 1)
    if out == NULL:
        free(table)
        return NULL
    for i in range(cap):
        if table[i].key:
            h = _hash(table[i].key) & mask
            while out[h].key:
                h = (h + 1) & mask
            out[h] = table[i]
    free(table)
    return out


cdef int64_t _row_of(Slot** tp, Py_ssize_t* capp, uintptr_t key, int64_t next_row) noexcept nogil:
    """The row of ``key`` in the table at ``*tp``, added as ``next_row`` when absent (the
    table doubles once past half full, updating ``*tp`` and ``*capp``); -1 when memory runs
    out (``*tp`` is then freed and NULL)."""
    cdef Slot* table = tp[0]
    cdef uintptr_t mask = <uintptr_t>(capp[0] - 1)
    cdef uintptr_t h = _hash(key) & mask
    while table[h].key and table[h].key != key:
        h = (h + 1) & mask
    if table[h].key:
        return table[h].row
    table[h].key = key
    table[h].row = next_row
    if (next_row + 1) * 2 > capp[0]:
        tp[0] = _grow(table, capp[0], capp[0] * 2)
        capp[0] *= 2
        if tp[0] == NULL:
            return -1
    return next_row


def intern_rows(prompts, cls):
    """See ``jianmu_fast._batch_core_py.intern_rows``."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a type, got {type(cls).__name__}")
    seq = prompts if type(prompts) is list else list(prompts)
    cdef Py_ssize_t n_prompts = len(seq)
    offsets = np.zeros(n_prompts + 1, dtype=np.int64)
    cdef int64_t[::1] off = offsets
    cdef void* want = <void*>cls
    cdef PyObject* msgs
    cdef Py_ssize_t p, j, m, total = 0
    cdef bint ok
    bad = []
    for p in range(n_prompts):
        msgs = PyList_GET_ITEM(<PyObject*>seq, p)
        ok = jf_is_list(msgs)
        if ok:
            m = PyList_GET_SIZE(msgs)
            for j in range(m):
                if jf_type_of(PyList_GET_ITEM(msgs, j)) != want:
                    ok = False
                    break
        if ok:
            total += m
        else:
            bad.append(p)
        off[p + 1] = total
    rows = np.empty(total, dtype=np.int64)
    cdef int64_t[::1] r = rows
    distinct = []
    cdef Py_ssize_t cap = 1024, used = 0, x = 0
    cdef Slot* table = <Slot*>calloc(cap, sizeof(Slot))
    cdef int64_t row
    cdef PyObject* item
    if table == NULL:
        raise MemoryError()
    try:
        for p in range(n_prompts):
            if off[p + 1] == off[p]:
                continue
            msgs = PyList_GET_ITEM(<PyObject*>seq, p)
            m = PyList_GET_SIZE(msgs)
            for j in range(m):
                item = PyList_GET_ITEM(msgs, j)
                row = _row_of(&table, &cap, <uintptr_t>item, used)
                if row < 0:
                    raise MemoryError()
                if row == used:
                    PyList_Append(distinct, <object>item)
                    used += 1
                r[x] = row
                x += 1
    finally:
        free(table)
    return rows, offsets, distinct, bad


def table_records(distinct, dict role_codes):
    """See ``jianmu_fast._batch_core_py.table_records``."""
    seq = distinct if type(distinct) is list else list(distinct)
    cdef Py_ssize_t n = len(seq), i
    roles_a = np.empty(n, dtype=np.int8)
    call_off_a = np.zeros(n + 1, dtype=np.int64)
    result_a = np.full(n, -1, dtype=np.int64)
    cdef int8_t[::1] roles = roles_a
    cdef int64_t[::1] call_off = call_off_a
    cdef int64_t[::1] result_ids = result_a
    cdef int code
    cdef list ids = []
    cdef dict intern = {}
    for i in range(n):
        m = seq[i]
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
    return roles_a, call_off_a, np.array(ids, dtype=np.int64), result_a


cdef int _check_plans(const int64_t[:, ::1] plans, const int64_t[::1] offsets, Py_ssize_t n_prompts,
                      Py_ssize_t n_rows) except -1:
    cdef Py_ssize_t p
    cdef int64_t size
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    if offsets[0] != 0 or offsets[n_prompts] != n_rows:
        raise ValueError(f"offsets must start at 0 and end at {n_rows}")
    if plans.shape[0] != n_prompts or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({n_prompts}, 4), got {(plans.shape[0], plans.shape[1])}")
    for p in range(n_prompts):
        size = offsets[p + 1] - offsets[p]
        if size < 0:
            raise ValueError(f"offsets must be non-decreasing (at index {p + 1})")
        if plans[p, 0] == 1 and not (0 <= plans[p, 2] <= plans[p, 3] <= size):
            raise ValueError(f"prompt {p}: need 0 <= lo <= hi <= {size}, got {plans[p, 2]}, {plans[p, 3]}")
    return 0


def need_rows(const int64_t[::1] rows, const int64_t[::1] offsets, const int64_t[:, ::1] plans,
              const int64_t[::1] counts):
    """See ``jianmu_fast._batch_core_py.need_rows``."""
    cdef Py_ssize_t n_prompts = offsets.shape[0] - 1
    _check_plans(plans, offsets, n_prompts, rows.shape[0])
    cdef Py_ssize_t n_tab = counts.shape[0], p, x, k = 0
    cdef int64_t q
    cdef char* mark = <char*>calloc(n_tab + 1, 1)
    if mark == NULL:
        raise MemoryError()
    try:
        for p in range(n_prompts):
            if plans[p, 0] != 1:
                continue
            for x in range(offsets[p] + plans[p, 2], offsets[p] + plans[p, 3]):
                q = rows[x]
                if q < 0 or q >= n_tab:
                    raise ValueError(f"rows[{x}] must index the records (0..{n_tab - 1}), got {q}")
                if counts[q] < 0 and not mark[q]:
                    mark[q] = 1
                    k += 1
        out = np.empty(k, dtype=np.int64)
        if k:
            _collect(mark, n_tab, out)
    finally:
        free(mark)
    return out


cdef void _collect(const char* mark, Py_ssize_t n_tab, int64_t[::1] out) noexcept:
    cdef Py_ssize_t q, k = 0
    for q in range(n_tab):
        if mark[q]:
            out[k] = q
            k += 1


def slice_outputs(prompts, const int64_t[:, ::1] plans):
    """See ``jianmu_fast._batch_core_py.slice_outputs``."""
    seq = prompts if type(prompts) is list else list(prompts)
    cdef Py_ssize_t n = len(seq), p, j, pos, size
    cdef int64_t k, lo, hi
    cdef PyObject* src
    cdef PyObject* dst
    cdef PyObject* item
    if plans.shape[0] != n or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({n}, 4), got {(plans.shape[0], plans.shape[1])}")
    out = PyList_New(n)
    for p in range(n):  # fill every slot first (None), so `out` is a valid list at any error
        Py_INCREF(<PyObject*>None)
        PyList_SET_ITEM(<PyObject*>out, p, <PyObject*>None)
    for p in range(n):
        src = PyList_GET_ITEM(<PyObject*>seq, p)
        if not jf_is_list(src):
            raise TypeError(f"prompts[{p}] must be a list, got {type(<object>src).__name__}")
        size = PyList_GET_SIZE(src)
        k, lo, hi = plans[p, 1], plans[p, 2], plans[p, 3]
        if not (0 <= k <= lo <= hi <= size):
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {size}, got {k}, {lo}, {hi}")
        new = PyList_New(k + hi - lo)
        dst = <PyObject*>new
        pos = 0
        for j in range(k):
            item = PyList_GET_ITEM(src, j)
            Py_INCREF(item)
            PyList_SET_ITEM(dst, pos, item)
            pos += 1
        for j in range(lo, hi):
            item = PyList_GET_ITEM(src, j)
            Py_INCREF(item)
            PyList_SET_ITEM(dst, pos, item)
            pos += 1
        out[p] = new
    return out


cdef inline void _put(PyObject* dst, Py_ssize_t* pos, PyObject* src, Py_ssize_t n) noexcept:
    cdef Py_ssize_t j
    cdef PyObject* item
    for j in range(n):
        item = PyList_GET_ITEM(src, j)
        Py_INCREF(item)
        PyList_SET_ITEM(dst, pos[0], item)
        pos[0] += 1


def prefix_prompts(head, note_head, tail, hist, base, srcs, const int64_t[::1] members, out):
    """See ``jianmu_fast._batch_core_py.prefix_prompts``."""
    for name, v in (("head", head), ("note_head", note_head), ("tail", tail), ("hist", hist), ("base", base),
                    ("srcs", srcs), ("out", out)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    cdef Py_ssize_t n = len(base), i, j, k, first, pos, lead, x
    if len(hist) != n:
        raise ValueError(f"hist has {len(hist)} items, base has {n}")
    cdef Py_ssize_t m = members.shape[0], n_srcs = len(srcs), n_out = len(out), t = len(tail)
    for x in range(m):
        if not (0 <= members[x] < n_srcs and members[x] < n_out):
            raise ValueError(f"members must index srcs and out, got {members[x]}")
    cdef PyObject* b = <PyObject*>base
    cdef PyObject* h = <PyObject*>hist
    cdef PyObject* src
    cdef PyObject* front
    cdef PyObject* dst
    first = n
    for i in range(n):
        if PyList_GET_ITEM(h, i) != PyList_GET_ITEM(b, i) and not (hist[i] == base[i]):
            first = i
            break
    missed = []
    for x in range(m):
        i = members[x]
        src = PyList_GET_ITEM(<PyObject*>srcs, i)
        k = PyList_GET_SIZE(src) if jf_is_list(src) else -1
        if 0 <= k <= n:
            for j in range(k):
                if PyList_GET_ITEM(src, j) != PyList_GET_ITEM(b, j):
                    k = -1
                    break
        if k < 0 or k > n:
            missed.append(i)
            continue
        front = <PyObject*>note_head if k > first else <PyObject*>head
        lead = PyList_GET_SIZE(front)
        new = PyList_New(lead + k + t)
        dst = <PyObject*>new
        pos = 0
        _put(dst, &pos, front, lead)
        _put(dst, &pos, h, k)
        _put(dst, &pos, <PyObject*>tail, t)
        out[i] = new
    return missed


cdef extern from "Python.h":
    PyObject* PyDict_GetItem(PyObject* d, PyObject* key)
    int PyDict_CheckExact(PyObject* o)


def group_states(states, str key):
    """See ``jianmu_fast._batch_core_py.group_states``."""
    seq = states if type(states) is list else list(states)
    cdef Py_ssize_t n = len(seq), i, g, n_groups = 0, cap = 1024
    cdef PyObject* st
    cdef PyObject* src
    cdef int64_t row
    gid_a = np.full(n, -1, dtype=np.int64)
    cdef int64_t[::1] gid = gid_a
    srcs = [None] * n
    rest = []
    cdef Slot* table = <Slot*>calloc(cap, sizeof(Slot))
    if table == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            st = PyList_GET_ITEM(<PyObject*>seq, i)
            if not PyDict_CheckExact(st):
                rest.append(i)
                continue
            src = PyDict_GetItem(st, <PyObject*>key)
            if src == NULL or not jf_is_list(src):
                rest.append(i)
                continue
            srcs[i] = <object>src
            if PyList_GET_SIZE(src) == 0:
                rest.append(i)
                continue
            row = _row_of(&table, &cap, <uintptr_t>PyList_GET_ITEM(src, 0), n_groups)
            if row < 0:
                raise MemoryError()
            if row == n_groups:
                n_groups += 1
            gid[i] = row
    finally:
        free(table)
    off_a = np.zeros(n_groups + 1, dtype=np.int64)
    tops_a = np.full(n_groups, -1, dtype=np.int64)
    cdef int64_t[::1] off = off_a
    cdef int64_t[::1] tops = tops_a
    cdef Py_ssize_t total = 0
    best_a = np.full(n_groups, -1, dtype=np.int64)
    cdef int64_t[::1] best = best_a
    cdef Py_ssize_t size
    for i in range(n):
        g = gid[i]
        if g < 0:
            continue
        off[g + 1] += 1
        size = PyList_GET_SIZE(<PyObject*>srcs[i])
        if size > best[g]:
            best[g] = size
            tops[g] = i
    for g in range(n_groups):
        off[g + 1] += off[g]
    order_a = np.empty(off[n_groups], dtype=np.int64)
    cdef int64_t[::1] order = order_a
    fill_a = off_a[:n_groups].copy()
    cdef int64_t[::1] fill = fill_a
    for i in range(n):
        g = gid[i]
        if g >= 0:
            order[fill[g]] = i
            fill[g] += 1
    return srcs, order_a, off_a, tops_a, rest
