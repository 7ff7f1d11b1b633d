"""Batch assembly: many prompts from one ``ContextBuilder``, equal to ``build()`` per state.

``build_batch(builder, states)`` returns ``[builder.build(s) for s in states]``, message for
message, but does the expensive parts once for the whole batch:

1. providers. With the usual builder (the library's own fixed-text providers around one
   ``StateHistoryProvider`` without working memory, none overridden), states that are dicts
   whose histories are prefixes of one conversation (by identity) share **one** provider
   call on the longest of them, and each gets its slice of that output (the history
   provider annotates a message from it and the messages before it only; the semantics
   note goes with any annotated message): ``group_states`` and ``prefix_groups`` of the
   compiled batch core. When the first filter is a trimming one (below), those prompts are
   never built as lists: ``pack_rows`` hands them to it as rows of its table (one row
   lookup per distinct message, a copy of the group's rows per state), and only the outputs
   are lists. Every other state runs the providers itself, in Python (they are
   user code); states whose ``"messages"`` lists start with the same Message are provided
   together, shortest first, so that an incremental provider only looks at the new
   messages; a provider with side effects may therefore see the states in another order
   than the input's;
2. each trimming filter stage (``MaxMessagesFilter``, ``TokenBudgetFilter``) runs the very
   routine of its ``apply()`` over every prompt at once (``_batch_plan.trim_many``): one C
   pass gives every distinct message a row of one table of records (role, count, interned
   call ids), the compiled planner ``plan_windows`` decides pinned prefix, units and window
   of every prompt in one call per round, the counts a round asks for are counted in
   **one** counter call (each distinct message once; the counters cache per text), and the
   outputs are sliced in C. Filters of any other type run per prompt, in pipeline order;
3. the sanitize step of ``build()``: when the last stage is such a filter, one compiled call
   (``sanitize_windows``) tells the valid prompts (almost all) from those that need the
   pure-Python sanitizer, which then runs for those only.

Errors behave as in ``build()``: an unexpected exception of a filter is logged and that
stage skipped for that prompt; an error of jianmu_fast's hierarchy (``ContextBudgetError``,
``ToolCallHistoryError``, ...) fails the state. ``on_error="raise"`` (the default) then
raises :class:`~jianmu_fast.errors.BatchError` naming the lowest failing index, with the
original error chained; ``on_error="skip"`` leaves ``[]`` in that slot of ``build_batch``'s
list and logs it. ``build_batch_report`` returns both the prompts (``None`` where a state
failed) and the failures, so a caller can tell an empty prompt from a failed one.

``workers > 1`` splits the states (grouped as above) into chunks run by a process pool (the
builder goes to each worker once; counters pickle by name); the results are unpickled
copies, equal to ``build()``'s but not the same objects, and keep the input order.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from operator import countOf
from typing import Any, Iterable, Literal, Optional, Sequence

from . import _backend
from ._batch_provide import provide_all, provider_order
from .errors import BatchError
from .memory.context._batch_plan import trim_many
from .memory.context.filters import MaxMessagesFilter, TokenBudgetFilter
from .message import Message, coerce_messages

__all__ = [
    "build_batch",
    "transform_batch",
    "build_batch_report",
    "transform_batch_report",
    "BatchReport",
    "BatchFailure",
]

logger = logging.getLogger("jianmu_fast.batch")

OnError = Literal["raise", "skip"]
_WINDOW_TYPES = (MaxMessagesFilter, TokenBudgetFilter)


@dataclass(frozen=True)
class BatchFailure:
    """A state of the batch that failed: its ``index`` and the ``error`` ``build()`` raises.

    >>> f = BatchFailure(3, ValueError("bad"))
    >>> f.reason
    'ValueError: bad'
    """

    index: int
    error: BaseException

    @property
    def reason(self) -> str:
        """``"<ErrorType>: <message>"``."""
        return f"{type(self.error).__name__}: {self.error}"


@dataclass
class BatchReport:
    """What ``build_batch_report`` returns: one slot per state, and the failures.

    ``prompts[i]`` is the prompt of state ``i``, or ``None`` when it failed; ``failures``
    lists the failed states in index order.

    >>> r = BatchReport(prompts=[[], None], failures=[BatchFailure(1, ValueError("x"))])
    >>> r.ok, [f.index for f in r.failures]
    (False, [1])
    """

    prompts: list[Optional[list[Message]]]
    failures: list[BatchFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no state failed."""
        return not self.failures

    def to_html(self, path: Any, counter: Any = None) -> None:
        """Write a self-contained HTML page of the batch to ``path``: prompt sizes (by
        ``counter``, default ``SimpleTokenCounter()``), messages per prompt, failures by kind
        with their state index (``jianmu_fast[report]``)."""
        from .report_html import batch_report_html, write_html

        write_html(path, batch_report_html(self, counter))


