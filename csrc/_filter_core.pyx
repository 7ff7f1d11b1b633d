# cython: language_level=3
"""Compiled filter core: which messages of a prompt to keep under a limit.

Arithmetic only, over contiguous int64 memoryviews. The specification, with the meaning of
every argument, is the pure-Python twin ``jianmu_fast/_filter_core_py.py``; both have the
same names, signatures, results and error messages (proven by tests/test_filter_core.py).
"""

from libc.stdint cimport int64_t, int8_t
from libc.stdlib cimport free, malloc

import numpy as np

__all__ = ["MAX_VALUE", "ROLE_CODES", "plan_window", "plan_windows", "sanitize_window", "sanitize_windows", "select_window", "select_windows"]

ROLE_CODES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}

MAX_VALUE = 1 << 53
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
