"""``sanitize_tool_call_history``: project a history onto one the model API accepts.

A *transaction* is an assistant message with a non-empty ``tool_calls`` list together with
the run of ``role="tool"`` messages directly after it. Matching is by **adjacency**: a tool
result answers a call of the assistant message that opens its run, never a call elsewhere,
so the same call id reused by two transactions of one conversation is valid.

A transaction is valid when every call has an id, the ids are distinct, and the results
answer each call exactly once (in any order). It is *broken* when a call has no result, a
result answers no call of its transaction (or has no ``tool_call_id``), a result is
duplicated, or two calls share an id. A run of tool messages that follows anything but an
assistant call message is an *orphan run*, also broken.

What happens to a broken unit:

- **historical** (some ``user`` or ``assistant`` message comes after it): the whole unit is
  dropped from the result, the assistant call message together with its results. The
  assistant's text goes too, on purpose: the text of a call message narrates that call
  ("let me look that up"), and after ``StateHistoryProvider`` annotation it renders the calls
  themselves, so keeping it would show the model a call whose results it never sees. The
  stored history is untouched, and :func:`sanitize_tool_call_history_report` lists every
  dropped index with its reason.
- **at the tail** (only ``system`` messages, or nothing, come after it: this is the turn
  being sent): :class:`~jianmu_fast.errors.ToolCallHistoryError` is raised, naming the message
  index, the role and the call ids, because dropping it would silently send a request
  without the newest turn.

A call without an id is given the id of its result when that is unambiguous: exactly one
call lacks an id and exactly one result of the transaction answers no call (and the result's
``name``, if set, does not contradict the call's function name); or else each call without an
id has a function name that occurs once among those calls and once among the ``name`` of the
unmatched results. The filled call is a copy (``model_copy``) with the same message ``id``.

Likewise a tool result without ``tool_call_id`` is paired with the call when that is
unambiguous: the assistant message has exactly one call and its run exactly one result (the
design document's ``tool('{"result": 4}', name="calculator")`` right after a single call),
and the result's ``name``, if set, is the call's function name. The result becomes a copy
with the call's id (when the call has no id either, both get ``"call_" + <assistant message
id>``, deterministic).

Fast path: a valid history costs one linear pass; the result is a new list holding the very
same Message objects (nothing is copied). Anything dropped is logged at WARNING, filled ids
at INFO, on the ``jianmu_fast.message`` logger.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

from ..errors import ToolCallHistoryError
from .model import Message, coerce_message

__all__ = [
    "sanitize_tool_call_history",
    "sanitize_tool_call_history_report",
    "SanitizeReport",
    "DroppedUnit",
    "FilledCallId",
    "FilledResultId",
]

logger = logging.getLogger("jianmu_fast.message")
_MESSAGE_TYPE = frozenset((Message,))


@dataclass(frozen=True)
class DroppedUnit:
    """A broken unit left out of the result.

    >>> DroppedUnit(indices=(3, 4), reason="call 'c2' has no result", call_ids=("c1", "c2")).indices
    (3, 4)
    """

    indices: tuple[int, ...]
    """Input positions of the dropped messages (the assistant call message first, if any)."""
    reason: str
    """Why the unit is broken, in words."""
    call_ids: tuple[Optional[str], ...] = ()
    """Ids of the calls of the unit's assistant message (``None`` for a call without id)."""


@dataclass(frozen=True)
class FilledCallId:
    """A call id taken from its result.

    >>> FilledCallId(index=1, call_index=0, tool_call_id="c1").tool_call_id
    'c1'
    """

    index: int
    """Input position of the assistant message."""
    call_index: int
    """Position of the call in its ``tool_calls``."""
    tool_call_id: str
    """The id it was given."""


@dataclass(frozen=True)
class FilledResultId:
    """A tool result's ``tool_call_id`` taken from the single call it answers.

    >>> FilledResultId(index=2, tool_call_id="c1").index
    2
    """

    index: int
    """Input position of the tool message."""
    tool_call_id: str
    """The id it was given."""


