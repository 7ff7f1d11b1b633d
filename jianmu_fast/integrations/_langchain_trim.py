"""``trim_messages``: LangChain's signature and return type, whole tool-call transactions.

A *unit* is an ``AIMessage`` with ``tool_calls`` together with the ``ToolMessage`` run right
after it, or any other single message. Units are kept or dropped whole, so the output never
holds a ``ToolMessage`` whose call was cut off (langchain#33245) nor a call without its
results. Everything else follows ``langchain_core.messages.trim_messages``.

How ``token_counter`` is counted (each message is counted once per call; LangChain calls a
list counter on a growing prefix O(log n) times, re-tokenizing it every time):

=====================================  =====================================================
``token_counter``                      cost of a kept list
=====================================  =====================================================
a jianmu_fast counter (``count_message``  ``counter.count_messages(converted list)``: the
/ ``count_messages``)                  per-request overhead once, each message through the
                                       counter's text cache; conversions cached by identity
an encoding or model name              a cached ``TiktokenTokenCounter(name)`` (as above);
(``"o200k_base"``, ``"gpt-4o"``)       the default is ``"o200k_base"``
``"approximate"``                      LangChain's ``count_tokens_approximately``, as a list
                                       counter (next row)
a list counter ``f(list) -> int``      ``f([]) + sum(f([m]) - f([]))`` (``f([])`` is the
(``len``, a model's                    per-request overhead, 0 when ``f([])`` fails): exact
``get_num_tokens_from_messages``)      for counters that add per message; LangChain counts
                                       a counter's overhead once per call instead
a per-message counter ``f(m) -> int``  ``sum(f(m))``; recognised as LangChain does, by the
(first parameter annotated             annotation of its first parameter (the string
``BaseMessage``)                       ``"BaseMessage"`` counts too)
=====================================  =====================================================

Where LangChain's behaviour is ambiguous or invalid, and what this function does:

======================================  ====================================================
LangChain                               here
======================================  ====================================================
``strategy="last"`` cuts between an     the whole transaction is kept or dropped
``AIMessage`` and its ``ToolMessage``
results, leaving orphan results
(an invalid request; #33245)
``start_on`` / ``end_on`` drop single   they drop whole units: ``end_on`` tests a unit's
messages, so they can split a           last message, ``start_on`` its first message (a
transaction too                         transaction also starts on ``"tool"``)
``allow_partial`` can cut the content   only a single-message unit without tool calls is
of a tool call or result message        cut; a transaction is never partial
a broken input transaction is passed    a broken historical one is left out (logged at
through                                 WARNING); a broken newest one raises
                                        ``ToolCallHistoryError`` naming the index
``include_system`` keeps the system     ``ContextBudgetError``: it cannot fit
message even when it alone is over
``max_tokens``
``include_system`` counts the system    the overhead is counted once: ``cost(output) <=
message and the rest in two counter     max_tokens`` holds for the whole output
calls (overhead twice)
======================================  ====================================================

With a jianmu_fast counter (or a name) each message is converted for counting, so it must be a
``SystemMessage``, ``HumanMessage``, ``AIMessage`` or ``ToolMessage`` (another type raises
``MessageValidationError`` naming its index); LangChain's own counters take any message.

Like LangChain, a unit that does not fit ends the run (the output is contiguous), and when
nothing fits the result is empty (or only the system message) rather than an error: that is
``trim_messages``'s contract. ``TokenBudgetFilter`` raises instead.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable, Literal, Optional, Sequence

from ..errors import ContextBudgetError, ToolCallHistoryError

__all__ = ["trim_messages"]

logger = logging.getLogger("jianmu_fast.integrations")
_NAMED: dict[str, Any] = {}
_CONVERTER: Any = None


def _converter() -> Any:
    # imported here: jianmu_fast.integrations.langchain imports this module at its end
    global _CONVERTER
    if _CONVERTER is None:
        from .langchain import MessageConverter

        _CONVERTER = MessageConverter()
    return _CONVERTER


def _is_type(m: Any, spec: Any) -> bool:
    types = [spec] if isinstance(spec, (str, type)) else list(spec)
    return any(m.type == t if isinstance(t, str) else isinstance(m, t) for t in types)


def _has_calls(m: Any) -> bool:
    return m.type == "ai" and bool(getattr(m, "tool_calls", None))


def _check(calls: list[dict[str, Any]], results: Sequence[Any]) -> Optional[str]:
    ids: list[Any] = [c.get("id") for c in calls]
    rids: list[Any] = [r.tool_call_id for r in results]
    if len(ids) == len(rids) and all(ids) and len(set(ids)) == len(ids) and set(ids) == set(rids):
        return None  # the usual case, decided in one pass
    if not all(ids):
        return "a call has no id"
    if len(set(ids)) != len(ids):
        return f"calls share ids {sorted(map(str, ids))}"
    if len(set(rids)) != len(rids):
        return f"duplicated results for {sorted(map(str, rids))}"
    if set(ids) == set(rids):
        return None
    parts = []
    if set(ids) - set(rids):
        parts.append(f"call(s) {sorted(set(ids) - set(rids))} have no result")
    if set(rids) - set(ids):
        parts.append(f"result(s) for {sorted(set(rids) - set(ids))} answer no call of this AIMessage")
    return "; ".join(parts)


def _unit_ending_at(msgs: Sequence[Any], end: int, lo: int) -> tuple[int, Optional[str]]:
    j = end - 1
    m = msgs[j]
    if m.type != "tool":
        if _has_calls(m):
            return j, f"call(s) {[c.get('id') for c in m.tool_calls]} have no result"
        return j, None
    while j > lo and msgs[j - 1].type == "tool":
        j -= 1
    if j > lo and _has_calls(msgs[j - 1]):
        return j - 1, _check(msgs[j - 1].tool_calls, msgs[j:end])
    return j, "tool result(s) follow no AIMessage with tool_calls"


def _unit_starting_at(msgs: Sequence[Any], start: int, hi: int) -> tuple[int, Optional[str]]:
    m = msgs[start]
    j = start + 1
    while j < hi and msgs[j].type == "tool":
        j += 1
    if m.type == "tool":
        return j, "tool result(s) follow no AIMessage with tool_calls"
    if _has_calls(m):
        return j, _check(m.tool_calls, msgs[start + 1:j])
    return start + 1, None


class _Cost:
    """Per-message costs and the per-request overhead (``base``) of one counter."""

    def __init__(self, one: Callable[[Any, int], int], of: Callable[[Any], int], base: int) -> None:
        self.one, self.of, self.base = one, of, base


def _named_counter(name: str) -> Any:
    c = _NAMED.get(name)
    if c is None:
        from ..memory.context import TiktokenTokenCounter

        try:
            c = TiktokenTokenCounter(name)
        except ValueError as exc:
            raise ValueError(
                f"Invalid token_counter shortcut {name!r}. Available shortcuts: 'approximate', or a "
                f"tiktoken encoding or model name ({exc})"
            ) from None
        _NAMED[name] = c
    return c


def _list_cost(fn: Callable[[list[Any]], int]) -> _Cost:
    try:
        base = int(fn([]))
    except Exception:  # a counter that refuses an empty list has no measurable overhead
        base = 0
    return _Cost(lambda m, i: fn([m]) - base, lambda m: fn([m]) - base, base)


def _make_cost(token_counter: Any) -> _Cost:
    tc = token_counter
    if isinstance(tc, str):
        if tc == "approximate":
            from langchain_core.messages.utils import count_tokens_approximately

            return _list_cost(count_tokens_approximately)
        tc = _named_counter(tc)
    if callable(getattr(tc, "count_message", None)) and callable(getattr(tc, "count_messages", None)):
        counter, conv = tc, _converter()
        from .langchain import message_from_langchain

        return _Cost(lambda m, i: counter.count_message(conv(m, f"messages[{i}]")),
                     lambda m: counter.count_message(message_from_langchain(m)),
                     int(counter.count_messages([])))
    if hasattr(tc, "get_num_tokens_from_messages"):
        return _list_cost(tc.get_num_tokens_from_messages)
    if callable(tc):
        try:
            first = next(iter(inspect.signature(tc).parameters.values()), None)
        except (TypeError, ValueError):
            first = None
        ann = getattr(first, "annotation", None)
        from langchain_core.messages import BaseMessage

        if ann is BaseMessage or ann == "BaseMessage":
            return _Cost(lambda m, i: tc(m), tc, 0)
        return _list_cost(tc)
    raise ValueError(
        "'token_counter' expected to be a model that implements 'get_num_tokens_from_messages()' or a "
        f"function. Received object of type {type(token_counter)}."
    )


def _default_text_splitter(text: str) -> list[str]:
    splits = text.split("\n")
    return [s + "\n" for s in splits[:-1]] + splits[-1:]


def _partial(m: Any, avail: int, of: Callable[[Any], int], splitter: Callable[[str], list[str]],
             which: str) -> Optional[Any]:
    """LangChain's partial message: drop content blocks from the far end, else split the text."""
    content = m.content
    text = None
    if isinstance(content, list):
        blocks = content[::-1] if which == "last" else list(content)
        for _ in range(1, len(blocks)):
            blocks = blocks[:-1]
            cand = m.model_copy(update={"content": blocks[::-1] if which == "last" else blocks}, deep=True)
            if of(cand) <= avail:
                return cand
        for b in blocks:  # LangChain takes the text of the block left after the loop
            if isinstance(b, str):
                text = b
                break
            if isinstance(b, dict) and b.get("type") == "text":
                text = b.get("text")
                break
    elif isinstance(content, str):
        text = content
    if not text:
        return None
    splits = splitter(text)
    if which == "last":
        splits = splits[::-1]

    def join(k: int) -> str:
        return "".join(splits[:k][::-1] if which == "last" else splits[:k])

    lo, hi = 0, len(splits)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if of(m.model_copy(update={"content": join(mid)})) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return m.model_copy(update={"content": join(lo)}, deep=True) if lo else None


