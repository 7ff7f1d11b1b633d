# cython: language_level=3
"""Compiled filter core: which messages of a prompt to keep under a limit.

Arithmetic only, over contiguous int64 memoryviews. The specification, with the meaning of
every argument, is the pure-Python twin ``jianmu_fast/_filter_core_py.py``; both have the
same names, signatures, results and error messages (proven by tests/test_filter_core.py).
"""

from libc.stdint cimport int64_t

import numpy as np

__all__ = ["MAX_VALUE", "select_window", "select_windows"]

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