# -- public functions -----------------------------------------------------------------------


def build_batch(
    builder: Any,
    states: Iterable[Any],
    *,
    global_state: Any = None,
    ctx: Any = None,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    workers: int = 1,
    progress: bool = False,
    on_error: OnError = "raise",
) -> list[list[Message]]:
    """``[builder.build(s, global_state, ctx, tools_schema) for s in states]``, batched.

    With ``on_error="skip"`` a failed state gets ``[]`` (use ``build_batch_report`` to tell
    it apart from an empty prompt).

    >>> from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, MaxMessagesFilter
    >>> from jianmu_fast.message import human, ai
    >>> class History:
    ...     def get_messages(self, local_state, global_state=None, ctx=None):
    ...         return local_state["messages"]
    >>> b = ContextBuilder([StaticPromptProvider("Be brief."), History()], [MaxMessagesFilter(2)])
    >>> states = [{"messages": [human("a"), ai("b"), human("c")]}, {"messages": [human("x")]}]
    >>> [[m.content for m in p] for p in build_batch(b, states)]
    [['Be brief.', 'b', 'c'], ['Be brief.', 'x']]
    """
    report = build_batch_report(
        builder, states, global_state=global_state, ctx=ctx, tools_schema=tools_schema,
        workers=workers, progress=progress, on_error=on_error,
    )
    return _slots(report)


def transform_batch(
    builder: Any,
    message_lists: Iterable[Sequence[Any]],
    *,
    local_states: Optional[Sequence[Any]] = None,
    global_state: Any = None,
    ctx: Any = None,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    workers: int = 1,
    progress: bool = False,
    on_error: OnError = "raise",
) -> list[list[Message]]:
    """``[builder.transform(ms, local_state, ...) for ms in message_lists]``, batched.

    ``local_states`` (one per list, default ``None`` for each) is what the filters receive.

    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> b = ContextBuilder(filters=[MaxMessagesFilter(1)])
    >>> [[m.content for m in p] for p in transform_batch(b, [[{"role": "user", "content": "a"},
    ...                                                      {"role": "user", "content": "b"}]])]
    [['b']]
    """
    report = transform_batch_report(
        builder, message_lists, local_states=local_states, global_state=global_state, ctx=ctx,
        tools_schema=tools_schema, workers=workers, progress=progress, on_error=on_error,
    )
    return _slots(report)