def _can_split(msgs: Sequence[Any], s: int, e: int) -> bool:
    return e - s == 1 and msgs[s].type != "tool" and not _has_calls(msgs[s])


def _broken(msgs: Sequence[Any], s: int, e: int, reason: str) -> None:
    logger.warning("trim_messages: left out the broken tool-call unit messages[%d:%d]: %s", s, e, reason)


def _last(msgs, avail, cost, splitter, allow_partial, include_system, start_on, end_on):
    end = len(msgs)
    if end_on:
        while end > 0 and not _is_type(msgs[end - 1], end_on):
            end = _unit_ending_at(msgs, end, 0)[0]
    lo = 1 if include_system and end >= 1 and msgs[0].type == "system" else 0
    if lo:
        c = cost.one(msgs[0], 0)
        if c > avail:
            raise ContextBudgetError(
                f"trim_messages: the system message, messages[0], needs {c} tokens (plus {cost.base} "
                f"per request) and max_tokens is {avail + cost.base}; raise max_tokens or shorten it",
                budget=avail + cost.base, pinned=c)
        avail -= c
    pieces: list[Any] = []
    e, newest, partial = end, True, None
    while e > lo:
        s, reason = _unit_ending_at(msgs, e, lo)
        if reason is not None:
            if newest:
                ids = [c.get("id") for c in getattr(msgs[s], "tool_calls", None) or ()] or [
                    m.tool_call_id for m in msgs[s:e]]
                raise ToolCallHistoryError(
                    f"messages[{s}] ({type(msgs[s]).__name__}, tool call ids {ids}): the newest tool-call "
                    f"transaction is broken: {reason}. Cannot trim to a valid request: answer every call "
                    "with a ToolMessage right after its AIMessage, or drop the unanswered calls.")
            _broken(msgs, s, e, reason)
            e = s
            continue
        newest = False
        c = sum(cost.one(msgs[i], i) for i in range(s, e))
        if c > avail:
            if allow_partial and _can_split(msgs, s, e):
                partial = _partial(msgs[s], avail, cost.of, splitter, "last")
            break
        avail -= c
        pieces.append(msgs[s:e])
        e = s
    pieces.reverse()
    if partial is not None:
        pieces.insert(0, [partial])
    if start_on:
        k = 0
        while k < len(pieces) and not (_is_type(pieces[k][0], start_on)
                                       or (len(pieces[k]) > 1 and _is_type(pieces[k][1], start_on))):
            k += 1
        pieces = pieces[k:]
    return msgs[:lo] + [m for p in pieces for m in p]


