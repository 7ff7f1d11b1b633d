# cython: language_level=3
"""Compiled context-editing core: which tool results ``ClearToolResultsFilter`` clears.

Arithmetic only, over contiguous int64/int8 memoryviews, one pass over the history. The
specification, with the meaning of every argument, is the pure-Python twin
``jianmu_fast/_editing_core_py.py``; both have the same names, signatures, results and error
messages (proven by tests/test_context_editing_core.py).
"""

from libc.stdint cimport int64_t, int8_t
from libc.stdlib cimport free, malloc

__all__ = ["MAX_VALUE", "plan_clearing"]

MAX_VALUE = 1 << 53
cdef int64_t C_MAX = (<int64_t>1) << 53
cdef int64_t C_SUM = (<int64_t>1) << 62


cdef int _check(str name, int64_t value) except -1:
    if value < 0 or value > C_MAX:
        raise ValueError(f"{name} must be between 0 and 2**53, got {value}")
    return 0


cdef inline int64_t _level(int64_t total, int64_t trigger, int64_t step, int64_t prev) noexcept nogil:
    if total <= trigger:
        return 0
    if step > 0:
        return (total - trigger + step - 1) // step
    return prev + 1


cdef inline int64_t _room(int64_t total, int64_t trigger, int64_t step) noexcept nogil:
    if step == 0:
        return 0
    if total <= trigger:
        return trigger - total + step
    return trigger + (total - trigger + step - 1) // step * step - total


def plan_clearing(const int64_t[::1] counts, const int8_t[::1] kinds, const int64_t[::1] savings,
                  int64_t base, int64_t trigger, int64_t step, int64_t keep):
    """Which tool results to clear: ``(cleared, total)``; see ``_editing_core_py``."""
    cdef Py_ssize_t n = counts.shape[0]
    cdef Py_ssize_t i
    cdef int64_t k, s, total, n_results, cleared, need, level, level_prev
    cdef int64_t eligible, best_k, best_room, best_saved, saved, room
    cdef int64_t *positions
    if kinds.shape[0] != n or savings.shape[0] != n:
        raise ValueError(
            f"counts, kinds and savings must have the same length, got {n}, {kinds.shape[0]}, {savings.shape[0]}")
    _check("base", base)
    _check("trigger", trigger)
    _check("step", step)
    _check("keep", keep)
    total = base
    for i in range(n):
        if counts[i] < 0 or counts[i] > C_MAX:
            raise ValueError(f"counts[{i}] must be between 0 and 2**53, got {counts[i]}")
        total += counts[i]
        if total > C_SUM:
            raise ValueError(f"base + sum(counts[:{i + 1}]) must be at most 2**62")
        k = kinds[i]
        if k < 0 or k > 2:
            raise ValueError(f"kinds[{i}] must be 0, 1 or 2, got {k}")
        s = savings[i]
        if s < 0 or s > counts[i] or (k != 2 and s != 0):
            raise ValueError(
                f"savings[{i}] must be between 0 and counts[{i}], and 0 unless kinds[{i}] == 2, got {s}")
    positions = <int64_t *>malloc((n if n > 0 else 1) * sizeof(int64_t))
    if positions == NULL:
        raise MemoryError()
    total = base
    n_results = 0
    cleared = 0
    need = step if step > 0 else 1
    level_prev = 0
    try:
        with nogil:
            for i in range(n):
                total += counts[i]  # at most 2**62 (checked above): no overflow
                if kinds[i]:
                    positions[n_results] = i
                    n_results += 1
                if step == 0 or total > trigger + level_prev * step:  # else the level is unchanged
                    level = _level(total, trigger, step, level_prev)
                else:
                    level = level_prev
                eligible = n_results - keep
                if level > level_prev and eligible > cleared:
                    best_k = -1
                    best_room = -1
                    best_saved = 0
                    saved = 0
                    for k in range(cleared, eligible):
                        saved += savings[positions[k]]
                        if saved >= need:
                            room = _room(total - saved, trigger, step)
                            if room >= best_room:
                                best_k = k + 1
                                best_room = room
                                best_saved = saved
                    if best_k >= 0:
                        total -= best_saved
                        cleared = best_k
                        level = _level(total, trigger, step, level)
                level_prev = level
    finally:
        free(positions)
    return (cleared, total)
