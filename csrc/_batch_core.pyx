# cython: language_level=3
"""Compiled batch core: the Python-object passes around the batch planner, as C loops.

``intern_rows`` maps every prompt's references to rows of one table (a C hash table keyed by
the object's address: no int objects, no dict), ``pack_rows`` does the same for
``build_batch``'s provided prompts without building them (a group's rows are looked up once
and copied into each member's run), ``table_records`` reads the records of the distinct
messages, ``text_sides`` splits them in two for two counting threads, ``need_rows`` collects the rows a planning round asks to count (a mark array),
``gather_rows`` builds every output list by copying item pointers through the rows. The
specification, with the meaning of every argument, is the pure-Python twin
``jianmu_fast/_batch_core_py.py``; both have the same names, signatures, results and error
messages (proven by tests/test_batch_core.py).
"""

from libc.stdint cimport int64_t, int8_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

import numpy as np

__all__ = ["gather_rows", "group_states", "intern_rows", "need_rows", "pack_rows", "prefix_groups", "table_records",
           "text_sides"]


cdef extern from "Python.h":
    ctypedef struct PyObject
    PyObject* PyList_GET_ITEM(PyObject* lst, Py_ssize_t i) nogil
    Py_ssize_t PyList_GET_SIZE(PyObject* lst) nogil
    void PyList_SET_ITEM(PyObject* lst, Py_ssize_t i, PyObject* o) nogil
    object PyList_New(Py_ssize_t n)
    int PyList_Append(object lst, object o) except -1
    void Py_INCREF(PyObject* o) nogil
    void Py_DECREF(PyObject* o)


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
    seq = list(distinct)  # our own copy: reading an attribute may run code that changes theirs
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


def text_sides(msgs):
    """See ``jianmu_fast._batch_core_py.text_sides``."""
    seq = list(msgs)  # our own copy: reading an attribute may run code that changes theirs
    cdef Py_ssize_t n = len(seq), i, n1 = 0, a = 0, b = 0
    cdef Py_hash_t hv
    side_a = np.zeros(n, dtype=np.int8)
    cdef signed char[::1] side = side_a
    for i in range(n):
        m = seq[i]
        c = m.content
        if type(c) is str and m.tool_calls is None and m.name is None:
            hv = hash(c)
            if hv & 1:
                side[i] = 1
                n1 += 1
    at0_a = np.empty(n - n1, dtype=np.int64)
    at1_a = np.empty(n1, dtype=np.int64)
    cdef int64_t[::1] at0 = at0_a
    cdef int64_t[::1] at1 = at1_a
    side0 = PyList_New(n - n1)
    side1 = PyList_New(n1)
    cdef PyObject* item
    for i in range(n):
        item = PyList_GET_ITEM(<PyObject*>seq, i)
        Py_INCREF(item)
        if side[i]:
            PyList_SET_ITEM(<PyObject*>side1, b, item)
            at1[b] = i
            b += 1
        else:
            PyList_SET_ITEM(<PyObject*>side0, a, item)
            at0[a] = i
            a += 1
    return side0, side1, at0_a, at1_a


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


def gather_rows(distinct, const int64_t[::1] rows, const int64_t[::1] offsets, const int64_t[:, ::1] plans):
    """See ``jianmu_fast._batch_core_py.gather_rows``."""
    if type(distinct) is not list:
        raise TypeError(f"distinct must be a list, got {type(distinct).__name__}")
    cdef Py_ssize_t n = offsets.shape[0] - 1, n_rows = rows.shape[0], p, x, pos
    cdef int64_t k, lo, hi, base, size, r
    cdef PyObject* tab = <PyObject*>distinct
    cdef PyObject* dst
    cdef PyObject* item
    if n < 0:
        raise ValueError("offsets must have at least one entry")
    if offsets[0] != 0 or offsets[n] != n_rows:
        raise ValueError(f"offsets must start at 0 and end at {n_rows}")
    if plans.shape[0] != n or plans.shape[1] != 4:
        raise ValueError(f"plans must have shape ({n}, 4), got {(plans.shape[0], plans.shape[1])}")
    for p in range(n):
        if offsets[p + 1] < offsets[p]:
            raise ValueError(f"offsets must be non-decreasing (at index {p + 1})")
    out = PyList_New(n)
    for p in range(n):  # fill every slot first (None), so `out` is a valid list at any error
        Py_INCREF(<PyObject*>None)
        PyList_SET_ITEM(<PyObject*>out, p, <PyObject*>None)
    for p in range(n):
        base = offsets[p]
        size = offsets[p + 1] - base
        k, lo, hi = plans[p, 1], plans[p, 2], plans[p, 3]
        if not (0 <= k <= lo <= hi <= size):
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {size}, got {k}, {lo}, {hi}")
        new = PyList_New(k + hi - lo)  # its empty slots are NULL: freed cleanly at an error
        dst = <PyObject*>new
        pos = 0
        # the size of `distinct` is read after the allocation above (which may run a collection)
        for x in range(base, base + k):
            r = rows[x]
            if not (0 <= r < PyList_GET_SIZE(tab)):
                raise ValueError(f"rows[{x}] must index distinct (0..{PyList_GET_SIZE(tab) - 1}), got {r}")
            item = PyList_GET_ITEM(tab, r)
            Py_INCREF(item)
            PyList_SET_ITEM(dst, pos, item)
            pos += 1
        for x in range(base + lo, base + hi):
            r = rows[x]
            if not (0 <= r < PyList_GET_SIZE(tab)):
                raise ValueError(f"rows[{x}] must index distinct (0..{PyList_GET_SIZE(tab) - 1}), got {r}")
            item = PyList_GET_ITEM(tab, r)
            Py_INCREF(item)
            PyList_SET_ITEM(dst, pos, item)
            pos += 1
        out[p] = new
    return out