@dataclass
class SanitizeReport:
    """What :func:`sanitize_tool_call_history_report` did.

    >>> from jianmu_fast.message import human
    >>> r = sanitize_tool_call_history_report([human("hi")])
    >>> r.changed, r.dropped_indices, len(r.messages)
    (False, [], 1)
    """

    messages: list[Message]
    """The sanitized messages."""
    dropped: list[DroppedUnit] = field(default_factory=list)
    """Broken units left out, oldest first."""
    filled: list[FilledCallId] = field(default_factory=list)
    """Call ids filled from their results."""
    filled_results: list[FilledResultId] = field(default_factory=list)
    """Result ids filled from their single call."""

    @property
    def changed(self) -> bool:
        """Whether anything was dropped or filled."""
        return bool(self.dropped or self.filled or self.filled_results)

    @property
    def dropped_indices(self) -> list[int]:
        """Every dropped input position, ascending."""
        return [i for d in self.dropped for i in d.indices]


def _call_id(call: dict[str, Any]) -> Optional[str]:
    cid = call.get("id")
    return cid if cid else None  # an empty id is as good as none


def _call_name(call: dict[str, Any]) -> Optional[str]:
    fn = call.get("function")
    return fn.get("name") if isinstance(fn, dict) else None


def _pair_single(
    head: Message, calls: list[dict[str, Any]], results: Sequence[Message]
) -> Optional[tuple[dict[int, str], str]]:
    """One call, one result without ``tool_call_id`` whose name does not contradict the
    call's: ``(call fills, the result's id)``; else ``None``."""
    if len(calls) != 1 or len(results) != 1 or results[0].tool_call_id:
        return None
    rname = results[0].name
    if rname is not None and rname != _call_name(calls[0]):
        return None
    cid = _call_id(calls[0])
    if cid is None:
        cid = f"call_{head.id}"
        return {0: cid}, cid
    return {}, cid


def _check_transaction(
    calls: list[dict[str, Any]], results: Sequence[Message]
) -> tuple[Optional[str], dict[int, str]]:
    """``(reason, fills)``: reason is ``None`` for a valid transaction once ``fills``
    (call position -> id) are applied."""
    ids: list[Any] = [_call_id(c) for c in calls]  # None where missing; str once filled
    rids: list[Any] = [r.tool_call_id or None for r in results]
    for k, rid in enumerate(rids):
        if rid is None:
            return f"tool result #{k + 1} has no tool_call_id", {}
    known = [i for i in ids if i is not None]
    if len(set(known)) != len(known):
        dup = sorted(i for i, n in Counter(known).items() if n > 1)
        return f"calls share the id(s) {dup}", {}
    if len(set(rids)) != len(rids):
        dup = sorted(i for i, n in Counter(rids).items() if n > 1)
        return f"duplicated result(s) for {dup}", {}
    fills: dict[int, str] = {}
    missing = [k for k, i in enumerate(ids) if i is None]
    if missing:
        known_set = set(known)
        unmatched = [(rid, r.name) for rid, r in zip(rids, results) if rid not in known_set]
        if len(missing) == 1 and len(unmatched) == 1:
            rid, rname = unmatched[0]
            cname = _call_name(calls[missing[0]])
            if rname is None or rname == cname:
                fills[missing[0]] = rid
        if not fills:
            cnames = [_call_name(calls[k]) for k in missing]
            rnames = Counter(n for _, n in unmatched if n is not None)
            if all(n is not None and cnames.count(n) == 1 and rnames[n] == 1 for n in cnames):
                by_name = {n: rid for rid, n in unmatched if n is not None}
                fills = {k: by_name[n] for k, n in zip(missing, cnames) if n is not None}
        if not fills:
            return f"{len(missing)} call(s) without id and no unambiguous result to take it from", {}
        for k, rid in fills.items():
            ids[k] = rid
    want = set(ids)
    got = set(rids)
    if want == got:
        return None, fills
    parts = []
    if want - got:
        parts.append(f"call(s) {sorted(want - got)} have no result")
    if got - want:
        parts.append(f"result(s) for {sorted(got - want)} answer no call of this assistant message")
    return "; ".join(parts), {}


