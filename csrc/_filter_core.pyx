# cython: language_level=3
"""Compiled filter core: which messages of a prompt to keep under a limit.

Arithmetic only, over contiguous int64 memoryviews. The specification, with the meaning of
every argument, is the pure-Python twin ``jianmu_fast/_filter_core_py.py``; both have the
same names, signatures, results and error messages (proven by tests/test_filter_core.py).
"""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport Py_INCREF
from cpython.object cimport PyObject, PyObject_RichCompareBool, Py_EQ, Py_SIZE
from cpython cimport array as carray
from libc.stdint cimport int64_t, int8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
    bint PyObject_GC_IsTracked(object op)

import weakref
from hashlib import sha256 as _sha256
from itertools import islice

import numpy as np

__all__ = ["KNOWN_MAX", "MAX_VALUE", "ROLE_CODES", "Records", "counts_of", "plan_window", "plan_windows", "sanitize_window", "sanitize_windows", "select_window", "select_windows", "summarizing_trim"]

ROLE_CODES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}

MAX_VALUE = 1 << 53
#: the most new messages whose counts ``Records.window`` takes from ``known``
KNOWN_MAX = 16
cdef enum:
    C_KNOWN_MAX = 16
cdef int64_t C_MAX = (<int64_t>1) << 53
cdef int64_t SAT = (<int64_t>1) << 62  # sums saturate here: above any budget; SAT + C_MAX fits in int64


cdef str _where(Py_ssize_t prompt):
    return "" if prompt < 0 else f"prompt {prompt}: "


cdef int _validate(const int64_t[::1] counts, const int64_t[::1] unit_starts,
                   Py_ssize_t n_pinned, int64_t budget, int64_t chunk, Py_ssize_t prompt) except -1:
    """Check one prompt's arguments; ``prompt`` is its index in a batch, or -1 (no prefix)."""
    cdef Py_ssize_t n = counts.shape[0]
    cdef Py_ssize_t n_units = unit_starts.shape[0]
    cdef Py_ssize_t i, u
    if n_pinned < 0 or n_pinned > n:
        raise ValueError(f"{_where(prompt)}n_pinned must be between 0 and len(counts) ({n}), got {n_pinned}")
    if budget < 0 or budget > C_MAX:
        raise ValueError(f"{_where(prompt)}budget must be between 0 and 2**53, got {budget}")
    if chunk < 0 or chunk > C_MAX:
        raise ValueError(f"{_where(prompt)}chunk must be between 0 and 2**53, got {chunk}")
    for i in range(n):
        if counts[i] < 0 or counts[i] > C_MAX:
            raise ValueError(f"{_where(prompt)}counts[{i}] must be between 0 and 2**53, got {counts[i]}")
    if n == n_pinned:
        if n_units != 0:
            raise ValueError(f"{_where(prompt)}unit_starts must be empty when every message is pinned")
        return 0
    if n_units == 0 or unit_starts[0] != n_pinned:
        first = unit_starts[0] if n_units else None
        raise ValueError(f"{_where(prompt)}unit_starts[0] must equal n_pinned ({n_pinned}), got {first}")
    for u in range(1, n_units):
        if unit_starts[u] <= unit_starts[u - 1]:
            raise ValueError(f"{_where(prompt)}unit_starts must be strictly increasing (at index {u})")
    if unit_starts[n_units - 1] >= n:
        raise ValueError(f"{_where(prompt)}unit_starts[{n_units - 1}] must be below len(counts) ({n})")
    return 0


cdef inline int64_t _unit_cost(const int64_t* counts, const int64_t* starts,
                               Py_ssize_t n_units, Py_ssize_t n, Py_ssize_t u) noexcept nogil:
    cdef Py_ssize_t end = starts[u + 1] if u + 1 < n_units else n
    cdef Py_ssize_t i
    cdef int64_t s = 0
    for i in range(starts[u], end):
        s += counts[i]
        if s > SAT:
            s = SAT
    return s


cdef inline Py_ssize_t _keep_newest(const int64_t* counts, const int64_t* starts, Py_ssize_t n_units,
                                    Py_ssize_t n, int64_t avail) noexcept nogil:
    """The first unit of the longest run of newest units costing at most ``avail``."""
    cdef Py_ssize_t k = n_units
    cdef int64_t kept = 0, cost
    while k > 0:
        cost = _unit_cost(counts, starts, n_units, n, k - 1)
        if kept + cost > avail:
            break
        kept += cost
        k -= 1
    return k


cdef void _select(const int64_t* counts, Py_ssize_t n, const int64_t* starts, Py_ssize_t n_units,
                  Py_ssize_t n_pinned, int64_t budget, bint from_start, int64_t chunk,
                  int64_t* out_lo, int64_t* out_hi) noexcept nogil:
    cdef int64_t pinned = 0, avail, kept = 0, cost, x_mod = 0
    cdef Py_ssize_t i, k, j, lo, lo_chunk, last_start
    for i in range(n_pinned):
        pinned += counts[i]
        if pinned > SAT:
            pinned = SAT
    if n_units == 0 or pinned > budget:
        if from_start:
            out_lo[0] = n
            out_hi[0] = n
        else:
            out_lo[0] = n_pinned
            out_hi[0] = n_pinned
        return
    avail = budget - pinned

    if not from_start:
        k = 0
        while k < n_units:
            cost = _unit_cost(counts, starts, n_units, n, k)
            if kept + cost > avail:
                break
            kept += cost
            k += 1
        out_lo[0] = n_pinned
        out_hi[0] = starts[k] if k < n_units else n
        return

    k = _keep_newest(counts, starts, n_units, n, avail)
    lo = starts[k] if k < n_units else n
    out_hi[0] = n
    if chunk == 0 or k == 0:
        out_lo[0] = lo
        return
    # see the twin: keep the newest units within avail - ((-(total - avail)) mod chunk)
    for i in range(n_pinned, n):
        x_mod += counts[i] % chunk
        if x_mod >= chunk:
            x_mod -= chunk
    x_mod = ((x_mod - avail % chunk) % chunk + chunk) % chunk
    j = _keep_newest(counts, starts, n_units, n, avail - (chunk - x_mod) % chunk)
    lo_chunk = starts[j] if j < n_units else n
    last_start = starts[n_units - 1]
    if lo_chunk > last_start:
        lo_chunk = last_start
    out_lo[0] = lo if lo > lo_chunk else lo_chunk


def select_window(const int64_t[::1] counts, const int64_t[::1] unit_starts, Py_ssize_t n_pinned,
                  int64_t budget, bint from_start, int64_t chunk=0):
    """Decide which messages of one prompt to keep; see ``jianmu_fast._filter_core_py``."""
    cdef int64_t lo = 0, hi = 0
    _validate(counts, unit_starts, n_pinned, budget, chunk, -1)
    with nogil:
        _select(&counts[0] if counts.shape[0] else NULL, counts.shape[0],
                &unit_starts[0] if unit_starts.shape[0] else NULL, unit_starts.shape[0],
                n_pinned, budget, from_start, chunk, &lo, &hi)
    return (lo, hi)


def select_windows(const int64_t[::1] counts, const int64_t[::1] offsets,
                   const int64_t[::1] unit_starts, const int64_t[::1] unit_offsets,
                   const int64_t[::1] n_pinned, const int64_t[::1] budgets,
                   bint from_start, int64_t chunk=0):
    """Decide many prompts at once over CSR-packed arrays; see ``jianmu_fast._filter_core_py``."""
    cdef Py_ssize_t n_prompts = n_pinned.shape[0]
    cdef Py_ssize_t p, c0, c1, u0, u1
    if budgets.shape[0] != n_prompts:
        raise ValueError(f"budgets has {budgets.shape[0]} entries, n_pinned has {n_prompts}")
    for name, off, size in (("offsets", offsets, counts.shape[0]),
                            ("unit_offsets", unit_offsets, unit_starts.shape[0])):
        _check_offsets(name, off, size, n_prompts)
    if chunk < 0 or chunk > C_MAX:
        raise ValueError(f"chunk must be between 0 and 2**53, got {chunk}")
    lo_arr = np.empty(n_prompts, dtype=np.int64)
    hi_arr = np.empty(n_prompts, dtype=np.int64)
    cdef int64_t[::1] lo = lo_arr
    cdef int64_t[::1] hi = hi_arr
    for p in range(n_prompts):
        _validate(counts[offsets[p]:offsets[p + 1]], unit_starts[unit_offsets[p]:unit_offsets[p + 1]],
                  n_pinned[p], budgets[p], chunk, p)
    cdef const int64_t* cbase = &counts[0] if counts.shape[0] else NULL
    cdef const int64_t* ubase = &unit_starts[0] if unit_starts.shape[0] else NULL
    with nogil:
        for p in range(n_prompts):
            c0 = offsets[p]
            c1 = offsets[p + 1]
            u0 = unit_offsets[p]
            u1 = unit_offsets[p + 1]
            _select(cbase + c0 if cbase != NULL else NULL, c1 - c0,
                    ubase + u0 if ubase != NULL else NULL, u1 - u0,
                    n_pinned[p], budgets[p], from_start, chunk, &lo[p], &hi[p])
    return lo_arr, hi_arr


