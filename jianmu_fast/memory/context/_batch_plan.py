"""The batch routine of the trimming filters: many prompts, one compiled pass per step.

``trim_many(flt, prompts, tools_schema, sanitize)`` is ``flt._trim`` (the routine of
``apply()``) for every prompt at once, with the same outputs and the same errors. The data
path, one direction:

1. **rows** (``_backend.intern_rows``): one C pass over every prompt's references gives each
   distinct message (by identity) a row of one table, and each prompt a run of rows (CSR);
2. **records** (``_backend.table_records``): role code, interned call ids and result id of
   each distinct message; counts: every row at once when prompts are short (most of each is
   kept), otherwise only what the planner asks for;
3. **decision** (``_backend.plan_windows``): pinned prefix, units and window of every prompt
   in one compiled call per round; the rows a round asks to count (``need_rows``) are counted
   in one counter call (each distinct message once; the counters cache per text); with
   ``sanitize``, one ``sanitize_windows`` call tells the outputs that need no sanitizing;
4. **output slices** (``_backend.gather_rows``): every output list built in C, read through
   the rows (so the prompts need not exist as lists: ``build_batch`` hands its grouped states'
   prompts over as rows only, see ``_batch_provide``).

A prompt that is not a list of Messages, or whose plan keeps nothing or only its pinned
prefix (the rare ones that may be errors), goes through ``flt._trim`` alone, so its outcome
(error message included) is exactly the one-prompt outcome.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional, Sequence

import numpy as np

from ... import _backend
from ...errors import JianmuError
from ...message import Message
from .counters import TiktokenTokenCounter

__all__ = ["trim_many", "one", "eager_counts_many", "counts_many"]

#: mean prompt length (messages) up to which every distinct message is counted up front
EAGER_MEAN_LEN = 64
#: distinct messages in one count call before it is split over two threads
PARALLEL_MIN = 2048
#: the two counting threads only on machines with at least this many CPUs: on 2-core VMs two
#: threads measured 1.3-1.5x slower than one (cs and coding batches, quiet machine: tiktoken
#: releases and retakes the GIL around every short text, and the two threads convoy on it)
PARALLEL_CPUS = 4
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def trim_many(flt: Any, prompts: Sequence[Any], tools_schema: Any, sanitize: bool,
              interned: Any = None) -> tuple[list[Any], Optional[list[bool]]]:
    """``(outputs, clean)``: ``outputs[p]`` is ``flt._trim(prompts[p], ...)``'s output list, or
    the exception it raises; with ``sanitize``, ``clean[p]`` says that output needs no
    sanitizing (``False`` for a failed prompt), else ``clean`` is ``None``. ``interned``:
    ``_backend.intern_rows(prompts, Message)`` when the caller has it already; a prompt given
    as ``None`` is then the one its rows hold (``_batch_provide.provide_all``: read out of
    the rows only if it goes the one-prompt way).

    >>> from jianmu_fast.memory.context import MaxMessagesFilter
    >>> from jianmu_fast.message import system, human
    >>> s = system("sys")
    >>> outs, clean = trim_many(MaxMessagesFilter(1), [[s, human("a"), human("b")], [s], "x"], None, True)
    >>> [[m.content for m in o] for o in outs[:2]], clean[:2], type(outs[2]).__name__
    ([['sys', 'b'], ['sys']], [True, True], 'MessageValidationError')
    """
    n = len(prompts)
    try:
        limit = flt._limit(tools_schema)
    except JianmuError as exc:
        return [exc] * n, ([False] * n if sanitize else None)
    if interned is None:
        interned = _backend.intern_rows(prompts, Message)
    rows, off, distinct, bad = interned
    in_context = getattr(flt, "_in_context", False)
    if not distinct or limit < 0 or (in_context and not _one_context(rows, off, len(distinct))):
        # (a counter that charges a message by where it stands, a chat template's, and a
        # message that stands after different ones in different prompts: no one count serves
        # every prompt that holds it; each prompt is trimmed as ``apply`` trims it)
        return _each(flt, _lists(prompts, interned), range(n), tools_schema, sanitize)
    vary = getattr(flt, "_vary", False)  # (what _limit said of these tools)
    try:
        outs, clean = _plan(flt, prompts, rows, off, distinct, bad, limit, tools_schema, sanitize,
                            _ContextCounts(flt, rows, off, distinct) if in_context else None)
        if vary:
            _fit_tools(flt, prompts, interned, outs, clean, tools_schema, sanitize)
    except Exception:  # a counter failing on one message: each prompt gets its own outcome
        return _each(flt, _lists(prompts, interned), range(n), tools_schema, sanitize)
    return outs, clean


def _fit_tools(flt: Any, prompts: Sequence[Any], interned: Any, outs: list[Any], clean: Optional[list[bool]],
               tools_schema: Any, sanitize: bool) -> None:
    """The outputs in which the tools cost more than the limit charged (``tools_surplus``:
    a chat template printing them again for a repeated last user message) made again the
    one-prompt way, which trims them further (``_WindowFilter._fit_tools``)."""
    counter = flt._counter  # (the counter _limit chose for these tools)
    rows, off, distinct, _ = interned
    for p, out in enumerate(outs):
        if type(out) is list and counter._user_repeats(out) and counter._repeat_surplus(tools_schema, out):
            _redo(flt, prompts[p] if prompts[p] is not None else _at(rows, off, distinct, p), p, outs, clean,
                  tools_schema, sanitize)


def _lists(prompts: Sequence[Any], interned: Any) -> Sequence[Any]:
    """``prompts`` with every ``None`` slot that has rows read out of them (a ``None`` listed
    in ``bad`` is the caller's own, not a list)."""
    if not any(p is None for p in prompts):
        return prompts
    rows, off, distinct, bad = interned
    skip = set(bad)
    return [_at(rows, off, distinct, i) if p is None and i not in skip else p for i, p in enumerate(prompts)]


def _at(rows: np.ndarray, off: np.ndarray, distinct: list[Any], p: int) -> list[Any]:
    """Prompt ``p`` read out of its rows."""
    return [distinct[r] for r in rows[off[p]:off[p + 1]].tolist()]


def _each(flt: Any, prompts: Sequence[Any], which: Any, tools_schema: Any, sanitize: bool) -> tuple[list[Any], Optional[list[bool]]]:
    outs: list[Any] = []
    clean: list[bool] = []
    for p in which:
        res = one(flt, prompts[p], tools_schema, sanitize)
        if isinstance(res, BaseException):
            outs.append(res)
            clean.append(False)
        else:
            outs.append(res[0])
            clean.append(res[1])
    return outs, (clean if sanitize else None)


def _one_context(rows: np.ndarray, off: np.ndarray, n_distinct: int) -> bool:
    """Whether every distinct message stands after the same one (or first) in every prompt
    that holds it: then, by induction, after the same messages, and a counter that charges a
    message by where it stands charges it the same in all of them."""
    if not len(rows):
        return True
    prev = np.empty_like(rows)
    prev[1:] = rows[:-1]
    starts = off[:-1][np.diff(off) > 0]
    prev[starts] = -1
    first = np.full(n_distinct, -2, dtype=prev.dtype)
    first[rows[::-1]] = prev[::-1]  # (the last write of each: its first appearance's)
    return bool(np.array_equal(first[rows], prev))


class _ContextCounts:
    """Counts of distinct messages for a counter that charges a message by where it stands
    (``_one_context`` holds): each counted where it first appears, in runs, by the filter's
    ``_counts`` over its prompt (which gives a run its unit's start and the message before)."""

    def __init__(self, flt: Any, rows: np.ndarray, off: np.ndarray, distinct: list[Any]) -> None:
        self.flt, self.rows, self.off, self.distinct = flt, rows, off, distinct
        first = np.empty(len(distinct), dtype=np.int64)
        first[rows[::-1]] = np.arange(len(rows) - 1, -1, -1)
        self.first = first

    def __call__(self, want: Any) -> np.ndarray:
        want = np.asarray(want, dtype=np.int64)
        out = np.empty(len(want), dtype=np.int64)
        if not len(want):
            return out
        pos = self.first[want]
        order = np.argsort(pos, kind="stable")
        pos_sorted = pos[order]
        prompt = np.searchsorted(self.off, pos_sorted, side="right") - 1
        breaks = np.flatnonzero((np.diff(pos_sorted) != 1) | (np.diff(prompt) != 0)) + 1
        rows, off, distinct, counts = self.rows, self.off, self.distinct, self.flt._counts
        got = np.empty(len(want), dtype=np.int64)
        msgs_of: dict[int, list[Any]] = {}
        for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), len(pos_sorted)]):
            p = int(prompt[a])
            msgs = msgs_of.get(p)
            if msgs is None:
                msgs = msgs_of[p] = [distinct[r] for r in rows[off[p]:off[p + 1]].tolist()]
            lo = int(pos_sorted[a]) - int(off[p])
            got[a:b] = counts(msgs, lo, lo + (b - a))
        out[order] = got
        return out