def _first(msgs, avail, cost, splitter, allow_partial, end_on):
    n = len(msgs)
    pieces: list[Any] = []
    s = 0
    while s < n:
        e, reason = _unit_starting_at(msgs, s, n)
        if reason is not None:
            _broken(msgs, s, e, reason)
            s = e
            continue
        c = sum(cost.one(msgs[i], i) for i in range(s, e))
        if c > avail:
            if allow_partial and _can_split(msgs, s, e):
                p = _partial(msgs[s], avail, cost.of, splitter, "first")
                if p is not None:
                    pieces.append([p])
            break
        avail -= c
        pieces.append(msgs[s:e])
        s = e
    if end_on:
        while pieces and not _is_type(pieces[-1][-1], end_on):
            pieces.pop()
    return [m for p in pieces for m in p]


def trim_messages(
    messages: Any = None,
    *,
    max_tokens: int,
    token_counter: Any = "o200k_base",
    strategy: Literal["first", "last"] = "last",
    allow_partial: bool = False,
    end_on: Any = None,
    start_on: Any = None,
    include_system: bool = False,
    text_splitter: Any = None,
) -> Any:
    """``langchain_core.messages.trim_messages`` that never splits a tool-call transaction.

    Same arguments and return type (a list of LangChain messages; without ``messages``, a
    ``RunnableLambda``); see the module docstring for how each ``token_counter`` is counted
    and where the result differs from LangChain's.

    >>> from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    >>> call = {"name": "search", "args": {"q": "weather in Paris, Lyon and Nice " * 4}, "id": "c1"}
    >>> history = [SystemMessage("Be brief."), HumanMessage("Weather?"),
    ...            AIMessage("", tool_calls=[call]), ToolMessage("Sunny.", tool_call_id="c1"),
    ...            HumanMessage("Thanks!")]
    >>> out = trim_messages(history, max_tokens=60, token_counter="o200k_base", include_system=True)
    >>> [m.type for m in out]                   # the call and its result went together
    ['system', 'human']
    >>> from langchain_core.messages import trim_messages as lc_trim
    >>> [m.type for m in lc_trim(history, max_tokens=60, include_system=True,
    ...                          token_counter="approximate")]  # LangChain: an orphan result
    ['system', 'tool', 'human']
    """
    if messages is None:
        from langchain_core.runnables import RunnableLambda

        return RunnableLambda(functools.partial(
            trim_messages, max_tokens=max_tokens, token_counter=token_counter, strategy=strategy,
            allow_partial=allow_partial, end_on=end_on, start_on=start_on, include_system=include_system,
            text_splitter=text_splitter), name="trim_messages")
    if start_on and strategy == "first":
        raise ValueError("start_on parameter is only valid with strategy='last'")
    if include_system and strategy == "first":
        raise ValueError("include_system parameter is only valid with strategy='last'")
    if strategy not in ("first", "last"):
        raise ValueError(f"Unrecognized strategy={strategy!r}. Supported strategies are 'last' and 'first'.")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    from .langchain import _as_lc_list

    msgs = _as_lc_list(messages)
    cost = _make_cost(token_counter)
    if text_splitter is None:
        splitter = _default_text_splitter
    elif callable(getattr(text_splitter, "split_text", None)):
        splitter = text_splitter.split_text
    else:
        splitter = text_splitter
    if not msgs:
        return []
    avail = max_tokens - cost.base
    if strategy == "last":
        return _last(msgs, avail, cost, splitter, allow_partial, include_system, start_on, end_on)
    return _first(msgs, avail, cost, splitter, allow_partial, end_on)
