"""The trimming stages of ``jianmu_fast.batch``: every prompt's tail counted in one pass per
step, every window decided in one call of the compiled core.

For a ``MaxMessagesFilter`` or ``TokenBudgetFilter`` stage over many prompts:

1. each prompt's pinned prefix is found as the filter finds it;
2. walking back from the newest message in steps (each ending on a unit start; the first
   sized from the budget, the next from the average cost per message seen so far), the tails of all prompts still walking are concatenated and
   counted by one ``count_array`` call per step, each distinct Message object once; a prompt
   stops walking when its tail costs more than its budget left after the pinned prefix (its
   kept run then lies inside the tail, since the core walks from the newest unit) or reaches
   the pinned prefix. With ``trim_from_start=False`` or chunked eviction the whole history
   after the pinned prefix is counted, as the filter does;
3. pinned counts, tail counts and local unit starts are CSR-packed, and one call of
   ``_backend.select_windows`` decides every prompt;
4. a prompt where nothing fits (``lo == hi``), where everything is pinned, or whose limit is
   negative goes back to the filter's own ``apply`` so that its error (or result) is exactly
   the filter's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter

import numpy as np

from . import _backend
from .memory.context.counters import TiktokenTokenCounter
from .memory.context.filters import TokenBudgetFilter, _pinned_count, _unit_start_at_or_before
from .message import Message

__all__ = ["decide_windows"]

_role = attrgetter("role")
_PARALLEL_MIN = 2048  # messages in one count call before it is split over two threads
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

class _Rec:
    """One prompt of a window stage: its tail ``msgs[start:]`` and the counts found so far."""

    __slots__ = ("index", "msgs", "n_pinned", "start", "parts", "total", "pinned", "pinned_cost", "step")

    def __init__(self, index: int, msgs: list[Message], n_pinned: int) -> None:
        self.index = index
        self.msgs = msgs
        self.n_pinned = n_pinned
        self.start = len(msgs)  # the tail counted so far is msgs[start:]
        self.parts: list[list[int]] = []  # tail counts, newest part first
        self.total = 0  # what the tail costs
        self.pinned: list[int] = []  # counts of msgs[:n_pinned]
        self.pinned_cost = 0
        self.step = 0  # how far the next step walks back


def decide_windows(flt, prompts, alive, tools_schema=None) -> tuple[dict[int, list[Message]], list[int]]:
    limit = flt._limit(tools_schema)
    roles = flt.pinned_roles
    walk = flt.trim_from_start and flt.chunk == 0
    slow: list[int] = []
    recs: list[_Rec] = []
    for i in alive:
        msgs = prompts[i]
        n_pinned = _pinned_count(msgs, roles)
        if n_pinned == len(msgs) or limit < 0:
            slow.append(i)
        else:
            recs.append(_Rec(i, msgs, n_pinned))
    if not recs:
        return {}, slow

    if type(flt) is TokenBudgetFilter:
        _count_tails(flt, recs, limit, walk)
    else:  # one per message, the pinned prefix is free: a tail of limit + 1 messages suffices
        for r in recs:
            n = len(r.msgs)
            r.start = _unit_start_at_or_before(r.msgs, max(r.n_pinned, n - limit - 1), r.n_pinned) if walk else r.n_pinned
            r.parts.append([1] * (n - r.start))
            r.pinned = [0] * r.n_pinned

    # CSR-pack: per prompt, counts = pinned counts + tail counts; unit starts are local
    flat: list[int] = []
    flat_msgs: list[Message] = []
    offsets = [0]
    for r in recs:
        msgs, n_pinned = r.msgs, r.n_pinned
        flat += r.pinned
        for part in reversed(r.parts):
            flat += part
        r.parts = r.pinned = []  # type: ignore[assignment]  # the counts now live in flat only
        if n_pinned:
            flat_msgs += msgs[:n_pinned]
        flat_msgs += msgs[r.start:]
        offsets.append(len(flat))
    i64 = np.int64
    counts = np.array(flat, dtype=i64)
    del flat
    not_tool = np.fromiter(map("tool".__ne__, map(_role, flat_msgs)), dtype=bool, count=len(flat_msgs))
    del flat_msgs
    off = np.array(offsets, dtype=i64)
    n_pinned_arr = np.array([r.n_pinned for r in recs], dtype=i64)
    # a unit starts at the first message after the pinned prefix and at every later non-tool one
    prompt_of = np.repeat(np.arange(len(recs), dtype=np.int32), np.diff(off))
    local = np.arange(len(counts), dtype=i64)
    local -= off[:-1][prompt_of]
    pinned = n_pinned_arr[prompt_of]
    is_start = local > pinned
    is_start &= not_tool
    is_start |= local == pinned
    del pinned, not_tool
    unit_offsets = np.zeros(len(recs) + 1, dtype=i64)
    np.cumsum(np.bincount(prompt_of[is_start], minlength=len(recs)), out=unit_offsets[1:])
    del prompt_of
    starts = np.ascontiguousarray(local[is_start])
    del local, is_start
    lo, hi = _backend.select_windows(
        counts,
        off,
        starts,
        unit_offsets,
        n_pinned_arr,
        np.full(len(recs), limit, dtype=i64),
        flt.trim_from_start,
        flt.chunk,
    )
    decided: dict[int, list[Message]] = {}
    for r, a, b in zip(recs, lo.tolist(), hi.tolist()):
        if a == b:  # nothing fits: the filter raises its own, exact ContextBudgetError
            slow.append(r.index)
            continue
        shift = r.start - r.n_pinned
        decided[r.index] = r.msgs[:r.n_pinned] + r.msgs[a + shift:b + shift]
    return decided, slow


def _count_tails(flt, recs: list[_Rec], limit: int, walk: bool) -> None:
    """Count every record's pinned prefix and a tail long enough to hold its kept run:
    one ``count_array`` call per step, over all records still walking back.

    The first step is ``limit // 100`` messages (8 to 64); each later step aims at what the
    budget left needs at the average cost per message seen so far, plus a quarter, and is
    at least half of what was counted already, so a prompt needs few steps however its
    message sizes vary."""
    pending = recs
    for r in recs:
        r.step = min(64, max(8, limit // 100))
    first = True
    while pending:
        segs: list[Message] = []
        spans: list[int] = []
        for r in pending:
            msgs, n_pinned = r.msgs, r.n_pinned
            if first and n_pinned:
                segs += msgs[:n_pinned]
            start = _unit_start_at_or_before(msgs, max(n_pinned, r.start - r.step), n_pinned) if walk else n_pinned
            segs += msgs[start:r.start]
            spans.append(start)
        counts = _count_unique(flt, segs)
        pos = 0
        still = []
        for r, start in zip(pending, spans):
            n_pinned = r.n_pinned
            if first and n_pinned:
                r.pinned = counts[pos:pos + n_pinned]
                r.pinned_cost = sum(r.pinned)
                pos += n_pinned
            part = counts[pos:pos + r.start - start]
            pos += r.start - start
            r.parts.append(part)
            r.total += sum(part)
            r.start = start
            left = limit - r.pinned_cost - r.total
            if start > n_pinned and left >= 0:
                counted = len(r.msgs) - start
                per = r.total // counted if r.total >= counted else 1
                r.step = max(8, counted // 2, (left // per) * 5 // 4 + 2)
                still.append(r)
        pending = still
        first = False


def _count_unique(flt, segs: list[Message]) -> list[int]:
    """Counts of ``segs``, each distinct Message object handed to the counter once (prompts
    that are prefixes of one conversation share most of their tails)."""
    by_id = {id(m): m for m in segs}
    if len(by_id) == len(segs):
        return _count(flt, segs)
    counts = _count(flt, list(by_id.values()))
    by_id_count = dict(zip(by_id, counts))
    return list(map(by_id_count.__getitem__, map(id, segs)))


def _count(flt, msgs: list[Message]) -> list[int]:
    """``flt``'s counts of ``msgs``. A large call with a ``TiktokenTokenCounter`` (thread-safe,
    and tiktoken releases the GIL while it encodes) is split over two threads: cold, that
    encodes the new texts on two cores; warm, it costs one thread start. A text is encoded by
    one thread only, unless a tool call's name or arguments equal another message's whole
    text (then both sides may encode it once)."""
    def run(part: list[Message]) -> list[int]:
        return np.asarray(flt._counts(part, 0, len(part)), dtype=np.int64).tolist()

    if len(msgs) < _PARALLEL_MIN or type(getattr(flt, "counter", None)) is not TiktokenTokenCounter or _CPUS < 2:
        return run(msgs)
    # Split by the hash of the text, so that a text two messages share is not encoded by both
    # threads; messages with several texts (tool calls, names, blocks) stay on one side.
    sides: tuple[list[int], list[int]] = ([], [])
    for i, m in enumerate(msgs):
        c = m.content
        simple = type(c) is str and m.tool_calls is None and m.name is None
        sides[hash(c) & 1 if simple else 0].append(i)
    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(run, ([msgs[i] for i in sides[0]], [msgs[i] for i in sides[1]])))
    out = [0] * len(msgs)
    for side, counts in zip(sides, parts):
        for i, n in zip(side, counts):
            out[i] = n
    return out