def _plan(flt, prompts, rows, off, distinct, bad, limit, tools_schema, sanitize, in_context=None):
    n = len(prompts)
    roles, call_off, call_ids, result_ids = _backend.table_records(distinct, _backend.ROLE_CODES)
    if in_context is not None:  # (see _ContextCounts)
        eager = in_context(np.arange(len(distinct))) if len(rows) / max(1, n - len(bad)) <= EAGER_MEAN_LEN else None
    else:
        eager = flt._eager_counts_many(distinct, len(rows) / max(1, n - len(bad)))
    # a copy: the counter's array is not ours to write into
    counts = np.full(len(distinct), -1, dtype=np.int64) if eager is None else np.array(eager, dtype=np.int64)
    args = (flt._mask, limit, flt.trim_from_start, flt.chunk, flt._pinned_free)
    while True:
        plans = _backend.plan_windows(rows, off, roles, counts, *args)
        want = _backend.need_rows(rows, off, plans, counts)
        if not len(want):
            if plans[:, 0].any():  # pragma: no cover - the planner asks only for missing counts
                raise RuntimeError("plan_windows asked for counts it already has")
            break
        counts[want] = in_context(want) if in_context is not None else counts_many(flt, [distinct[r] for r in want.tolist()])
    n_pinned, lo, hi = plans[:, 1], plans[:, 2], plans[:, 3]
    clean: Optional[list[bool]] = None
    if sanitize:
        status = _backend.sanitize_windows(
            rows, off, roles, call_off, call_ids, result_ids,
            np.ascontiguousarray(n_pinned), np.ascontiguousarray(lo), np.ascontiguousarray(hi),
        )
        clean = (status == 0).tolist()
    outs = _backend.gather_rows(distinct, rows, off, plans)  # a bad prompt has no rows: []
    # the prompts whose plan keeps nothing, or whose pinned prefix alone is everything
    # (checked against the limit here): their outcome is the one-prompt path's
    sizes = np.diff(off)
    odd = np.flatnonzero(((lo == hi) & (n_pinned < sizes)) | (n_pinned == sizes)).tolist()
    if odd:
        bad_set = set(bad)
        for p in odd:
            if p in bad_set:
                continue
            k, a, b, size = int(n_pinned[p]), int(lo[p]), int(hi[p]), int(sizes[p])
            if (a == b and k < size) or (
                    not flt._pinned_free and int(counts[rows[off[p]:off[p] + k]].sum()) > limit):
                _redo(flt, prompts[p] if prompts[p] is not None else _at(rows, off, distinct, p), p, outs, clean,
                      tools_schema, sanitize)
    for p in bad:
        _redo(flt, prompts[p], p, outs, clean, tools_schema, sanitize)
    return outs, clean