def _tail_error(index: int, unit: list[Message], reason: str) -> ToolCallHistoryError:
    """The error for a broken newest unit; it also carries ``index``, ``role``, ``call_ids``
    and ``reason`` as attributes (kept by pickling)."""
    head = unit[0]
    if head.role == "assistant":
        ids = [_call_id(c) for c in head.tool_calls or ()]
        err = ToolCallHistoryError(
            f"messages[{index}] (role='assistant', tool_call ids={ids}): the newest tool-call "
            f"transaction is broken: {reason}. Cannot send the newest turn: append one role='tool' "
            "message per call (tool_call_id set to the call's id) right after it, or remove the "
            "unanswered calls before building the prompt."
        )
    else:
        ids = [m.tool_call_id for m in unit]
        err = ToolCallHistoryError(
            f"messages[{index}] (role='tool', tool_call_id={ids[0]!r}; run of {len(unit)} tool "
            f"message(s) with ids {ids}): answers no tool_call of an assistant message right before "
            "it. Cannot send the newest turn: drop these tool messages, or add the assistant message "
            "that issued the calls directly before them."
        )
    err.index, err.role, err.call_ids, err.reason = index, head.role, tuple(ids), reason  # type: ignore[attr-defined]
    return err


def _scan(
    messages: Sequence[Any], on_tail: Literal["raise", "drop"]
) -> tuple[Optional[list[Message]], list[DroppedUnit], list[FilledCallId], list[FilledResultId], list[Message]]:
    """One pass. Returns ``(out or None when unchanged, dropped, filled, filled results, coerced)``."""
    n = len(messages)
    items: Any = messages
    if not set(map(type, messages)) <= _MESSAGE_TYPE:  # C-level check: all plain Messages
        items = [m if isinstance(m, Message) else coerce_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    out: Optional[list[Message]] = None
    dropped: list[DroppedUnit] = []
    filled: list[FilledCallId] = []
    filled_results: list[FilledResultId] = []
    pending_tail: Optional[tuple[int, list[Message], str]] = None
    i = 0
    while i < n:
        m = items[i]
        role = m.role
        if role == "assistant" and m.tool_calls:
            calls = m.tool_calls
            j = i + 1
            while j < n and items[j].role == "tool":
                j += 1
            k = j - i - 1
            if k == 1 and len(calls) == 1:  # fast path: the usual single call, answered once
                cid = calls[0].get("id")
                ok = bool(cid) and items[i + 1].tool_call_id == cid
            elif k == len(calls):
                ids = {c.get("id") for c in calls}
                ok = len(ids) == k and None not in ids and "" not in ids and ids == {
                    items[x].tool_call_id for x in range(i + 1, j)
                }
            else:
                ok = False
            if ok:
                if out is not None:
                    out.extend(items[i:j])
                if pending_tail is not None:
                    pending_tail = None
                i = j
                continue
            paired = _pair_single(m, calls, items[i + 1 : j])
            if paired is not None:
                fills, rid = paired
                if out is None:
                    out = list(items[:i])
                if fills:
                    out.append(m.model_copy(update={"tool_calls": [dict(calls[0], id=rid)]}))
                    filled.append(FilledCallId(i, 0, rid))
                else:
                    out.append(m)
                out.append(items[i + 1].model_copy(update={"tool_call_id": rid}))
                filled_results.append(FilledResultId(i + 1, rid))
                pending_tail = None
                i = j
                continue
            reason, fills = _check_transaction(calls, items[i + 1 : j])
        elif role == "tool":
            j = i + 1
            while j < n and items[j].role == "tool":
                j += 1
            reason, fills = "tool result(s) follow no assistant tool-call message", {}
        else:
            if pending_tail is not None and role != "system":
                pending_tail = None  # a user/assistant message came after: it was historical
            if out is not None:
                out.append(m)
            i += 1
            continue
        if pending_tail is not None:
            pending_tail = None
        if reason is None and not fills:
            if out is not None:
                out.extend(items[i:j])
        elif reason is None:
            if out is None:
                out = list(items[:i])
            calls = [dict(c, id=fills[k]) if k in fills else c for k, c in enumerate(m.tool_calls)]
            out.append(m.model_copy(update={"tool_calls": calls}))
            out.extend(items[i + 1 : j])
            filled.extend(FilledCallId(i, k, cid) for k, cid in sorted(fills.items()))
        else:
            if out is None:
                out = list(items[:i])
            unit = list(items[i:j])
            call_ids = tuple(_call_id(c) for c in m.tool_calls) if role == "assistant" else ()
            dropped.append(DroppedUnit(tuple(range(i, j)), reason, call_ids))
            pending_tail = (i, unit, reason)
        i = j
    if pending_tail is not None and on_tail == "raise":
        raise _tail_error(*pending_tail)
    return out, dropped, filled, filled_results, items


def sanitize_tool_call_history_report(
    messages: Sequence[Any], *, on_broken_tail: Literal["raise", "drop"] = "raise"
) -> SanitizeReport:
    """Sanitize ``messages`` (Messages or chat-completions dicts) and say what was done.

    ``on_broken_tail="drop"`` drops a broken newest unit like a historical one instead of
    raising (for inspecting stored histories; never use it to build a request).

    >>> from jianmu_fast.message import human, ai, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]
    >>> r = sanitize_tool_call_history_report([human("q"), ai("checking", tool_calls=call), human("?")])
    >>> [m.content for m in r.messages], r.dropped_indices, r.dropped[0].reason
    (['q', '?'], [1], "call(s) ['c1'] have no result")
    """
    if on_broken_tail not in ("raise", "drop"):
        raise ValueError(f"on_broken_tail must be 'raise' or 'drop', got {on_broken_tail!r}")
    if isinstance(messages, (str, bytes, dict)):
        raise TypeError(f"messages: expected a list of messages, got {type(messages).__name__}")
    out, dropped, filled, filled_results, items = _scan(messages, on_broken_tail)
    result = out if out is not None else list(items)
    if dropped:
        logger.warning(
            "sanitize_tool_call_history: dropped %d broken tool-call unit(s) from the request "
            "(the stored history is unchanged): %s",
            len(dropped),
            "; ".join(f"messages{list(d.indices)}: {d.reason}" for d in dropped),
        )
    if filled:
        logger.info(
            "sanitize_tool_call_history: filled %d call id(s) from their results: %s",
            len(filled),
            ", ".join(f"messages[{f.index}].tool_calls[{f.call_index}].id={f.tool_call_id!r}" for f in filled),
        )
    if filled_results:
        logger.info(
            "sanitize_tool_call_history: paired %d tool result(s) without tool_call_id with their single call: %s",
            len(filled_results),
            ", ".join(f"messages[{f.index}].tool_call_id={f.tool_call_id!r}" for f in filled_results),
        )
    return SanitizeReport(result, dropped, filled, filled_results)


def sanitize_tool_call_history(messages: Sequence[Any]) -> list[Message]:
    """Return ``messages`` without broken historical tool-call transactions.

    See the module docstring for the rules. Raises :class:`ToolCallHistoryError` when the
    newest transaction is broken. A valid history comes back as a new list of the same
    Message objects.

    >>> from jianmu_fast.message import human, ai, tool
    >>> call = [{"type": "function", "function": {"name": "calc", "arguments": "{}"}}]
    >>> out = sanitize_tool_call_history([human("2+2?"), ai(None, tool_calls=call),
    ...                                   tool("4", tool_call_id="c1"), ai("4")])
    >>> out[1].tool_calls[0]["id"]        # filled from the one adjacent result
    'c1'
    >>> call[0]["id"] = "c7"
    >>> sanitize_tool_call_history([human("2+2?"), ai(None, tool_calls=call)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jianmu_fast.errors.ToolCallHistoryError: messages[1] (role='assistant', tool_call ids=['c7']): the newest tool-call transaction is broken: call(s) ['c7'] have no result. ...
    """
    return sanitize_tool_call_history_report(messages).messages