def build_batch_report(
    builder: Any,
    states: Iterable[Any],
    *,
    global_state: Any = None,
    ctx: Any = None,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    workers: int = 1,
    progress: bool = False,
    on_error: OnError = "skip",
) -> BatchReport:
    """Like ``build_batch``, returning a :class:`BatchReport` (``None`` where a state failed).

    The default here is ``on_error="skip"``; with ``"raise"`` the first failure (lowest
    index) raises :class:`~jianmu_fast.errors.BatchError`.

    >>> from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter
    >>> from jianmu_fast.message import ai, tool
    >>> class History:
    ...     def get_messages(self, local_state, global_state=None, ctx=None):
    ...         return local_state
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> r = build_batch_report(ContextBuilder([History()], [MaxMessagesFilter(1)]),
    ...                        [[ai("ok")], [ai(None, tool_calls=call), tool("r", tool_call_id="c1")]])
    >>> [len(p) if p is not None else None for p in r.prompts], r.failures[0].index
    ([1, None], 1)
    >>> type(r.failures[0].error).__name__
    'ContextBudgetError'
    """
    return _run_public(builder, list(states), None, global_state, ctx, tools_schema, workers, progress, on_error)


def transform_batch_report(
    builder: Any,
    message_lists: Iterable[Sequence[Any]],
    *,
    local_states: Optional[Sequence[Any]] = None,
    global_state: Any = None,
    ctx: Any = None,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    workers: int = 1,
    progress: bool = False,
    on_error: OnError = "skip",
) -> BatchReport:
    """Like ``transform_batch``, returning a :class:`BatchReport`.

    >>> from jianmu_fast.memory.context import ContextBuilder
    >>> r = transform_batch_report(ContextBuilder(), [[{"role": "robot"}]])
    >>> r.prompts, r.failures[0].reason
    ([None], "MessageValidationError: messages[0].role: Input should be 'system', 'user', 'assistant' or 'tool'")
    """
    lists = list(message_lists)
    if local_states is None:
        states: list[Any] = [None] * len(lists)
    else:
        states = list(local_states)
        if len(states) != len(lists):
            raise ValueError(f"local_states has {len(states)} entries, message_lists has {len(lists)}")
    return _run_public(builder, states, lists, global_state, ctx, tools_schema, workers, progress, on_error)


# -- driver -----------------------------------------------------------------------------------


def _check_args(builder: Any, workers: Any, on_error: Any) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    for name in ("providers", "filters", "_provide", "_apply_filter", "_finish"):
        if not hasattr(builder, name):
            raise TypeError(f"builder: expected a ContextBuilder, got {type(builder).__name__} (no {name})")


def _run_public(builder, states, lists, global_state, ctx, tools_schema, workers, progress, on_error) -> BatchReport:
    _check_args(builder, workers, on_error)
    n = len(states)
    if workers > 1 and n > 1:
        report = _run_pool(builder, states, lists, global_state, ctx, tools_schema, workers, progress)
    else:
        bar = _progress_bar(n, progress)
        try:
            report = _run(builder, states, lists, global_state, ctx, tools_schema, bar)
        finally:
            if bar is not None:
                bar.close()
    if report.failures:
        if on_error == "raise":
            first = report.failures[0]
            raise BatchError(
                f"states[{first.index}] failed: {first.reason}. Fix that state, or pass "
                "on_error='skip' to build the others and collect the failures "
                "(build_batch_report).",
                index=first.index,
                error=first.error,
            ) from first.error
    return report


def _slots(report: BatchReport) -> list[list[Message]]:
    """``build_batch``'s list: a failed state (logged) gets ``[]``."""
    if not report.failures:  # every slot holds its prompt: the list as it is
        return report.prompts  # type: ignore[return-value]
    for f in report.failures:
        logger.warning("states[%d] skipped: %s", f.index, f.reason)
    return [p if p is not None else [] for p in report.prompts]


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is the optional extra "cli": no bar without it
        return None
    return tqdm(total=total, unit="prompt", file=sys.stderr, dynamic_ncols=True)