cdef int _check_offsets(str name, const int64_t[::1] off, Py_ssize_t size, Py_ssize_t n_prompts) except -1:
    cdef Py_ssize_t p
    if off.shape[0] != n_prompts + 1:
        raise ValueError(f"{name} must have len(n_pinned) + 1 = {n_prompts + 1} entries, got {off.shape[0]}")
    if off[0] != 0 or off[n_prompts] != size:
        raise ValueError(f"{name} must start at 0 and end at {size}")
    for p in range(n_prompts):
        if off[p + 1] < off[p]:
            raise ValueError(f"{name} must be non-decreasing (at index {p + 1})")
    return 0


# -- per-prompt plans over message records (issue 13); see the twin ---------------------------

cdef inline Py_ssize_t _rw(const int64_t* rows, Py_ssize_t i) noexcept nogil:
    return rows[i] if rows != NULL else i


cdef inline Py_ssize_t _ustart_r(const int64_t* rows, const int8_t* r, Py_ssize_t i, Py_ssize_t n_pinned) noexcept nogil:
    while i > n_pinned and r[_rw(rows, i)] == 3:
        i -= 1
    return i


cdef void _plan(const int64_t* rows, Py_ssize_t n, const int8_t* r, const int64_t* c, int64_t pinned_mask,
                int64_t budget, bint from_start, int64_t chunk, bint pinned_free, int64_t* out) noexcept nogil:
    """out = (status, n_pinned, lo, hi); status 3: out of memory."""
    cdef Py_ssize_t i, n_pinned = 0, end, s, lo, walked, n_units
    cdef int64_t pinned = 0, avail, kept = 0, cost, per, step, v
    cdef int64_t* st
    cdef int64_t* sub
    out[0] = 0
    while n_pinned < n and (pinned_mask >> r[_rw(rows, n_pinned)]) & 1:
        n_pinned += 1
    out[1] = n_pinned
    if not pinned_free:
        for i in range(n_pinned):
            v = c[_rw(rows, i)]
            if v < 0:
                out[0] = 1
                out[2] = 0
                out[3] = n_pinned
                return
            pinned += v
            if pinned > SAT:
                pinned = SAT
    if n_pinned == n or pinned > budget:
        out[2] = n if from_start else n_pinned
        out[3] = out[2]
        return
    avail = budget - pinned
    if not (from_start and chunk == 0):
        for i in range(n_pinned, n):
            if c[_rw(rows, i)] < 0:
                out[0] = 1
                out[2] = n_pinned
                out[3] = n
                return
        st = <int64_t*> malloc((n - n_pinned) * sizeof(int64_t))
        sub = <int64_t*> malloc(n * sizeof(int64_t))
        if st == NULL or sub == NULL:
            free(st)
            free(sub)
            out[0] = 3
            return
        n_units = 0
        for i in range(n):
            sub[i] = 0 if i < n_pinned else c[_rw(rows, i)]
            if i == n_pinned or (i > n_pinned and r[_rw(rows, i)] != 3):
                st[n_units] = i
                n_units += 1
        _select(sub, n, st, n_units, n_pinned, avail, from_start, chunk, &out[2], &out[3])
        free(st)
        free(sub)
        return
    end = n
    while end > n_pinned:
        s = _ustart_r(rows, r, end - 1, n_pinned)
        cost = 0
        for i in range(s, end):
            v = c[_rw(rows, i)]
            if v < 0:
                walked = n - end
                if walked == 0:
                    step = 32
                else:
                    per = kept // walked if kept // walked > 1 else 1
                    step = (avail - kept) // per * 5 // 4 + 2
                    if walked // 2 > step:
                        step = walked // 2
                lo = end - step if end - step > n_pinned else n_pinned
                lo = _ustart_r(rows, r, lo, n_pinned)
                out[0] = 1
                out[2] = lo if lo < s else s
                out[3] = end
                return
            cost += v
            if cost > SAT:
                cost = SAT
        if kept + cost > avail:
            break
        kept += cost
        end = s
    out[2] = end
    out[3] = n


cdef int _check_records(const int8_t[::1] roles, const int64_t[::1] counts) except -1:
    cdef Py_ssize_t i
    if counts.shape[0] != roles.shape[0]:
        raise ValueError(f"counts has {counts.shape[0]} entries, roles has {roles.shape[0]}")
    for i in range(roles.shape[0]):
        if counts[i] < -1 or counts[i] > C_MAX:
            raise ValueError(f"counts[{i}] must be -1 (not counted) or between 0 and 2**53, got {counts[i]}")
        if roles[i] < 0 or roles[i] > 3:
            raise ValueError(f"roles[{i}] must be 0..3, got {roles[i]}")
    return 0


cdef int _check_plan_args(int64_t budget, int64_t chunk) except -1:
    if budget < 0 or budget > C_MAX:
        raise ValueError(f"budget must be between 0 and 2**53, got {budget}")
    if chunk < 0 or chunk > C_MAX:
        raise ValueError(f"chunk must be between 0 and 2**53, got {chunk}")
    return 0


def plan_window(const int8_t[::1] roles, const int64_t[::1] counts, int64_t pinned_mask, int64_t budget,
                bint from_start, int64_t chunk=0, bint pinned_free=False):
    """Plan one prompt from its records; see ``jianmu_fast._filter_core_py.plan_window``."""
    cdef int64_t out[4]
    _check_records(roles, counts)
    _check_plan_args(budget, chunk)
    cdef Py_ssize_t n = roles.shape[0]
    if n == 0:
        return (0, 0, 0, 0)
    with nogil:
        _plan(NULL, n, &roles[0], &counts[0], pinned_mask, budget, from_start, chunk, pinned_free, out)
    if out[0] == 3:
        raise MemoryError()
    return (out[0], out[1], out[2], out[3])


def plan_windows(const int64_t[::1] rows, const int64_t[::1] offsets, const int8_t[::1] roles,
                 const int64_t[::1] counts, int64_t pinned_mask, int64_t budget, bint from_start,
                 int64_t chunk=0, bint pinned_free=False):
    """``plan_window`` for many prompts; see ``jianmu_fast._filter_core_py.plan_windows``."""
    cdef Py_ssize_t n_prompts = offsets.shape[0] - 1
    cdef Py_ssize_t p, i, n_tab = roles.shape[0]
    _check_records(roles, counts)
    _check_plan_args(budget, chunk)
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    _check_offsets("offsets", offsets, rows.shape[0], n_prompts)
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= n_tab:
            raise ValueError(f"rows[{i}] must index the records (0..{n_tab - 1}), got {rows[i]}")
    plan_arr = np.zeros((n_prompts, 4), dtype=np.int64)
    cdef int64_t[:, ::1] plan = plan_arr
    cdef const int64_t* rb = &rows[0] if rows.shape[0] else NULL
    cdef const int8_t* rr = &roles[0] if n_tab else NULL
    cdef const int64_t* cc = &counts[0] if n_tab else NULL
    cdef bint oom = False
    with nogil:
        for p in range(n_prompts):
            if offsets[p + 1] > offsets[p]:
                _plan(rb + offsets[p], offsets[p + 1] - offsets[p], rr, cc, pinned_mask, budget, from_start,
                      chunk, pinned_free, &plan[p, 0])
                if plan[p, 0] == 3:
                    oom = True
    if oom:
        raise MemoryError()
    return plan_arr


def sanitize_window(const int8_t[::1] roles, const int64_t[::1] call_off, const int64_t[::1] call_ids,
                    const int64_t[::1] result_ids, Py_ssize_t n_pinned, Py_ssize_t lo, Py_ssize_t hi):
    """The sanitize decision over ``[:n_pinned] + [lo:hi]``; see the twin."""
    cdef Py_ssize_t n = roles.shape[0]
    if call_off.shape[0] != n + 1 or result_ids.shape[0] != n:
        raise ValueError(f"call_off needs {n + 1} entries and result_ids {n}, got {call_off.shape[0]} and {result_ids.shape[0]}")
    if not (0 <= n_pinned <= lo <= hi <= n):
        raise ValueError(f"need 0 <= n_pinned <= lo <= hi <= {n}, got {n_pinned}, {lo}, {hi}")
    cdef Py_ssize_t m = n_pinned + (hi - lo)
    cdef Py_ssize_t i = 0, j, p, q, x, y, nc, a, b
    cdef bint pending = False, ok, found
    cdef int64_t cid
    drops = None
    while i < m:
        p = i if i < n_pinned else lo + (i - n_pinned)
        nc = call_off[p + 1] - call_off[p]
        if roles[p] == 3 or (roles[p] == 2 and nc > 0):
            j = i + 1
            while j < m and roles[j if j < n_pinned else lo + (j - n_pinned)] == 3:
                j += 1
            if roles[p] == 3:
                ok = False
            else:
                a = call_off[p]
                b = call_off[p + 1]
                for x in range(a, b):
                    if call_ids[x] == -1:
                        return (2, [])
                for y in range(i + 1, j):
                    q = y if y < n_pinned else lo + (y - n_pinned)
                    if result_ids[q] == -1:
                        return (2, [])
                ok = (j - i - 1) == nc
                if ok:  # distinct call ids, and every one answered by some result, and vice versa
                    for x in range(a, b):
                        for y in range(x + 1, b):
                            if call_ids[y] == call_ids[x]:
                                ok = False
                                break
                        if not ok:
                            break
                if ok:
                    for y in range(i + 1, j):
                        q = y if y < n_pinned else lo + (y - n_pinned)
                        cid = result_ids[q]
                        found = False
                        for x in range(a, b):
                            if call_ids[x] == cid:
                                found = True
                                break
                        if not found:
                            ok = False
                            break
                if ok:  # results distinct too (k == nc and every result matches a distinct call)
                    for y in range(i + 1, j):
                        q = y if y < n_pinned else lo + (y - n_pinned)
                        for x in range(y + 1, j):
                            if result_ids[x if x < n_pinned else lo + (x - n_pinned)] == result_ids[q]:
                                ok = False
                                break
                        if not ok:
                            break
            pending = not ok
            if not ok:
                if drops is None:
                    drops = []
                drops.append((i, j))
            i = j
            continue
        if pending and roles[p] != 0:
            pending = False
        i += 1
    if pending:
        return (2, [])
    return (1, drops) if drops is not None else (0, [])