def _redo(flt, msgs, p, outs, clean, tools_schema, sanitize) -> None:
    res = one(flt, msgs, tools_schema, sanitize)
    if isinstance(res, BaseException):
        outs[p] = res
        ok = False
    else:
        outs[p], ok = res
    if clean is not None:
        clean[p] = ok


def one(flt: Any, msgs: Any, tools_schema: Any, sanitize: bool) -> Any:
    """``flt._trim(msgs, ...)``'s ``(output, clean)``, or the exception it raises."""
    try:
        return flt._trim(msgs, tools_schema, sanitize)
    except Exception as exc:
        return exc


def eager_counts_many(flt: Any, distinct: list[Message], mean_len: float) -> Optional[np.ndarray]:
    """Counts for every record at once when prompts are short (most of each is kept)."""
    return counts_many(flt, distinct) if mean_len <= EAGER_MEAN_LEN else None


def counts_many(flt: Any, msgs: list[Message]) -> np.ndarray:
    """int64 counts of many distinct messages (the filter's own ``_counts``). A large call
    with a ``TiktokenTokenCounter(engine="tiktoken")`` (thread-safe; tiktoken releases the
    GIL while it encodes) is split over two threads by the hash of the text, so a text two
    messages share is encoded by one thread. Not with the fastokens engine: it encodes a
    batch on all cores itself, and a second thread only contends with it (measured: 4x
    slower on 2 cores). Nor when no core is idle (the load average is above the CPU count
    minus one half): the two threads then wait on each other for the GIL (measured: 1.2-2.3x
    slower than one thread on 2 busy cores), nor below ``PARALLEL_CPUS`` CPUs (on 2 idle cores
    too, two threads measured slower than one). Either way the counts are the same."""
    counter = getattr(flt, "counter", None)
    if (len(msgs) < PARALLEL_MIN or _CPUS < PARALLEL_CPUS or type(counter) is not TiktokenTokenCounter
            or counter.engine != "tiktoken" or not _idle_core()):
        return flt._counts(msgs, 0, len(msgs))
    side0, side1, at0, at1 = _backend.text_sides(msgs)
    # the second side in a thread of its own, the first in this one meanwhile
    got: list[Any] = [None]

    def count_side1() -> None:
        try:
            got[0] = flt._counts(side1, 0, len(side1))
        except BaseException as exc:  # re-raised in the calling thread
            got[0] = exc

    worker = threading.Thread(target=count_side1, name="jianmu-batch-count", daemon=True)
    worker.start()
    try:
        counted0 = flt._counts(side0, 0, len(side0))
    finally:
        worker.join()
    if isinstance(got[0], BaseException):
        raise got[0]
    out = np.empty(len(msgs), dtype=np.int64)
    out[at0] = counted0
    out[at1] = got[0]
    return out


def _idle_core() -> bool:
    """Whether a core is likely idle for the second thread: the 1-minute load average (this
    process's own thread counts about 1) is at most ``cpus - 0.5``."""
    try:
        return os.getloadavg()[0] <= _CPUS - 0.5
    except OSError:  # pragma: no cover - not available on this platform
        return True