def _run(builder, states, lists, global_state, ctx, tools_schema, bar=None) -> BatchReport:
    """The single-process pipeline; never raises for a state, returns its failure.

    The cyclic garbage collector is paused meanwhile (and restored, also on error): a batch
    makes tens of thousands of new lists, which hold Messages and no reference cycles, and
    the collections they trigger scan them again and again, now and then in a full
    collection of the whole heap (~90 ms in the benchmark process). Measured on the
    10,000-prompt cs batch, the one scan left after the batch included: median 8-12 ms less
    of 130-160 ms. One young-generation pass is made right after the provider stage (only
    when the collector was on: a caller that turned it off gets no collection): the
    provider's new objects (annotated copies, its caches) are then scanned before the
    output lists exist, and the pass after the batch scans little more than those lists
    (measured on that batch: both passes together 2.2 ms instead of 3.6 ms for the one)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _run_stages(builder, states, lists, global_state, ctx, tools_schema, bar, paused)
    finally:
        if paused:
            gc.enable()


def _run_stages(builder, states, lists, global_state, ctx, tools_schema, bar=None,
                young_pass: bool = False) -> BatchReport:
    n = len(states)
    errors: dict[int, BaseException] = {}
    tick = bar.update if bar is not None else None
    # the rows of the prompts (intern_rows' result), while they are the provided or input
    # prompts; a provided prompt may then exist as rows only (None in `prompts`)
    interned = None
    filters = list(builder.filters)
    if lists is None:
        pack = n > 1 and bool(filters) and _batched(filters[0])
        prompts, interned = provide_all(builder, states, global_state, ctx, tools_schema, errors, tick, pack)
        if young_pass:
            gc.collect(0)  # see _run
    else:
        prompts, interned = _coerce_all(lists, errors, tick)
    alive = [i for i in range(n) if i not in errors] if errors else list(range(n))
    last = len(filters) - 1
    unclean: Optional[list[int]] = None  # what the last stage, a trimming one, found to need sanitizing
    for fi, flt in enumerate(filters):
        if _batched(flt) and len(alive) > 1:
            final = fi == last and bool(getattr(builder, "sanitize", False))
            unclean = _window_stage(flt, prompts, alive, tools_schema, errors, final, interned)
        else:
            if lists is not None:
                _unshare(prompts, lists, alive)
            for i in alive:
                _python_stage(builder, fi, prompts, i, states, global_state, ctx, tools_schema, errors)
        interned = None
        if errors:
            alive = [i for i in alive if i not in errors]
    if lists is not None:
        _unshare(prompts, lists, alive)
    # a prompt the last trimming stage found valid has nothing to sanitize (``unclean``: the
    # others, failed ones included; only set when that stage ran last with sanitizing on)
    if unclean is None:
        todo = alive
    else:
        todo = [i for i in unclean if i not in errors] if errors else unclean
    for i in todo:
        try:
            prompts[i] = builder._finish(prompts[i], tools_schema)
        except Exception as exc:
            errors[i] = exc
    for i in errors:
        prompts[i] = None
    if tick is not None:
        tick(n - (n // 256) * 256)
    return BatchReport(prompts, [BatchFailure(i, errors[i]) for i in sorted(errors)])


def _batched(flt: Any) -> bool:
    """Whether a filter stage runs over every prompt at once (``_window_stage``)."""
    return type(flt) in _WINDOW_TYPES and "apply" not in vars(flt)


def _coerce_all(lists, errors, tick) -> tuple[list[Any], Any]:
    """``(prompts, interned)``: the input lists as lists of Messages, and their rows
    (``intern_rows``, one C pass that also finds the lists that are not all Messages) when
    no list needed coercion. Lists that already hold only Messages are used as they are (no
    copy: trimming stages never change their input and return new lists; ``_unshare``
    copies one before anything else could see it)."""
    n = len(lists)
    interned = _backend.intern_rows(lists, Message)
    bad = interned[3]
    prompts = list(lists)
    for k, i in enumerate(bad):
        try:
            prompts[i] = coerce_messages(lists[i])
        except Exception as exc:
            errors[i] = exc
            prompts[i] = None
        if tick is not None and (k & 255) == 255:
            tick(256)
    done = n - len(bad)
    if tick is not None and done >= 256:
        tick(done - done % 256)
    return prompts, (None if bad else interned)


def _unshare(prompts: list[Any], lists: Sequence[Any], alive: list[int]) -> None:
    """Copy every prompt that is still the caller's own list."""
    for i in alive:
        if prompts[i] is lists[i]:
            prompts[i] = prompts[i][:]