cdef inline Py_ssize_t _pos(const int64_t* rows, Py_ssize_t i, Py_ssize_t n_pinned, Py_ssize_t lo) noexcept nogil:
    return _rw(rows, i if i < n_pinned else lo + (i - n_pinned))


cdef enum:
    S_START = 1  # (Records.sflag bits)
    S_NEG = 2
    S_BAD = 4
    S_PA = 8


cdef int _realloc8(int8_t** a, Py_ssize_t cap) noexcept:
    cdef int8_t* q = <int8_t*>realloc(a[0], (cap + 1) * sizeof(int8_t))
    if q == NULL:
        return -1
    a[0] = q
    return 0


cdef int _realloc64(int64_t** a, Py_ssize_t cap) noexcept:
    cdef int64_t* q = <int64_t*>realloc(a[0], (cap + 1) * sizeof(int64_t))
    if q == NULL:
        return -1
    a[0] = q
    return 0


cdef int _sanitize_status(const int64_t* rows, const int8_t* r, const int64_t* coff, const int64_t* cids,
                          const int64_t* rids, Py_ssize_t n_pinned, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """0 valid, 1 broken historical units to drop, 2 the Python sanitizer decides (see the twin)."""
    cdef Py_ssize_t m = n_pinned + (hi - lo)
    cdef Py_ssize_t i = 0, j, p, x, y, a, b, nc
    cdef bint pending = False, ok, found, dropped = False
    cdef int64_t rid
    while i < m:
        p = _pos(rows, i, n_pinned, lo)
        nc = coff[p + 1] - coff[p]
        if r[p] == 3 or (r[p] == 2 and nc > 0):
            j = i + 1
            while j < m and r[_pos(rows, j, n_pinned, lo)] == 3:
                j += 1
            ok = False
            if r[p] == 2:
                a = coff[p]
                b = coff[p + 1]
                for x in range(a, b):
                    if cids[x] == -1:
                        return 2
                for y in range(i + 1, j):
                    if rids[_pos(rows, y, n_pinned, lo)] == -1:
                        return 2
                ok = (j - i - 1) == nc
                x = a
                while ok and x < b:
                    for y in range(x + 1, b):
                        if cids[y] == cids[x]:
                            ok = False
                            break
                    x += 1
                y = i + 1
                while ok and y < j:
                    rid = rids[_pos(rows, y, n_pinned, lo)]
                    found = False
                    for x in range(a, b):
                        if cids[x] == rid:
                            found = True
                            break
                    if not found:
                        ok = False
                    for x in range(y + 1, j):
                        if rids[_pos(rows, x, n_pinned, lo)] == rid:
                            ok = False
                            break
                    y += 1
            pending = not ok
            if not ok:
                dropped = True
            i = j
            continue
        if pending and r[p] != 0:
            pending = False
        i += 1
    if pending:
        return 2
    return 1 if dropped else 0


def sanitize_windows(const int64_t[::1] rows, const int64_t[::1] offsets, const int8_t[::1] roles,
                     const int64_t[::1] call_off, const int64_t[::1] call_ids, const int64_t[::1] result_ids,
                     const int64_t[::1] n_pinned, const int64_t[::1] lo, const int64_t[::1] hi):
    """The sanitize status of many planned prompts; see ``jianmu_fast._filter_core_py.sanitize_windows``."""
    cdef Py_ssize_t n_prompts = offsets.shape[0] - 1
    cdef Py_ssize_t p, i, n_tab = roles.shape[0], size
    if n_prompts < 0:
        raise ValueError("offsets must have at least one entry")
    _check_offsets("offsets", offsets, rows.shape[0], n_prompts)
    if call_off.shape[0] != n_tab + 1 or result_ids.shape[0] != n_tab:
        raise ValueError(f"call_off needs {n_tab + 1} entries and result_ids {n_tab}, got {call_off.shape[0]} and {result_ids.shape[0]}")
    if n_pinned.shape[0] != n_prompts or lo.shape[0] != n_prompts or hi.shape[0] != n_prompts:
        raise ValueError(f"n_pinned, lo and hi need {n_prompts} entries each")
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= n_tab:
            raise ValueError(f"rows[{i}] must index the records (0..{n_tab - 1}), got {rows[i]}")
    for i in range(n_tab):
        if call_off[i + 1] < call_off[i] or call_off[i] < 0 or call_off[i + 1] > call_ids.shape[0]:
            raise ValueError(f"call_off must be non-decreasing offsets into call_ids (at index {i + 1})")
    for p in range(n_prompts):
        size = offsets[p + 1] - offsets[p]
        if not (0 <= n_pinned[p] <= lo[p] <= hi[p] <= size):
            raise ValueError(f"prompt {p}: need 0 <= n_pinned <= lo <= hi <= {size}, got {n_pinned[p]}, {lo[p]}, {hi[p]}")
    status_arr = np.zeros(n_prompts, dtype=np.int64)
    cdef int64_t[::1] status = status_arr
    if n_tab == 0:
        return status_arr
    cdef const int64_t* cid = &call_ids[0] if call_ids.shape[0] else NULL
    with nogil:
        for p in range(n_prompts):
            if offsets[p + 1] > offsets[p]:
                status[p] = _sanitize_status(&rows[offsets[p]], &roles[0], &call_off[0], cid, &result_ids[0],
                                             n_pinned[p], lo[p], hi[p])
    return status_arr


# -- the records of one prompt that grows in place (the agent loop); see the twin ---------------

cdef extern from "Python.h":
    ctypedef struct PyListObject:
        PyObject** ob_item


cdef extern from "Python.h":
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    object PyLong_FromVoidPtr(void* p)


cdef PyObject* _value_of(dict values, PyObject* m) except? NULL:
    """``values[id(m)]`` (borrowed), a bytes; NULL when there is none."""
    cdef PyObject* v = PyDict_GetItemWithError(values, PyLong_FromVoidPtr(<void*>m))
    if v != NULL and type(<object>v) is not bytes:
        raise TypeError(f"values: expected bytes, got {type(<object>v).__name__}")
    return v


cdef bint _unequal(object x, object y) noexcept:
    """True when ``x`` and ``y`` cannot be equal Messages: their ``content`` are different
    strs (checked before the costlier ``==``); see the twin."""
    try:
        cx = x.content
        cy = y.content
    except Exception:
        return False
    if type(cx) is not str or type(cy) is not str:
        return False
    return not (PyUnicode_GET_LENGTH(cx) == PyUnicode_GET_LENGTH(cy) and cx == cy)


cdef inline Py_ssize_t _lower_bound(const int64_t* ps, Py_ssize_t lo, Py_ssize_t hi, int64_t t) noexcept nogil:
    """The first ``i`` in ``[lo, hi]`` with ``ps[i] >= t`` (``ps`` non-decreasing, ``ps[hi] >= t``)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if ps[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef extern from "Python.h":
    PyObject* _list_slice "PyList_GetSlice"(object, Py_ssize_t, Py_ssize_t) except NULL
    void _decref "Py_DECREF"(PyObject*)


cdef list _window_list(list msgs, Py_ssize_t n_pinned, Py_ssize_t gap, Py_ssize_t lo, Py_ssize_t hi):
    """``msgs[:n_pinned] + [None] * gap + msgs[lo:hi]`` (``0 <= n_pinned <= lo <= hi <=
    len(msgs)``, ``gap`` 0 or 1; the gap slot holds ``msgs[lo - 1]`` until the caller sets it,
    or None). Made as a slice of ``msgs`` ending at ``hi`` whose first ``n_pinned`` items are
    then replaced: a slice's item array comes from ``PyMem_Malloc`` (a long prompt's, from the
    C allocator's per-thread cache, where the last turn's freed one waits), where
    ``PyList_New``'s comes from ``calloc``, which takes the slow path of the allocator and clears
    memory that is filled at once anyway."""
    cdef Py_ssize_t i, start = lo - n_pinned - gap
    cdef PyObject* old
    cdef list result
    if start < 0:
        result = PyList_New(n_pinned + gap + hi - lo)
        for i in range(n_pinned):
            x = <object>PyList_GET_ITEM(msgs, i)
            Py_INCREF(x)
            PyList_SET_ITEM(result, i, x)
        if gap:
            Py_INCREF(None)
            PyList_SET_ITEM(result, n_pinned, None)
        for i in range(lo, hi):
            x = <object>PyList_GET_ITEM(msgs, i)
            Py_INCREF(x)
            PyList_SET_ITEM(result, n_pinned + gap + i - lo, x)
        return result
    result = <list>_list_slice(msgs, start, hi)
    _decref(<PyObject*>result)  # (the cast above took a reference of its own)
    if start != 0:
        for i in range(n_pinned):
            old = PyList_GET_ITEM(result, i)
            x = <object>PyList_GET_ITEM(msgs, i)
            Py_INCREF(x)
            PyList_SET_ITEM(result, i, x)
            _decref(old)
    return result


cdef class Records:
    """The records of one prompt, extended in place as the prompt grows; see
    ``jianmu_fast._filter_core_py.Records`` (the specification). Besides the records it keeps
    prefix sums of the counts over the counted tail, so a plan is a binary search."""

    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t version
    cdef Py_ssize_t cap, ids_cap, n_ids, c0, pin_n, common
    cdef int64_t pin_mask
    cdef bint dirty, ps_ok
    cdef Py_ssize_t last_lo
    cdef object _ra, _ca, _rida, _offa, _idsa, _psa
    cdef int8_t* r
    cdef int64_t* c
    cdef int64_t* rid
    cdef int64_t* off
    cdef int64_t* ids
    cdef int64_t* ps
    cdef list _msgs
    cdef list _patch
    cdef list _patch_counts  # the hint's counts of the messages of ``_patch`` (or None)
    cdef Py_ssize_t ps_from  # dirty after a patch only: the prefix sums are valid up to here
    cdef dict _intern
    cdef object _type
    cdef tuple _hint
    # the sanitize scan of all records (``_scan_to``), so that ``window``'s check of a prompt
    # ``[:n_pinned] + [lo:hi]`` costs the new records, not the prompt (``_sanitized``): per
    # position ``p``, ``sflag[p]`` says whether a unit (or lone message) of the scan starts there
    # and what it is (the ``S_*`` bits), ``sneg[p]`` / ``sbad[p]`` count the units starting before
    # ``p`` with a missing id / not valid, ``slast[p]`` is the start of the last one before ``p``
    # that sets the scan's pending state (-1: none); valid up to ``s_at``, the start of the last
    # unit scanned (which more records may lengthen), and at ``[s_at, s_end]``
    cdef int8_t* sflag
    cdef int64_t* sneg
    cdef int64_t* sbad
    cdef int64_t* slast
    cdef Py_ssize_t s_cap, s_at, s_end

    def __init__(self, message_type=object):
        self._type = message_type

    def __cinit__(self, *args, **kwargs):
        self._type = object
        self._msgs = []
        self._intern = {}
        self.n = 0
        self.version = 0
        self.n_ids = 0
        self.cap = 0
        self.ids_cap = 0
        self.c0 = 0
        self.pin_n = 0
        self.common = 0
        self.pin_mask = -1
        self.dirty = False
        self.ps_ok = True
        self.ps_from = -1
        self.sflag = NULL
        self.sneg = self.sbad = self.slast = NULL
        self.s_cap = self.s_at = self.s_end = 0
        self._grow(16)
        self._grow_ids(16, 0)
        self.off[0] = 0
        self.ps[0] = 0

    def __dealloc__(self):
        free(self.sflag)
        free(self.sneg)
        free(self.sbad)
        free(self.slast)

    cdef int _grow(self, Py_ssize_t need) except -1:
        if need <= self.cap:
            return 0
        cdef Py_ssize_t cap = 2 * self.cap
        if cap < need:
            cap = need
        cdef Py_ssize_t n = self.n
        ra = np.empty(cap, dtype=np.int8)
        ca = np.empty(cap, dtype=np.int64)
        rida = np.empty(cap, dtype=np.int64)
        offa = np.empty(cap + 1, dtype=np.int64)
        psa = np.empty(cap + 1, dtype=np.int64)
        if self._ra is not None:
            ra[:n] = self._ra[:n]
            ca[:n] = self._ca[:n]
            rida[:n] = self._rida[:n]
            offa[:n + 1] = self._offa[:n + 1]
            psa[:n + 1] = self._psa[:n + 1]
        cdef int8_t[::1] r8 = ra
        cdef int64_t[::1] c64 = ca
        cdef int64_t[::1] rid64 = rida
        cdef int64_t[::1] off64 = offa
        cdef int64_t[::1] ps64 = psa
        self._ra, self._ca, self._rida, self._offa, self._psa = ra, ca, rida, offa, psa
        self.r, self.c, self.rid, self.off, self.ps = &r8[0], &c64[0], &rid64[0], &off64[0], &ps64[0]
        self.cap = cap
        return 0

    cdef int _grow_ids(self, Py_ssize_t need, Py_ssize_t have) except -1:
        """Room for ``need`` call ids, ``have`` of them written."""
        if need <= self.ids_cap:
            return 0
        cdef Py_ssize_t cap = 2 * self.ids_cap
        if cap < need:
            cap = need
        idsa = np.empty(cap, dtype=np.int64)
        if self._idsa is not None:
            idsa[:have] = self._idsa[:have]
        cdef int64_t[::1] v = idsa
        self._idsa = idsa
        self.ids = &v[0]
        self.ids_cap = cap
        return 0

    cdef int64_t _interned(self, key) except -2:
        if not key:
            return -1
        v = self._intern.get(key)
        if v is None:
            v = len(self._intern)
            self._intern[key] = v
        return v

    # -- views (copies) ---------------------------------------------------------------------

    @property
    def msgs(self):
        return list(self._msgs)

    @property
    def roles(self):
        return self._ra[:self.n].copy()

    @property
    def counts(self):
        return self._ca[:self.n].copy()

    @property
    def call_off(self):
        return self._offa[:self.n + 1].copy()

    @property
    def call_ids(self):
        return self._idsa[:self.n_ids].copy()

    @property
    def result_ids(self):
        return self._rida[:self.n].copy()

    @property
    def interned(self):
        return len(self._intern)

    # -- growth -----------------------------------------------------------------------------

    cdef bint _patchable(self, object m, Py_ssize_t i) noexcept:
        """Whether ``m`` can take record ``i`` with only its count changed; see the twin."""
        cdef Py_ssize_t j, a, nc
        try:
            if type(m) is not self._type:
                return False
            code = ROLE_CODES.get(m.role)
            if code is None or <int>code != self.r[i]:
                return False
            if code == 3:
                key = m.tool_call_id
                return (self._intern.get(key, -2) if key else -1) == self.rid[i]
            a = self.off[i]
            nc = self.off[i + 1] - a
            calls = m.tool_calls if code == 2 else None
            if not calls:
                return nc == 0
            if len(calls) != nc:
                return False
            j = 0
            for call in calls:
                key = call.get("id")
                if (self._intern.get(key, -2) if key else -1) != self.ids[a + j]:
                    return False
                j += 1
            return True
        except Exception:
            return False

    def hint(self, list msgs, list patched, list originals, counts=None):
        """See the twin."""
        if PyList_GET_SIZE(patched) != PyList_GET_SIZE(originals):
            raise ValueError(f"patched and originals must have the same length, got {len(patched)} and {len(originals)}")
        if counts is not None and (type(counts) is not list or PyList_GET_SIZE(counts) != PyList_GET_SIZE(patched)):
            raise ValueError("counts must be None or a list as long as patched")
        self._hint = (msgs, patched, originals, counts)

    cdef Py_ssize_t _match_hinted(self, list msgs, list patched, list originals, list counts) except -2:
        """``_match`` on a hint; -3 when the hint does not hold (see the twin)."""
        cdef Py_ssize_t n = self.n, m = PyList_GET_SIZE(msgs), j, p, prev = 0, k = PyList_GET_SIZE(patched)
        cdef PyObject* a
        cdef PyObject* b
        cdef list patch = None, patch_counts = None
        if m < n or k != PyList_GET_SIZE(originals):
            return -3
        for j in range(k):
            po = <object>PyList_GET_ITEM(patched, j)
            if type(po) is not int:
                return -3
            try:
                p = po  # (compared as a C integer: no int made for prev or n)
            except OverflowError:
                return -3
            if p < prev or p >= n:
                return -3
            if p > prev and memcmp((<PyListObject*>msgs).ob_item + prev, (<PyListObject*>self._msgs).ob_item + prev,
                                   (p - prev) * sizeof(PyObject*)) != 0:
                return -3
            a = PyList_GET_ITEM(msgs, p)
            b = PyList_GET_ITEM(self._msgs, p)
            if a != b:
                if b != PyList_GET_ITEM(originals, j) or type(<object>a) is not self._type:
                    return -3
                if patch is None:
                    patch = []
                    if counts is not None:
                        patch_counts = []
                patch.append(po)
                if counts is not None:
                    patch_counts.append(<object>PyList_GET_ITEM(counts, j))
                if PyList_GET_SIZE(msgs) != m:
                    return -3
            prev = p + 1
        if n > prev and memcmp((<PyListObject*>msgs).ob_item + prev, (<PyListObject*>self._msgs).ob_item + prev,
                               (n - prev) * sizeof(PyObject*)) != 0:
            return -3
        self._patch = patch
        self._patch_counts = patch_counts
        return m - n

    cdef Py_ssize_t _match(self, list msgs) except -2:
        cdef Py_ssize_t n = self.n, m = PyList_GET_SIZE(msgs), i, lim, limit
        cdef PyObject* a
        cdef PyObject* b
        cdef list patch = None
        cdef bint eq
        cdef tuple h = self._hint
        self._patch = None
        self._patch_counts = None
        if h is not None:
            self._hint = None
            if h[0] is msgs:
                i = self._match_hinted(msgs, <list>h[1], <list>h[2], <list>h[3])
                if i != -3:
                    return i
                self._patch = None
                self._patch_counts = None
        if m >= n and (n == 0 or memcmp((<PyListObject*>msgs).ob_item, (<PyListObject*>self._msgs).ob_item,
                                        n * sizeof(PyObject*)) == 0):
            return m - n  # the same objects: one vectorized comparison
        lim = m if m < n else n
        limit = 32 + n // 8
        for i in range(lim):
            a = PyList_GET_ITEM(msgs, i)
            b = PyList_GET_ITEM(self._msgs, i)
            if a != b:
                x = <object>a
                y = <object>b
                eq = not _unequal(x, y) and PyObject_RichCompareBool(x, y, Py_EQ)
                if PyList_GET_SIZE(msgs) < m:  # the comparison changed the list
                    self.common = 0
                    return -1
                if eq:
                    self._msgs[i] = x
                    continue
                if patch is None:
                    patch = []
                if PyList_GET_SIZE(patch) < limit and self._patchable(x, i):
                    if PyList_GET_SIZE(msgs) < m:
                        self.common = 0
                        return -1
                    patch.append(i)
                    continue
                self.common = <Py_ssize_t>patch[0] if PyList_GET_SIZE(patch) else i
                return -1
        if m < n:
            self.common = <Py_ssize_t>patch[0] if patch else m
            return -1
        if patch:
            self._patch = patch
        return m - n

    cdef int _apply_patch(self, list msgs, count) except -1:
        """Give the records ``_match`` found patchable their new messages and counts (the
        hint's, when it gave them; else ``count(new)``)."""
        cdef list idx = self._patch
        cdef Py_ssize_t k = PyList_GET_SIZE(idx), j, i, first
        cdef int64_t v
        cdef bint counted = True
        self._patch = None
        new = [<object>PyList_GET_ITEM(msgs, <Py_ssize_t>i_) for i_ in idx]
        counts = self._patch_counts
        self._patch_counts = None
        if counts is None:
            counts = count(new)
        if counts is None:
            counts = [-1] * k
        if len(counts) != k:
            raise ValueError(f"counts has {len(counts)} entries, new has {k}")
        vals = []
        for j in range(k):
            x = counts[j]
            try:
                v = x
            except OverflowError:
                v = C_MAX + 1
            if v < -1 or v > C_MAX:
                raise ValueError(f"counts[{idx[j]}] must be -1 (not counted) or between 0 and 2**53, got {x}")
            if v < 0:
                counted = False
            vals.append(v)
        first = self.n
        for j in range(k):
            i = idx[j]
            self._msgs[i] = new[j]
            self.c[i] = <int64_t>vals[j]
            if i < first:
                first = i
        self.version += 1
        # counted patches past the counted tail's start, on valid sums: rebuilt from the first only
        if not self.dirty and self.ps_ok and counted and first >= self.c0:
            self.ps_from = first
        else:
            self.ps_from = -1
        self.dirty = True
        return 0

    def match(self, list msgs):
        """See the twin."""
        return self._match(msgs)

    cdef Py_ssize_t _rewind(self) except -1:
        """See the twin."""
        cdef Py_ssize_t k = self.common
        if k == 0 or len(self._intern) > 2 * (self.n_ids + self.n) + 64:
            return 0
        self._truncate(k)
        return k

    cdef int _truncate(self, Py_ssize_t k) except -1:
        del self._msgs[k:]
        self.n = k
        self.version += 1
        self.s_at = self.s_end = 0  # (the sanitize scan: anew)
        self.n_ids = self.off[k]
        if self.pin_n > k:
            self.pin_n = k
        if not self.dirty and not (self.ps_ok and self.c0 <= k):
            self.dirty = True  # the prefix sums up to k are not all valid: rebuilt when planning
            self.ps_from = -1
        elif self.dirty:
            self.ps_from = -1
        return 0

    def truncate(self, Py_ssize_t k):
        """See the twin."""
        if not 0 <= k <= self.n:
            raise ValueError(f"k must be between 0 and {self.n}, got {k}")
        self._truncate(k)

    def advance(self, list msgs, count):
        """See the twin."""
        cdef Py_ssize_t k = self._match(msgs), i, skip = 0
        if k < 0:
            if not self._rewind():
                return -1
            k = PyList_GET_SIZE(msgs) - self.n
            skip = self.last_lo - self.n if self.last_lo - self.n < k else k
        elif self._patch is not None:
            self._apply_patch(msgs, count)
        if k <= 0:
            return k
        new = msgs[self.n:]
        for i in range(k):
            if type(<object>PyList_GET_ITEM(new, i)) is not self._type:
                return -2
        if skip > 0:
            self.extend(new[:skip])
            new = new[skip:]
        self.extend(new, count(new))
        return k

    def extend(self, list new, counts=None):
        """See the twin."""
        self._extend(new, counts, NULL)

    cdef int _known_counts(self, list msgs, object known, int64_t* buf) except -1:
        """``window``'s ``known`` counts of the new messages ``msgs[n:]`` copied into ``buf``
        (at most ``KNOWN_MAX``): 1, or 0 when ``known`` does not cover them all (see the twin)."""
        cdef Py_ssize_t n = self.n, m = PyList_GET_SIZE(msgs), i
        cdef object ref = (<tuple>known)[0], counts = (<tuple>known)[1]  # (checked by window)
        if m - n > C_KNOWN_MAX or m <= n or PyList_GET_SIZE(ref) < m or Py_SIZE(counts) < m:
            return 0
        for i in range(n, m):
            if PyList_GET_ITEM(ref, i) != PyList_GET_ITEM(msgs, i):
                return 0
        for i in range(n, m):
            buf[i - n] = (<carray.array>counts).data.as_longlongs[i]
        return 1

    cdef int _extend(self, list new, object counts, const int64_t* known) except -1:
        """``extend``; with ``known`` (not NULL), the counts are ``known[:len(new)]``."""
        cdef Py_ssize_t k = len(new), n = self.n, i, j, nid = self.n_ids
        cdef int64_t v, s
        cdef int code
        if counts is not None and len(counts) != k:
            raise ValueError(f"counts has {len(counts)} entries, new has {k}")
        self._grow(n + k)
        for i in range(k):
            m = <object>PyList_GET_ITEM(new, i)
            code = ROLE_CODES[m.role]
            j = n + i
            if known != NULL:
                v = known[i]
                if v < -1 or v > C_MAX:
                    raise ValueError(f"counts[{j}] must be -1 (not counted) or between 0 and 2**53, got {v}")
            elif counts is None:
                v = -1
            else:
                x = counts[i]
                try:
                    v = x
                except OverflowError:
                    v = C_MAX + 1
                if v < -1 or v > C_MAX:
                    raise ValueError(f"counts[{j}] must be -1 (not counted) or between 0 and 2**53, got {x}")
            self.r[j] = code
            self.c[j] = v
            if code == 3:
                self.rid[j] = self._interned(m.tool_call_id)
            else:
                self.rid[j] = -1
                if code == 2:
                    calls = m.tool_calls
                    if calls:
                        for call in calls:
                            v = self._interned(call.get("id"))
                            self._grow_ids(nid + 1, nid)
                            self.ids[nid] = v
                            nid += 1
            self.off[j + 1] = nid
        self.n_ids = nid
        self._msgs.extend(new)
        self.n = n + k
        if not self.dirty:
            for j in range(n, n + k):
                v = self.c[j]
                if v < 0:
                    self.c0 = j + 1
                    self.ps[j + 1] = 0
                    self.ps_ok = True
                elif self.ps_ok:
                    s = self.ps[j] + v
                    if s > SAT:
                        self.ps_ok = False
                    else:
                        self.ps[j + 1] = s
        return 0

    def set_counts(self, index, values):
        """See the twin."""
        cdef Py_ssize_t k = len(index), j, i, n = self.n
        cdef int64_t v
        if len(values) != k:
            raise ValueError(f"values has {len(values)} entries, index has {k}")
        for j in range(k):
            x = index[j]
            if not 0 <= x < n:
                raise ValueError(f"index[{j}] must be a record position (0..{n - 1}), got {x}")
            x = values[j]
            if not -1 <= x <= MAX_VALUE:
                raise ValueError(f"values[{j}] must be -1 (not counted) or between 0 and 2**53, got {x}")
        for j in range(k):
            i = index[j]
            v = values[j]
            self.c[i] = v
        self.dirty = True
        self.ps_from = -1

    # -- decisions --------------------------------------------------------------------------

    cdef void _rebuild(self) noexcept:
        cdef Py_ssize_t i = self.n, j
        cdef int64_t s, v
        if self.ps_from >= 0 and self.ps_ok and self.c0 <= self.ps_from <= self.n:
            # after a patch of counted records in the counted tail (a clearing step's copies): the
            # sums up to its first position are valid; records extended since may be uncounted
            for j in range(self.ps_from, self.n):
                v = self.c[j]
                if v < 0:
                    self.c0 = j + 1
                    self.ps[j + 1] = 0
                    continue
                s = self.ps[j] + v
                if s > SAT:
                    break  # (saturated: the full rebuild below decides)
                self.ps[j + 1] = s
            else:
                self.dirty = False
                self.ps_from = -1
                return
        self.ps_from = -1
        while i > 0 and self.c[i - 1] >= 0:
            i -= 1
        self.c0 = i
        self.ps[i] = 0
        self.ps_ok = True
        self.dirty = False
        for j in range(i, self.n):
            s = self.ps[j] + self.c[j]
            if s > SAT:
                self.ps_ok = False
                return
            self.ps[j + 1] = s

    cdef inline Py_ssize_t _ustart(self, Py_ssize_t i, Py_ssize_t k) noexcept:
        while i > k and self.r[i] == 3:
            i -= 1
        return i

    cdef inline Py_ssize_t _newest(self, Py_ssize_t e, Py_ssize_t k, int64_t avail) noexcept:
        """The first unit start ``u >= e`` whose units up to the end cost at most ``avail`` (n if none)."""
        cdef Py_ssize_t n = self.n
        cdef Py_ssize_t i = _lower_bound(self.ps, e, n, self.ps[n] - avail)
        while i < n and i > k and self.r[i] == 3:
            i += 1
        return i

    cdef void _decide(self, int64_t budget, int64_t mask, bint from_start, int64_t chunk, bint pinned_free,
                      int64_t* out) noexcept:
        cdef Py_ssize_t n = self.n, k, i, e, m, s, lo, j, c0, walked
        cdef int64_t pinned = 0, avail, kept, v, per, step, a2, x_mod, t
        cdef const int64_t* ps
        if mask != self.pin_mask:
            self.pin_mask = mask
            self.pin_n = 0
        k = self.pin_n
        while k < n and (mask >> self.r[k]) & 1:
            k += 1
        self.pin_n = k
        if self.dirty:
            self._rebuild()
        if not self.ps_ok:  # sums past 2**62: the general planner (saturating sums)
            _plan(NULL, n, self.r, self.c, mask, budget, from_start, chunk, pinned_free, out)
            return
        ps = self.ps
        c0 = self.c0
        out[0] = 0
        out[1] = k
        if not pinned_free:
            m = k if k < c0 else c0
            for i in range(m):
                v = self.c[i]
                if v < 0:
                    out[0] = 1
                    out[2] = 0
                    out[3] = k
                    return
                pinned += v
                if pinned > SAT:
                    pinned = SAT
            if k > c0:
                pinned += ps[k] - ps[c0]
                if pinned > SAT:
                    pinned = SAT
        if k == n or pinned > budget:
            out[2] = n if from_start else k
            out[3] = out[2]
            return
        avail = budget - pinned
        if from_start and chunk == 0:
            e = k if k > c0 else c0
            while e < n and e > k and self.r[e] == 3:
                e += 1
            kept = ps[n] - ps[e]
            out[3] = n
            if kept > avail:
                out[2] = self._newest(e, k, avail)
                return
            if e == k:
                out[2] = k
                return
            # every unit from e on fits and the one before holds an uncounted message: ask
            # for counts as the walk of plan_window does
            walked = n - e
            if walked == 0:
                step = 32
            else:
                per = kept // walked if kept // walked > 1 else 1
                step = (avail - kept) // per * 5 // 4 + 2
                if walked // 2 > step:
                    step = walked // 2
            s = self._ustart(e - 1, k)
            lo = e - step if e - step > k else k
            lo = self._ustart(lo, k)
            out[0] = 1
            out[2] = lo if lo < s else s
            out[3] = e
            return
        if c0 > k:
            out[0] = 1
            out[2] = k
            out[3] = n
            return
        if not from_start:  # the longest run of oldest units
            out[2] = k
            t = ps[k] + avail
            if ps[n] <= t:
                out[3] = n
            else:
                out[3] = self._ustart(_lower_bound(ps, k, n, t + 1) - 1, k)
            return
        lo = self._newest(k, k, avail)
        out[3] = n
        if lo == k:
            out[2] = lo
            return
        x_mod = ((ps[n] - ps[k]) % chunk - avail % chunk) % chunk
        x_mod = (x_mod + chunk) % chunk
        a2 = avail - (chunk - x_mod) % chunk
        j = n if a2 < 0 else self._newest(k, k, a2)
        e = self._ustart(n - 1, k)
        if j > e:
            j = e
        out[2] = lo if lo > j else j

    def plan(self, int64_t budget, int64_t pinned_mask, bint from_start, int64_t chunk=0, bint pinned_free=False):
        """See the twin."""
        cdef int64_t out[4]
        _check_plan_args(budget, chunk)
        if self.n == 0:
            self.last_lo = 0
            return (0, 0, 0, 0)
        self._decide(budget, pinned_mask, from_start, chunk, pinned_free, out)
        if out[0] == 3:
            raise MemoryError()
        if out[0] == 0:
            self.last_lo = out[2]
        return (out[0], out[1], out[2], out[3])

    def window(self, list msgs, count, int64_t budget, tuple settings, bint sanitize, insert=None, known=None):
        """See the twin."""
        cdef int64_t out[4]
        cdef int64_t buf[C_KNOWN_MAX]
        cdef Py_ssize_t k, i, n_pinned, lo, hi, j, skip = 0, at = 0, want_lo = 0, extra = 0
        cdef object message = None
        cdef PyObject* old
        if insert is not None:
            if type(insert) is not tuple or PyTuple_GET_SIZE(insert) != 3:
                raise ValueError(f"insert must be (message, at, lo), got {insert!r}")
            message, at, want_lo = <tuple>insert
            extra = 1
        if known is not None and (type(known) is not tuple or PyTuple_GET_SIZE(known) < 2
                                  or type((<tuple>known)[0]) is not list or type((<tuple>known)[1]) is not carray.array
                                  or (<carray.array>(<tuple>known)[1]).ob_descr.typecode != b'q'):
            raise TypeError("known must be a tuple (ref, counts, ...): a list and an array.array of typecode 'q'")
        k = self._match(msgs)
        if k < 0:
            if extra or not self._rewind():
                return None
            k = PyList_GET_SIZE(msgs) - self.n
            skip = self.last_lo - self.n if self.last_lo - self.n < k else k
        elif self._patch is not None:
            if extra:  # (a message changed: the caller's summary may be of it)
                return None
            self._apply_patch(msgs, count)
        if k > 0:
            new = msgs[self.n:]
            for i in range(k):
                if type(<object>PyList_GET_ITEM(new, i)) is not self._type:
                    return None
            if skip > 0:
                self._extend(new[:skip], None, NULL)
                new = new[skip:]
            elif known is not None and self._known_counts(msgs, known, buf):
                self._extend(new, None, buf)  # (the caller's counts of these very messages)
                new = None
            if new is not None:
                self._extend(new, count(new), NULL)
        if len(settings) != 4:
            raise ValueError(f"settings must be (pinned_mask, from_start, chunk, pinned_free), got {settings!r}")
        mask, from_start, chunk, pinned_free = settings
        _check_plan_args(budget, chunk)
        if self.n == 0:
            return None
        self._decide(budget, mask, from_start, chunk, pinned_free, out)
        n_pinned, lo, hi = out[1], out[2], out[3]
        if out[0] == 0:
            self.last_lo = lo
        if out[0] != 0 or n_pinned == self.n or lo == hi or PyList_GET_SIZE(msgs) < self.n:
            return None  # (the last test: count() shortened msgs; the caller starts over)
        if extra and (n_pinned != at or lo != want_lo):
            extra = 2  # the cut moved (or the pinned prefix changed): the plain window and its plan
        result = _window_list(msgs, n_pinned, (extra == 1), lo, hi)
        j = n_pinned
        if extra == 1:
            old = PyList_GET_ITEM(result, j)  # (the gap's placeholder item)
            Py_INCREF(message)
            PyList_SET_ITEM(result, j, message)
            _decref(old)
        clean = sanitize and self._sanitized(n_pinned, lo, hi) == 0
        if extra == 2:
            return (result, clean, n_pinned, lo)
        return (result, clean)

    cdef int _scan_to(self) except -1:
        """The sanitize scan of all records (see ``sflag``), resumed at the start of the last
        unit it saw: the units of ``_sanitize_status`` over the records ``[0, n)`` as one prompt,
        each marked (``S_START``, ``S_NEG``: a missing id, ``S_BAD``: not valid, ``S_PA``: sets the
        scan's pending state: a unit, or a lone message that is not a system one)."""
        cdef Py_ssize_t n = self.n, i, j, p, x, y, a, b, nc, cap
        cdef int8_t fl
        cdef bint ok, found
        cdef int64_t rid
        cdef const int8_t* r = self.r
        cdef const int64_t* coff = self.off
        cdef const int64_t* cids = self.ids
        cdef const int64_t* rids = self.rid
        if n + 1 > self.s_cap:
            cap = 2 * self.s_cap if 2 * self.s_cap > n + 1 else n + 1
            if cap < 64:
                cap = 64
            if (_realloc8(&self.sflag, cap) or _realloc64(&self.sneg, cap) or _realloc64(&self.sbad, cap)
                    or _realloc64(&self.slast, cap)):
                raise MemoryError()
            self.s_cap = cap
        i = self.s_at
        if i == 0:
            self.sneg[0] = 0
            self.sbad[0] = 0
            self.slast[0] = -1
        while i < n:
            self.s_at = i
            nc = coff[i + 1] - coff[i]
            fl = S_START
            j = i + 1
            if r[i] == 3 or (r[i] == 2 and nc > 0):
                fl |= S_PA
                while j < n and r[j] == 3:
                    j += 1
                ok = False
                if r[i] == 2:
                    a = coff[i]
                    b = coff[i + 1]
                    for x in range(a, b):
                        if cids[x] == -1:
                            fl |= S_NEG
                    for y in range(i + 1, j):
                        if rids[y] == -1:
                            fl |= S_NEG
                    ok = (j - i - 1) == nc
                    x = a
                    while ok and x < b:
                        for y in range(x + 1, b):
                            if cids[y] == cids[x]:
                                ok = False
                                break
                        x += 1
                    y = i + 1
                    while ok and y < j:
                        rid = rids[y]
                        found = False
                        for x in range(a, b):
                            if cids[x] == rid:
                                found = True
                                break
                        if not found:
                            ok = False
                        for x in range(y + 1, j):
                            if rids[x] == rid:
                                ok = False
                                break
                        y += 1
                if not ok:
                    fl |= S_BAD
            elif r[i] != 0:
                fl |= S_PA
            self.sflag[i] = fl
            for p in range(i + 1, j):
                self.sflag[p] = 0
            for p in range(i + 1, j + 1):
                self.sneg[p] = self.sneg[i] + ((fl & S_NEG) != 0)
                self.sbad[p] = self.sbad[i] + ((fl & S_BAD) != 0)
                self.slast[p] = i if fl & S_PA else self.slast[i]
            i = j
        self.s_end = n
        return 0

    cdef int _sanitized(self, Py_ssize_t n_pinned, Py_ssize_t lo, Py_ssize_t hi) except -1:
        """``_sanitize_status`` of the prompt ``[:n_pinned] + [lo:hi]`` (``0 <= n_pinned <= lo <=
        hi <= n``) from the scan of all records (``_scan_to``), when the prompt's units are the
        scan's: ``n_pinned`` (unless ``lo`` is it), ``lo`` and ``hi`` start units of the scan (or
        are ``n``), and a tool result at ``lo`` does not follow the pinned prefix (where it would
        join the prefix's last unit); otherwise the scan of the prompt itself. The status is then
        2 when a unit has a missing id, 2 when the last unit (or message) that sets the pending
        state is a broken unit, 1 when a unit is broken, else 0, as ``_sanitize_status`` finds."""
        cdef Py_ssize_t n = self.n, last
        cdef const int8_t* fl
        cdef bint pending
        if self.s_end != n or self.s_at > n:
            if self.s_at > n:
                self.s_at = 0
            self._scan_to()
        fl = self.sflag
        if ((lo != n_pinned and (not (fl[n_pinned] & S_START) or (n_pinned > 0 and lo < hi and self.r[lo] == 3)))
                or (lo < n and not (fl[lo] & S_START)) or (hi < n and not (fl[hi] & S_START))):
            return _sanitize_status(NULL, self.r, self.off, self.ids, self.rid, n_pinned, lo, hi)
        if self.sneg[n_pinned] + self.sneg[hi] - self.sneg[lo] > 0:
            return 2
        last = self.slast[hi]
        if last < lo:
            last = self.slast[n_pinned]
        if last >= 0 and fl[last] & S_BAD:
            return 2
        return 1 if self.sbad[n_pinned] + self.sbad[hi] - self.sbad[lo] > 0 else 0

    def sanitize(self, Py_ssize_t n_pinned, Py_ssize_t lo, Py_ssize_t hi):
        """See the twin."""
        cdef Py_ssize_t n = self.n
        if not (0 <= n_pinned <= lo <= hi <= n):
            raise ValueError(f"need 0 <= n_pinned <= lo <= hi <= {n}, got {n_pinned}, {lo}, {hi}")
        if n == 0:
            return 0
        return self._sanitized(n_pinned, lo, hi)

    def joined(self, dict values, lo, hi):
        """See the twin."""
        cdef Py_ssize_t n = self.n, i, a, b, size = 0
        cdef list parts
        cdef PyObject* vp
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"need 0 <= lo <= hi <= {n}, got {lo}, {hi}")
        a, b = lo, hi
        parts = PyList_New(b - a)
        for i in range(a, b):
            vp = _value_of(values, PyList_GET_ITEM(self._msgs, i))
            if vp == NULL:
                return None
            v = <object>vp
            Py_INCREF(v)
            PyList_SET_ITEM(parts, i - a, v)
        return b"".join(parts)

    cdef object _piece_key(self, bytes key, dict values, Py_ssize_t a, Py_ssize_t b):
        """``sha256(key + the values of [a, b)).digest()``, or None when one has none."""
        cdef Py_ssize_t i, size = PyBytes_GET_SIZE(key), k = b - a
        cdef PyObject* vp
        cdef PyObject** got = <PyObject**> malloc((k if k > 0 else 1) * sizeof(PyObject*))
        cdef char* p
        if got == NULL:
            raise MemoryError()
        try:
            for i in range(k):  # (borrowed: nothing runs Python code until they are copied)
                vp = _value_of(values, PyList_GET_ITEM(self._msgs, a + i))
                if vp == NULL:
                    return None
                got[i] = vp
                size += PyBytes_GET_SIZE(<object>vp)
            buf = PyBytes_FromStringAndSize(NULL, size)
            p = PyBytes_AS_STRING(buf)
            memcpy(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
            p += PyBytes_GET_SIZE(key)
            for i in range(k):
                memcpy(p, PyBytes_AS_STRING(<object>got[i]), PyBytes_GET_SIZE(<object>got[i]))
                p += PyBytes_GET_SIZE(<object>got[i])
        finally:
            free(got)
        return _sha256(buf).digest()

    def fold_keys(self, lo, first, hi, acc, units, level, fold, key, known, dict values):
        """See the twin."""
        return self._fold_keys(lo, first, hi, acc, units, level, fold, key, known, values)

    def fold_step(self, chain, a, b, fold, dict values, dict by_content):
        """See the twin."""
        if type(chain) is not tuple or PyTuple_GET_SIZE(chain) != 14:
            raise TypeError(f"chain: expected a 14-tuple, got {type(chain).__name__}")
        if type(fold) is not int or not 1 <= fold <= C_MAX:
            raise ValueError(f"fold must be between 1 and 2**53, got {fold}")
        cdef tuple c = <tuple>chain
        if c[1] is not self or c[3] != a or c[2] != self.version or not c[9] < b - a:
            return None
        version, lo, cum, units0, key, text, end, acc, units, known = c[2], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12]
        got = self._fold_keys(a + lo, a + end, b, acc, units, (cum // fold + 1) * fold, fold, key, known, values)
        if got is None:
            return None
        cdef list ends = (<tuple>got)[0]
        units = (<tuple>got)[1]
        acc = (<tuple>got)[2]
        point_units = 0
        out = None
        cdef tuple e
        cdef PyObject* tp
        for item in ends:
            e = <tuple>item
            tp = PyDict_GetItemWithError(by_content, e[3])
            if tp == NULL:
                return None
            t = <object>tp
            if t is None:
                return None
            if e[1] >= 0:
                text, lo, cum, key, point_units = t, e[0] - a, e[1], e[3], e[2]
            else:
                known = e[3]
                out = (t, units0 + units)
        return (None, self, version, a, lo, cum, units0 + point_units, key, text, b - a, acc, units - point_units,
                known, out)

    cdef object _fold_keys(self, lo, first, hi, acc, units, level, fold, key, known, dict values):
        if not 0 <= lo <= first <= hi:
            raise ValueError(f"need 0 <= lo <= first <= hi, got {lo}, {first}, {hi}")
        if type(key) is not bytes or (known is not None and type(known) is not bytes):
            bad = key if type(key) is not bytes else known
            raise TypeError(f"key and known: expected bytes (known: or None), got {type(bad).__name__}")
        cdef int64_t a[6]
        self._fold_args(first, hi, acc, units, level, fold, a)
        got = self._folds(a[0], a[1], a[2], a[3], a[4], a[5])
        if got is None:
            return None
        cdef list points = (<tuple>got)[0]
        cdef Py_ssize_t n_pts = PyList_GET_SIZE(points), i, start = lo, e, f0 = first
        cdef list ends = PyList_New(0)
        cdef tuple p
        for i in range(n_pts + 1):
            if i < n_pts:
                p = <tuple>PyList_GET_ITEM(points, i)
                e = p[0]
            else:
                e = hi
            if i == 0 and i < n_pts and known is not None and e == f0:
                key = known
            else:
                key = self._piece_key(<bytes>key, values, start, e)
                if key is None:
                    return None
            if i < n_pts:
                ends.append((p[0], p[1], p[2], key))
            else:
                ends.append((hi, -1, (<tuple>got)[1], key))
            start = e
        return ends, (<tuple>got)[1], (<tuple>got)[2]

    cdef int _fold_args(self, lo, hi, acc, units, level, fold, int64_t* out) except -1:
        """Check ``folds``' arguments (the twin's errors) into ``out = (lo, hi, acc, units,
        level, fold)``."""
        cdef Py_ssize_t n = self.n
        cdef int64_t v
        cdef int k = 0
        for x in (lo, hi):
            try:
                v = x
            except OverflowError:
                v = -1
            out[k] = v
            k += 1
        if not 0 <= out[0] <= out[1] <= n:
            raise ValueError(f"need 0 <= lo <= hi <= {n}, got {lo}, {hi}")
        for name, x in (("acc", acc), ("units", units), ("level", level)):
            try:
                v = x
            except OverflowError:
                v = -1
            if not 0 <= v <= SAT:
                raise ValueError(f"{name} must be between 0 and 2**62, got {x}")
            out[k] = v
            k += 1
        try:
            v = fold
        except OverflowError:
            v = 0
        if not 1 <= v <= C_MAX:
            raise ValueError(f"fold must be between 1 and 2**53, got {fold}")
        out[5] = v
        return 0

    cdef object _folds(self, Py_ssize_t a, Py_ssize_t b, int64_t s, int64_t u, int64_t lv, int64_t f):
        cdef Py_ssize_t i
        cdef list points
        for i in range(a, b):
            if self.c[i] < 0:
                return None
        points = []
        for i in range(a, b):
            if self.r[i] != 3:
                if s >= lv:
                    points.append((i, s, u))
                    lv = (s // f + 1) * f
                u += 1
            s += self.c[i]
            if s > SAT:
                return None
        return points, u, s

    def folds(self, lo, hi, acc, units, level, fold):
        """See the twin."""
        cdef int64_t a[6]
        self._fold_args(lo, hi, acc, units, level, fold, a)
        return self._folds(a[0], a[1], a[2], a[3], a[4], a[5])


# -- SummarizingBudgetFilter's turn; see the twin ------------------------------------------------

def summarizing_trim(flt, messages, tools_schema, sanitize):
    """``SummarizingBudgetFilter._trim`` (a turn whose cut did not move runs no Python frame);
    see the twin."""
    got = None
    with flt._lock:
        hot = flt._hot
        if (type(hot) is tuple and PyTuple_GET_SIZE(hot) == 7 and type(messages) is list
                and (tools_schema is None or not tools_schema)):
            f, rec, count, cfg, budget, bare, insert = <tuple>hot
            if bare:
                try:
                    got = rec.window(messages, count, budget, cfg, sanitize, insert)
                except Exception:
                    got = 0
                else:
                    if got is None:
                        got = 1
                    elif type(got) is tuple and PyTuple_GET_SIZE(got) == 2:
                        if insert is not None or len((<tuple>got)[0]) == PyList_GET_SIZE(messages):
                            return got
                        got = 1
                    else:
                        try:
                            out = _moved_summary(flt, <tuple>hot, got)
                        except Exception:  # (_trim_rest's _moved raises it as the filter's error)
                            out = None
                        if out is not None:
                            return out
        return flt._trim_rest(messages, tools_schema, sanitize, got)


cdef object _moved_summary(object flt, tuple hot, object got):
    """See the twin."""
    if type(got) is not tuple or PyTuple_GET_SIZE(got) != 4:
        return None
    kept, clean, n_pinned, cut = <tuple>got
    chain = flt._chain
    if chain is None or not cut > n_pinned or type(kept) is not list:
        return None
    rec = hot[1]
    step = rec.fold_step(chain, n_pinned, cut, flt._fold, flt._digests, flt._by_content)
    if step is None or (<tuple>step)[13] is None:
        return None
    text, units = (<tuple>step)[13]
    messages = flt._messages
    if type(messages) is not dict:
        return None
    summary = (<dict>messages).get((cut - n_pinned, units, text))
    if summary is None:
        return None
    flt._chain = step
    (<list>kept).insert(n_pinned, summary)
    flt._hot = (hot[0], rec, hot[2], hot[3], hot[4], hot[5], (summary, n_pinned, cut))
    return (kept, clean)


# -- a cached counter's counts (jianmu_fast.memory.context._count_cache); see the twin ---------

def counts_of(counter, ms, str where="messages"):
    """One count per message of ``ms`` by a ``CachedChatCounter``; see the twin."""
    cdef dict cache = counter._msgs
    cdef list out = []
    cdef list missing = None
    cdef Py_ssize_t i = 0
    cdef object e
    for m in ms:
        e = cache.get(id(m))
        if e is not None and (<tuple>e)[0]() is m:
            out.append((<tuple>e)[1])
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


cdef int _fill(counter, ms, list missing, list out, str where) except -1:
    message_type = counter._message_type
    cdef dict texts_cache = counter._texts
    cdef dict role_base = counter._role_base
    cdef bint count_id = counter.COUNT_TOOL_CALL_ID
    cdef list rows = []
    cdef dict need = {}
    cdef list texts, rest
    cdef Py_ssize_t i, added, longest, size
    cdef bint keep
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
            n = texts_cache.get(c)
            if n is None:
                need[c] = None
                rows.append((i, m, fixed, c, m is ms[i], role, c))
            else:
                rows.append((i, m, fixed + n, None, m is ms[i], role, n))
            continue
        cc = None
        if type(c) is str:
            cc = texts_cache.get(c)
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
        name = m.name
        if name:
            texts.append(name)
            fixed += counter.PER_NAME
        if count_id:
            tcid = m.tool_call_id
            if tcid:
                texts.append(tcid)
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
            n = texts_cache.get(t)
            if n is None:
                need[t] = None
                rest.append(t)
            else:
                fixed += n
        keep = m is ms[i] and type(c) is not list and (tc is None or type(tc) is counter._frozen_list)
        rows.append((i, m, fixed, rest if rest else None, keep, role, cc))
    cdef dict got = None
    new = None
    counts = None
    if need:
        new = list(need)
        encode = counter._direct_encode  # what _encode_counts does for one text, without its frame
        size = 0
        if encode is not None and counter._auto_chars >= 0:  # engine="auto" still counting; see the twin
            for t in new:
                size += len(<str>t)
            if counter._auto_chars + size >= counter.AUTO_FASTOKENS_CHARS:
                encode = None
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
    cdef dict cache
    cdef tuple row
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
        for row in rows:
            total = row[2]
            rest_ = row[3]
            if rest_ is not None:
                if type(rest_) is str:
                    total += got[rest_]
                else:
                    for t in <list>rest_:
                        total += got[t]
            out[<Py_ssize_t>row[0]] = total
            if row[4]:
                m = row[1]
                cc = row[6]
                if type(cc) is str:
                    cc = got[cc]
                w = ref(m)
                e = (w, total, row[5], cc)
                # out of the cyclic collector's sight (what the entries it keeps would bring on:
                # full collections behind many conversations): a weak reference without a
                # callback holds nothing strongly (the collector clears it through its
                # referent), and the entry holds it, an int, a role and an int or None
                if (<object>w).__callback__ is None and PyObject_GC_IsTracked(w):
                    PyObject_GC_UnTrack(<void *>w)
                    if (PyObject_GC_IsTracked(e) and type(e[2]) is str and type(e[1]) is int
                            and (cc is None or type(cc) is int)):
                        PyObject_GC_UnTrack(<void *>e)
                cache[id(m)] = e
        size = counter.cache_size
        if len(cache) > size:
            for key in list(islice(iter(cache), len(cache) - (size * 3) // 4)):
                del cache[key]
    return 0