def prefix_groups(hists, srcs, const int64_t[::1] order, const int64_t[::1] group_off, const int64_t[::1] tops):
    """See ``jianmu_fast._batch_core_py.prefix_groups``."""
    for name, v in (("hists", hists), ("srcs", srcs)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    cdef Py_ssize_t n_groups = tops.shape[0], n_srcs = len(srcs), n_order = order.shape[0]
    cdef Py_ssize_t g, x, j, n, k, first
    cdef int64_t a, b, top, i
    if len(hists) != n_groups or group_off.shape[0] != n_groups + 1:
        raise ValueError(f"hists and group_off must have {n_groups} and {n_groups + 1} items, "
                         f"got {len(hists)} and {group_off.shape[0]}")
    gid_a = np.full(n_srcs, -1, dtype=np.int64)
    firsts_a = np.full(n_groups, -1, dtype=np.int64)
    cdef int64_t[::1] gid = gid_a
    cdef int64_t[::1] firsts = firsts_a
    cdef PyObject* src
    cdef PyObject* bp
    cdef PyObject* hp
    for g in range(n_groups):
        a, b, top = group_off[g], group_off[g + 1], tops[g]
        if not (0 <= a <= b <= n_order):
            raise ValueError(f"group_off must be non-decreasing within 0..{n_order}, got {a}, {b} at group {g}")
        if not (0 <= top < n_srcs):
            raise ValueError(f"tops[{g}] must index srcs, got {top}")
        base = srcs[top]
        if type(base) is not list:
            raise TypeError(f"srcs[{top}] (the base of group {g}) must be a list, got {type(base).__name__}")
        hist = hists[g]
        if hist is None:
            for x in range(a, b):
                if not (0 <= order[x] < n_srcs):
                    raise ValueError(f"order[{x}] must index srcs, got {order[x]}")
            continue
        if type(hist) is not list or len(hist) != len(base):
            raise ValueError(f"hists[{g}] must be None or a list as long as its base ({len(base)} items)")
        # the first annotated item: identity first, == (Python code: new references) otherwise
        hp = <PyObject*>hist
        bp = <PyObject*>base
        first = 0
        while first < PyList_GET_SIZE(hp) and first < PyList_GET_SIZE(bp):
            if PyList_GET_ITEM(hp, first) != PyList_GET_ITEM(bp, first) and not (hist[first] == base[first]):
                break
            first += 1
        firsts[g] = first
        if PyList_GET_SIZE(<PyObject*>srcs) != n_srcs or PyList_GET_SIZE(<PyObject*>hists) != n_groups:
            raise RuntimeError("srcs or hists changed size while the history was compared")
        n = PyList_GET_SIZE(bp)
        for x in range(a, b):
            i = order[x]
            if not (0 <= i < n_srcs):
                raise ValueError(f"order[{x}] must index srcs, got {i}")
            src = PyList_GET_ITEM(<PyObject*>srcs, i)
            if not jf_is_list(src):
                continue
            k = PyList_GET_SIZE(src)
            if k > n:
                continue
            for j in range(k):
                if PyList_GET_ITEM(src, j) != PyList_GET_ITEM(bp, j):
                    break
            else:
                gid[i] = g
    return gid_a, firsts_a


cdef struct Table:
    Slot* slots
    Py_ssize_t cap
    PyObject** items  # the distinct objects, in order of first appearance (owned references)
    Py_ssize_t n
    Py_ssize_t items_cap


cdef int _table_init(Table* t) except -1:
    t.cap = 1024
    t.slots = <Slot*>calloc(t.cap, sizeof(Slot))
    t.items_cap = 1024
    t.items = <PyObject**>malloc(t.items_cap * sizeof(PyObject*))
    t.n = 0
    if t.slots == NULL or t.items == NULL:
        raise MemoryError()
    return 0


cdef void _table_free(Table* t):
    cdef Py_ssize_t i
    if t.items != NULL:
        for i in range(t.n):
            Py_DECREF(t.items[i])
        free(t.items)
        t.items = NULL
    free(t.slots)
    t.slots = NULL
    t.n = 0


cdef int64_t _intern(Table* t, PyObject* item) except -1:
    """The row of ``item``, added (a new reference kept) when it has none."""
    cdef int64_t row = _row_of(&t.slots, &t.cap, <uintptr_t>item, t.n)
    cdef PyObject** grown
    if row < 0:
        raise MemoryError()
    if row == t.n:
        if t.n == t.items_cap:
            grown = <PyObject**>malloc(2 * t.items_cap * sizeof(PyObject*))
            if grown == NULL:
                raise MemoryError()
            memcpy(grown, t.items, t.n * sizeof(PyObject*))
            free(t.items)
            t.items = grown
            t.items_cap *= 2
        Py_INCREF(item)
        t.items[t.n] = item
        t.n += 1
    return row


cdef int _all_of(PyObject* lst, Py_ssize_t n, void* want) noexcept:
    """How many leading items of ``lst`` (at most ``n``) are of exact type ``want``."""
    cdef Py_ssize_t j
    for j in range(n):
        if jf_type_of(PyList_GET_ITEM(lst, j)) != want:
            return j
    return n


def pack_rows(head, tail, notes, hists, const int64_t[::1] firsts, srcs, const int64_t[::1] gid, prompts, cls):
    """See ``jianmu_fast._batch_core_py.pack_rows``."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a type, got {type(cls).__name__}")
    for name, v in (("head", head), ("tail", tail), ("notes", notes), ("hists", hists), ("srcs", srcs),
                    ("prompts", prompts)):
        if type(v) is not list:
            raise TypeError(f"{name} must be a list, got {type(v).__name__}")
    cdef Py_ssize_t n_groups = len(hists), n = len(prompts), i, j, m, total = 0, x = 0, h, t, gs
    cdef int64_t g, k
    if len(notes) != n_groups or firsts.shape[0] != n_groups:
        raise ValueError(f"notes and firsts must have one item per group ({n_groups}), "
                         f"got {len(notes)} and {firsts.shape[0]}")
    if len(srcs) != n or gid.shape[0] != n:
        raise ValueError(f"srcs and gid must have one item per prompt ({n}), got {len(srcs)} and {gid.shape[0]}")
    cdef void* want = <void*>cls
    cdef PyObject* hd = <PyObject*>head
    cdef PyObject* tl = <PyObject*>tail
    cdef PyObject* msgs
    cdef PyObject* hist
    cdef PyObject* note
    h = PyList_GET_SIZE(hd)
    t = PyList_GET_SIZE(tl)
    cdef bint fixed_ok = _all_of(hd, h, want) == h and _all_of(tl, t, want) == t, ok
    offsets = np.zeros(n + 1, dtype=np.int64)
    cdef int64_t[::1] off = offsets
    # per group: where its rows start in `grows`, how many of them are looked up so far, and how
    # many leading items of its history are of type cls (-1: not scanned yet)
    gstart_a = np.zeros(n_groups + 1, dtype=np.int64)
    gdone_a = np.zeros(n_groups, dtype=np.int64)
    gok_a = np.full(n_groups, -1, dtype=np.int64)
    cdef int64_t[::1] gstart = gstart_a
    cdef int64_t[::1] gdone = gdone_a
    cdef int64_t[::1] gok = gok_a
    bad = []
    for i in range(n):  # sizes and bad prompts, checked before anything is looked up
        g = gid[i]
        if g < 0:
            msgs = PyList_GET_ITEM(<PyObject*>prompts, i)
            ok = jf_is_list(msgs)
            if ok:
                m = PyList_GET_SIZE(msgs)
                ok = _all_of(msgs, m, want) == m
        else:
            if g >= n_groups:
                raise ValueError(f"gid[{i}] must be below {n_groups}, got {g}")
            hist = PyList_GET_ITEM(<PyObject*>hists, g)
            msgs = PyList_GET_ITEM(<PyObject*>srcs, i)
            if not jf_is_list(hist) or not jf_is_list(msgs) or PyList_GET_SIZE(msgs) > PyList_GET_SIZE(hist):
                raise ValueError(f"state {i}: srcs[{i}] and hists[{g}] must be lists, the first no longer than the second")
            k = PyList_GET_SIZE(msgs)
            if gok[g] < 0:
                gok[g] = _all_of(hist, PyList_GET_SIZE(hist), want)
                gstart[g + 1] = PyList_GET_SIZE(hist)
            note = PyList_GET_ITEM(<PyObject*>notes, g)
            m = h + k + t
            ok = fixed_ok and k <= gok[g]
            if note != <PyObject*>None and k > firsts[g]:
                m += 1
                ok = ok and jf_type_of(note) == want
        if ok:
            total += m
        else:
            bad.append(i)
        off[i + 1] = total
    for g in range(n_groups):
        gstart[g + 1] += gstart[g]
    rows_a = np.empty(total, dtype=np.int64)
    grows_a = np.empty(gstart[n_groups], dtype=np.int64)
    fixed_a = np.empty(h + t, dtype=np.int64)
    cdef int64_t[::1] rows = rows_a
    cdef int64_t[::1] grows = grows_a
    cdef int64_t[::1] fixed = fixed_a
    cdef bint fixed_done = False
    cdef Table tab
    tab.slots = NULL
    tab.items = NULL
    tab.n = 0
    try:
        _table_init(&tab)
        for i in range(n):
            if off[i + 1] == off[i]:
                continue  # bad, or empty: nothing to look up
            g = gid[i]
            if g < 0:
                msgs = PyList_GET_ITEM(<PyObject*>prompts, i)
                if PyList_GET_SIZE(msgs) != off[i + 1] - off[i]:  # pragma: no cover - nothing runs in between
                    raise RuntimeError(f"prompts[{i}] changed size")
                for j in range(PyList_GET_SIZE(msgs)):
                    rows[x] = _intern(&tab, PyList_GET_ITEM(msgs, j))
                    x += 1
                continue
            hist = PyList_GET_ITEM(<PyObject*>hists, g)
            k = PyList_GET_SIZE(PyList_GET_ITEM(<PyObject*>srcs, i))
            note = PyList_GET_ITEM(<PyObject*>notes, g)
            if k > PyList_GET_SIZE(hist) or h + k + t > off[i + 1] - off[i]:  # pragma: no cover - as above
                raise RuntimeError(f"srcs[{i}] or hists[{g}] changed size")
            if not fixed_done:  # the first grouped prompt: head, note, history, tail in order
                for j in range(h):
                    fixed[j] = _intern(&tab, PyList_GET_ITEM(hd, j))
            for j in range(h):
                rows[x] = fixed[j]
                x += 1
            if note != <PyObject*>None and k > firsts[g]:
                rows[x] = _intern(&tab, note)
                x += 1
            gs = gstart[g]
            for j in range(gdone[g], k):
                grows[gs + j] = _intern(&tab, PyList_GET_ITEM(hist, j))
            if k > gdone[g]:
                gdone[g] = k
            if k:
                memcpy(&rows[x], &grows[gs], k * sizeof(int64_t))
                x += k
            if not fixed_done:
                for j in range(t):
                    fixed[h + j] = _intern(&tab, PyList_GET_ITEM(tl, j))
                fixed_done = True
            for j in range(t):
                rows[x] = fixed[h + j]
                x += 1
        distinct = PyList_New(tab.n)
        for j in range(tab.n):  # the table's references move into the list
            PyList_SET_ITEM(<PyObject*>distinct, j, tab.items[j])
        tab.n = 0
    finally:
        _table_free(&tab)
    return rows_a, offsets, distinct, bad


cdef extern from "Python.h":
    PyObject* PyDict_GetItem(PyObject* d, PyObject* key)
    int PyDict_CheckExact(PyObject* o)


def group_states(states, str key):
    """See ``jianmu_fast._batch_core_py.group_states``."""
    seq = list(states)  # our own copy: a key comparison may run code that changes theirs
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