def _python_stage(builder, fi, prompts, i, states, global_state, ctx, tools_schema, errors) -> None:
    try:
        prompts[i] = builder._apply_filter(fi, prompts[i], states[i], global_state, ctx, tools_schema)
    except Exception as exc:
        errors[i] = exc


def _window_stage(flt, prompts, alive, tools_schema, errors, final: bool, interned=None) -> Optional[list[int]]:
    """One trimming filter over every live prompt: the routine of its ``apply()`` for all of
    them (``_batch_plan.trim_many``: one table of records, one compiled plan per round, one
    count call per round, outputs sliced in C). ``interned``: the prompts' rows, when every
    prompt is alive and unchanged since ``intern_rows`` (a prompt may then be ``None``: its
    rows only). With ``final`` (the pipeline's last stage, sanitizing on), returns the live
    prompts it did not find valid (usually none); else ``None``."""
    every = len(alive) == len(prompts)
    outs, ok = trim_many(flt, prompts if every else [prompts[i] for i in alive], tools_schema,
                         final, interned if every else None)
    if every and countOf(map(type, outs), list) == len(outs):  # the usual case: no failure
        prompts[:] = outs
    else:
        for i, res in zip(alive, outs):
            if type(res) is list:
                prompts[i] = res
            else:
                errors[i] = res
    if not final:
        return None
    assert ok is not None
    if False not in ok:  # a C-level scan: the usual case
        return []
    return [i for i, good in zip(alive, ok) if not good]


# -- processes --------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(builder, global_state, ctx, tools_schema) -> None:
    _WORKER.update(builder=builder, global_state=global_state, ctx=ctx, tools_schema=tools_schema)


def _run_chunk(args) -> BatchReport:
    states, lists = args
    w = _WORKER
    return _run(w["builder"], states, lists, w["global_state"], w["ctx"], w["tools_schema"])


def _mp_context():
    methods = multiprocessing.get_all_start_methods()
    # fork shares the parent's loaded encodings and caches and starts in milliseconds
    return multiprocessing.get_context("fork" if "fork" in methods and sys.version_info < (3, 14) else None)


def _run_pool(builder, states, lists, global_state, ctx, tools_schema, workers, progress) -> BatchReport:
    """Contiguous chunks of the states (grouped as for the providers, so that the prefixes of
    one conversation meet the same worker's caches), run by a process pool; results are
    unpickled copies, equal to ``build()``'s, placed back in input order."""
    n = len(states)
    order = list(provider_order(states)) if lists is None else list(range(n))
    n_chunks = min(n, workers * 4)
    bounds = [n * k // n_chunks for k in range(n_chunks + 1)]
    chunks = [order[a:b] for a, b in zip(bounds, bounds[1:])]
    tasks = [([states[i] for i in c], None if lists is None else [lists[i] for i in c]) for c in chunks]
    bar = _progress_bar(n, progress)
    prompts: list[Optional[list[Message]]] = [None] * n
    failures: list[BatchFailure] = []
    try:
        with ProcessPoolExecutor(
            max_workers=min(workers, n_chunks),
            mp_context=_mp_context(),
            initializer=_init_worker,
            initargs=(builder, global_state, ctx, tools_schema),
        ) as pool:
            for chunk, part in zip(chunks, pool.map(_run_chunk, tasks)):
                for i, p in zip(chunk, part.prompts):
                    prompts[i] = p
                failures.extend(BatchFailure(chunk[f.index], f.error) for f in part.failures)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    failures.sort(key=lambda f: f.index)
    return BatchReport(prompts, failures)
