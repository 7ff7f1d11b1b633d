"""Trimming filters: ``MaxMessagesFilter`` and ``TokenBudgetFilter``.

Both keep the invariants of CONTRACT.md section 3:

1. the leading run of messages whose role is in ``pinned_roles`` is kept whole;
2. a unit (an assistant message with ``tool_calls`` and the tool messages right after it;
   any other message alone) is kept or dropped whole;
3. what is kept after the pinned prefix is one contiguous run of units, the newest ones
   (``trim_from_start=True``) or the oldest ones, and the longest such run within the limit
   (with ``eviction="exact"``, the default);
4. the limit is never exceeded: when the newest unit (the oldest, with
   ``trim_from_start=False``) cannot fit beside the pinned prefix, or the pinned prefix alone
   is over a token budget, :class:`~jianmu_fast.errors.ContextBudgetError` is raised instead
   of silently sending a prompt without the user's latest turn;
5. the same input gives the same output on both backends.

Filters return new lists and never mutate their input. The decision is made by the
compiled core (``jianmu_fast._backend``) in one call per prompt, over only the tail of the
history that can possibly be kept: per-call work scales with what is kept.

Ranges (validated here, ``ValueError`` naming the argument): ``max_messages``, ``max_tokens``
and ``chunk`` are at most ``2**53`` (``MAX_VALUE``), and so is every count a counter returns;
inside them the compiled core's arithmetic cannot overflow. A built-in trimming filter fails
only with a library error: a counter that raises, or returns a count that is not an int in
``[0, 2**53]``, is a :class:`~jianmu_fast.errors.TrimmingError` naming the message.

The request's tools: ``TokenBudgetFilter.apply(messages, tools_schema=tools)`` (the builder
passes the request's tools so) budgets the whole request, messages plus chat overhead plus
``counter.count_tools(tools)``; the tools' count is cached by content.

``eviction="chunked"`` trades maximality for a stable prompt prefix: once over the limit the
cut moves forward by at least ``chunk`` (tokens or messages) at a time and stays put while
the conversation grows, so prompt caches keep hitting. See ``_filter_core_py``.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Sequence

import json

import numpy as np

from ... import _backend
from ...errors import ContextBudgetError, JianmuError, TrimmingError
from ...message import Message
from ...message.model import thaw
from .counters import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter

__all__ = ["MaxMessagesFilter", "TokenBudgetFilter", "split_units"]

Eviction = Literal["exact", "chunked"]
_EMPTY = np.zeros(0, dtype=np.int64)
MAX_VALUE = _backend.MAX_VALUE
#: counters whose counts are always ints in range (never re-checked)
_TRUSTED_COUNTERS = (SimpleTokenCounter, TiktokenTokenCounter, HFTokenCounter)
_ZERO = np.zeros(1, dtype=np.int64)


def _pinned_count(messages: Sequence[Message], pinned_roles: frozenset[str]) -> int:
    n = 0
    for m in messages:
        if m.role not in pinned_roles:
            break
        n += 1
    return n


def _unit_start_at_or_before(messages: Sequence[Message], i: int, n_pinned: int) -> int:
    """Move ``i`` back to the start of the unit that holds message ``i``."""
    while i > n_pinned and messages[i].role == "tool":
        i -= 1
    return i


def split_units(messages: Sequence[Message], start: int) -> np.ndarray:
    """Indices where units start in ``messages[start:]``, relative to ``start``.

    A tool message belongs to the unit of the message before it (its assistant call);
    every other message starts a unit, and so does the first message.

    >>> from jianmu_fast.message import human, ai, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> split_units([human("q"), ai(None, tool_calls=call), tool("r", tool_call_id="c1"), ai("a")], 0).tolist()
    [0, 1, 3]
    """
    n = len(messages) - start
    if n <= 0:
        return _EMPTY
    starts = [0]
    for i in range(1, n):
        if messages[start + i].role != "tool":
            starts.append(i)
    return np.array(starts, dtype=np.int64)


def _check_roles(pinned_roles: Iterable[str]) -> frozenset[str]:
    if isinstance(pinned_roles, str):
        raise TypeError(f"pinned_roles must be a collection of role names, not a string ({pinned_roles!r})")
    roles = frozenset(pinned_roles)
    bad = roles - {"system", "user", "assistant", "tool"}
    if bad:
        raise ValueError(f"pinned_roles has unknown roles {sorted(bad)}")
    return roles


def _check_limit(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > MAX_VALUE:
        raise ValueError(f"{name} must be a positive int of at most 2**53, got {value!r}")
    return value


def _check_eviction(eviction: str, chunk: Optional[int], unit: str) -> int:
    if eviction not in ("exact", "chunked"):
        raise ValueError(f"eviction must be 'exact' or 'chunked', got {eviction!r}")
    if eviction == "exact":
        if chunk is not None:
            raise ValueError("chunk only applies to eviction='chunked'")
        return 0
    if chunk is None or isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1 or chunk > MAX_VALUE:
        raise ValueError(f"eviction='chunked' needs chunk= a positive int of at most 2**53 ({unit}), got {chunk!r}")
    return chunk


class _WindowFilter:
    """Shared façade: find the pinned prefix and a tail, call the core once, slice."""

    _unit_name = "tokens"
    pinned_roles: frozenset[str]
    trim_from_start: bool
    chunk: int

    def _limit(self, tools_schema: Any = None) -> int:
        """The core's budget: what the pinned prefix plus the kept run may cost."""
        raise NotImplementedError

    def _counts(self, messages: Sequence[Message], lo: int, hi: int) -> np.ndarray:
        """int64 cost of each of ``messages[lo:hi]``."""
        raise NotImplementedError

    def _pinned_counts(self, messages: Sequence[Message], n_pinned: int) -> np.ndarray:
        return self._counts(messages, 0, n_pinned)

    def _tail(self, messages: list[Message], n_pinned: int, avail: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Walk back from the newest message in steps, each ending on a unit start, until
        what was walked costs more than ``avail``: the kept run lies inside it.

        The first step is 32 messages; each next one aims at what ``avail`` still allows at
        the average cost per message walked so far, plus a quarter, and is at least half of
        what was walked (so the steps grow geometrically whatever the message sizes).

        Returns where the walk stopped, the counts from there on, and which of those messages
        start a unit (see ``_tail_cache``)."""
        n = end = len(messages)
        parts = []
        flag_parts = []
        total = 0
        step = 32
        while end > n_pinned:
            start = _unit_start_at_or_before(messages, max(n_pinned, end - step), n_pinned)
            counts, flags = self._tail_counts(messages, start, end)
            parts.append(counts)
            flag_parts.append(flags)
            total += int(counts.sum())
            end = start
            if total > avail:
                break
            walked = n - end
            per = max(1, total // walked)
            step = max(walked // 2, (avail - total) // per * 5 // 4 + 2)
        if len(parts) == 1:
            counts, flags = parts[0], flag_parts[0]
        else:
            counts, flags = np.concatenate(parts[::-1]), np.concatenate(flag_parts[::-1])
        self._tail_cache = (end, messages[end:], counts, flags)
        return end, counts, flags

    # What the last call walked: (offset, a copy of messages[offset:], their counts, whether each
    # starts a unit). In a hot loop the history grows at its end, so the next walk finds most of
    # its messages here, verified by one C-level list comparison (identical objects compare
    # equal without calling __eq__, equal ones cost the same), and counts only the new ones.
    # A pure cache: results are the same without it.
    _tail_cache: Optional[tuple[int, list[Message], np.ndarray, np.ndarray]] = None

    def _fresh(self, messages: list[Message], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        flags = np.fromiter((m.role != "tool" for m in messages[lo:hi]), dtype=bool, count=hi - lo)
        return self._counts(messages, lo, hi), flags

    def _tail_counts(self, messages: list[Message], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Counts and unit-start flags of ``messages[lo:hi]``, from the cache where it holds."""
        cached = self._tail_cache
        if cached is not None:
            off, ref, counts, flags = cached
            a, b = max(lo, off), min(hi, off + len(ref))
            if a < b and messages[a:b] == ref[a - off:b - off]:
                parts = [(counts[a - off:b - off], flags[a - off:b - off])]
                if lo < a:
                    parts.insert(0, self._fresh(messages, lo, a))
                if b < hi:
                    parts.append(self._fresh(messages, b, hi))
                if len(parts) == 1:
                    return parts[0]
                return np.concatenate([c for c, _ in parts]), np.concatenate([f for _, f in parts])
        return self._fresh(messages, lo, hi)

    # What the last call counted over the whole history (chunked eviction and keep-oldest need
    # every count, not only a tail): (history messages, their counts, their unit starts). A call
    # whose history starts with that list (same objects, or equal ones) counts only what was
    # appended. A pure cache: results are the same without it.
    _history_cache: Optional[tuple[list[Message], np.ndarray, np.ndarray]] = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_history_cache", None)
        state.pop("_tail_cache", None)
        return state

    def _history(self, messages: list[Message], n_pinned: int) -> tuple[np.ndarray, np.ndarray]:
        """Counts and unit starts (relative to ``n_pinned``) of every non-pinned message."""
        hist = messages[n_pinned:]
        cached = self._history_cache
        if cached is not None:
            ref, counts, starts = cached
            k = len(ref)
            if len(hist) >= k and hist[:k] == ref:
                if len(hist) > k:
                    new_starts = split_units(hist, k) + k
                    if k and hist[k].role == "tool":
                        new_starts = new_starts[1:]
                    counts = np.concatenate((counts, self._counts(messages, n_pinned + k, len(messages))))
                    starts = np.concatenate((starts, new_starts))
                    self._history_cache = (hist, counts, starts)
                return counts, starts
        counts = self._counts(messages, n_pinned, len(messages))
        starts = split_units(hist, 0)
        self._history_cache = (hist, counts, starts)
        return counts, starts

    def apply(
        self,
        messages: Sequence[Message],
        local_state: Any = None,
        global_state: Any = None,
        ctx: Any = None,
        *,
        tools_schema: Optional[Sequence[dict[str, Any]]] = None,
        **kwargs: Any,
    ) -> list[Message]:
        """Trim ``messages`` to the limit; see the module docstring for the invariants.

        ``tools_schema``: the request's tools (``TokenBudgetFilter`` budgets them; the
        message-count filter ignores them)."""
        try:
            return self._apply(messages, tools_schema)
        except JianmuError:
            raise
        except Exception as exc:  # a built-in trimming filter fails only with a library error
            raise TrimmingError(
                f"{type(self).__name__}: could not trim the prompt ({type(exc).__name__}: {exc})"
            ) from exc

    def _apply(self, messages: Sequence[Message], tools_schema: Any) -> list[Message]:
        msgs = messages if isinstance(messages, list) else list(messages)
        n = len(msgs)
        n_pinned = _pinned_count(msgs, self.pinned_roles)
        limit = self._limit(tools_schema)
        pinned_counts = self._pinned_counts(msgs, n_pinned)
        pinned_cost = int(pinned_counts.sum())
        if n_pinned == n:
            if pinned_cost > limit:
                self._raise(msgs, n_pinned, pinned_cost, limit)
            return list(msgs)
        if self.trim_from_start and self.chunk == 0:
            start, tail_counts, flags = self._tail(msgs, n_pinned, limit - pinned_cost)
            unit_starts = np.flatnonzero(flags)
            if not flags[0]:  # the walk starts a unit even on a tool message right after the pins
                unit_starts = np.concatenate((_ZERO, unit_starts))
        else:
            start = n_pinned
            tail_counts, unit_starts = self._history(msgs, n_pinned)
        counts = np.concatenate((pinned_counts, tail_counts)) if n_pinned else tail_counts
        if n_pinned:
            unit_starts = unit_starts + n_pinned
        lo, hi = _backend.select_window(
            counts, unit_starts, n_pinned, max(limit, 0), self.trim_from_start, self.chunk
        )
        if lo == hi or limit < 0:
            u = -1 if self.trim_from_start else 0
            u0 = int(unit_starts[u])
            u1 = int(unit_starts[u + 1]) if u + 1 < len(unit_starts) and u >= 0 else len(counts)
            shift = start - n_pinned
            self._raise(msgs, n_pinned, pinned_cost, limit, u0 + shift, u1 + shift, int(counts[u0:u1].sum()))
        shift = start - n_pinned
        return msgs[:n_pinned] + msgs[lo + shift:hi + shift]

    def _describe_limit(self) -> str:
        return f"{self._limit()} {self._unit_name}"

    def _repr_options(self) -> str:
        out = f", pinned_roles={tuple(sorted(self.pinned_roles))!r}"
        if not self.trim_from_start:
            out += ", trim_from_start=False"
        if self.chunk:
            out += f", eviction='chunked', chunk={self.chunk}"
        return out

    def _raise(self, msgs, n_pinned, pinned_cost, limit, u0=None, u1=None, unit_cost=0):
        unit = self._unit_name
        if u0 is None:
            detail = "there is nothing else to drop"
        else:
            which = "newest" if self.trim_from_start else "oldest"
            roles = ", ".join(m.role for m in msgs[u0:u1])
            detail = f"the {which} unit, messages[{u0}:{u1}] ({roles}), needs {unit_cost} {unit}"
        raise ContextBudgetError(
            f"{type(self).__name__}: the pinned prefix, messages[0:{n_pinned}], needs {pinned_cost} "
            f"{unit} and {detail}; the limit is {self._describe_limit()}. Raise the limit, shorten "
            "the pinned messages, or shorten that unit before building the prompt.",
            budget=limit,
            pinned=pinned_cost,
            newest=unit_cost,
        )


class MaxMessagesFilter(_WindowFilter):
    """Keep the pinned prefix plus the newest ``max_messages`` other messages.

    Pinned messages do not count against ``max_messages``. Fewer are kept when the limit
    would cut a tool-call transaction; a newest transaction longer than ``max_messages``
    raises ``ContextBudgetError``. With ``eviction="chunked"``, ``chunk`` counts messages.

    >>> from jianmu_fast.message import system, human, ai
    >>> msgs = [system("sys1"), system("sys2"), human("u1"), ai("a1"), human("u2"), ai("a2"),
    ...         human("u3"), ai("a3")]
    >>> [m.content for m in MaxMessagesFilter(max_messages=5).apply(msgs)]
    ['sys1', 'sys2', 'a1', 'u2', 'a2', 'u3', 'a3']
    """

    _unit_name = "messages"

    def __init__(
        self,
        max_messages: int,
        pinned_roles: Iterable[str] = ("system",),
        *,
        trim_from_start: bool = True,
        eviction: Eviction = "exact",
        chunk: Optional[int] = None,
    ) -> None:
        self.max_messages = _check_limit("max_messages", max_messages)
        self.pinned_roles = _check_roles(pinned_roles)
        self.trim_from_start = bool(trim_from_start)
        self.eviction = eviction
        self.chunk = _check_eviction(eviction, chunk, "messages")

    def __repr__(self) -> str:
        return f"MaxMessagesFilter(max_messages={self.max_messages}{self._repr_options()})"

    def _limit(self, tools_schema: Any = None) -> int:
        return self.max_messages

    def _counts(self, messages, lo, hi):
        return np.ones(hi - lo, dtype=np.int64)

    def _pinned_counts(self, messages, n_pinned):
        return np.zeros(n_pinned, dtype=np.int64)


class TokenBudgetFilter(_WindowFilter):
    """Keep the pinned prefix plus the longest run of units within ``max_tokens``.

    Tokens are counted by ``counter`` (default ``SimpleTokenCounter()``), chat-format
    overhead included; ``counter.count_messages(output) <= max_tokens`` always holds, or
    ``ContextBudgetError`` says why it cannot. With ``eviction="chunked"``, ``chunk`` counts
    tokens (a quarter of the budget is a good start).

    >>> from jianmu_fast.message import system, human, ai
    >>> msgs = [system("Be brief."), human("x" * 40), ai("y" * 40), human("What now?")]
    >>> [m.role for m in TokenBudgetFilter(max_tokens=31).apply(msgs)]
    ['system', 'assistant', 'user']
    """

    def __init__(
        self,
        max_tokens: int,
        counter: Any = None,
        trim_from_start: bool = True,
        pinned_roles: Iterable[str] = ("system",),
        *,
        eviction: Eviction = "exact",
        chunk: Optional[int] = None,
    ) -> None:
        self.max_tokens = _check_limit("max_tokens", max_tokens)
        self.counter = SimpleTokenCounter() if counter is None else counter
        self.trim_from_start = bool(trim_from_start)
        self.pinned_roles = _check_roles(pinned_roles)
        self.eviction = eviction
        self.chunk = _check_eviction(eviction, chunk, "tokens")

    def __repr__(self) -> str:
        return f"TokenBudgetFilter(max_tokens={self.max_tokens}, counter={self.counter!r}{self._repr_options()})"

    @property
    def counter(self) -> Any:
        """The token counter. Setting another one checks it and forgets cached counts."""
        return self._counter

    @counter.setter
    def counter(self, counter: Any) -> None:
        if not (callable(getattr(counter, "count_message", None)) and callable(getattr(counter, "count_messages", None))):
            raise TypeError(
                "counter: expected a TokenCounterProtocol (count_message(m), count_messages(ms)), "
                f"got {type(counter).__name__}"
            )
        self._counter = counter
        self._count_array = getattr(counter, "count_array", None)
        self._trusted = type(counter) in _TRUSTED_COUNTERS
        self._tail_cache = None
        self._history_cache = None
        self._tools_last: Optional[tuple[Any, int]] = None
        self._tools_by_json: dict[str, int] = {}
        self._tools_cost_now = 0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_tools_last"] = None
        state["_tools_by_json"] = {}
        return state

    def _check_count(self, value: Any, where: str) -> int:
        """A count from a custom counter: an int in ``[0, 2**53]``, else ``TrimmingError``."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 0 <= value <= MAX_VALUE:
            return int(value)
        raise TrimmingError(
            f"{type(self).__name__}: counter {self.counter!r} returned {value!r} for {where}; a count "
            "must be an int between 0 and 2**53"
        )

    def _request_cost(self) -> int:
        cost = self.counter.count_messages([])
        return cost if self._trusted else self._check_count(cost, "count_messages([])")

    def tools_cost(self, tools_schema: Optional[Sequence[dict[str, Any]]]) -> int:
        """What the request's tools cost by this filter's counter (``count_tools``; a counter
        without it: 8 per tool plus ``count_text`` of its compact JSON), cached by content:
        the same tools in a new list (new dicts, equal content) are not counted again.

        >>> f = TokenBudgetFilter(1000, SimpleTokenCounter())
        >>> f.tools_cost([{"name": "f"}]), f.tools_cost([{"name": "f"}]), f.tools_cost(None)
        (11, 11, 0)
        """
        if not tools_schema:
            return 0
        last = self._tools_last
        if last is not None and last[0] == tools_schema:  # C-level deep comparison, no JSON
            return last[1]
        try:
            key: Optional[str] = json.dumps(tools_schema, sort_keys=True, separators=(",", ":"), default=repr)
        except (TypeError, ValueError):
            key = None
        cost = self._tools_by_json.get(key) if key is not None else None
        if cost is None:
            cost = self._count_tools(tools_schema)
            if key is not None:
                if len(self._tools_by_json) >= 16:
                    self._tools_by_json.pop(next(iter(self._tools_by_json)))
                self._tools_by_json[key] = cost
        # a deep copy: the caller may edit their dicts in place before the next call
        self._tools_last = (thaw(list(tools_schema)), cost)
        return cost

    def _count_tools(self, tools_schema: Sequence[dict[str, Any]]) -> int:
        counter = self.counter
        fn = getattr(counter, "count_tools", None)
        if callable(fn):
            cost = fn(tools_schema)
        elif callable(getattr(counter, "count_text", None)):
            cost = sum(SimpleTokenCounter.PER_TOOL + counter.count_text(
                json.dumps(t, separators=(",", ":"), sort_keys=True)) for t in tools_schema)
        else:
            cost = SimpleTokenCounter().count_tools(tools_schema)
        return cost if self._trusted else self._check_count(cost, "count_tools(tools_schema)")

    def _limit(self, tools_schema: Any = None) -> int:
        request = self._request_cost()
        tools = self._tools_cost_now = self.tools_cost(tools_schema)
        if tools and request + tools > self.max_tokens:
            n = len(tools_schema) if tools_schema else 0
            raise ContextBudgetError(
                f"{type(self).__name__}: the request's tools (tools_schema, {n} tool(s)) alone need "
                f"{tools} tokens, and the request's fixed cost {request} more; the limit is "
                f"{self.max_tokens} tokens for the whole request. Raise max_tokens, or send fewer or "
                "shorter tool schemas.",
                budget=self.max_tokens,
                pinned=request + tools,
            )
        return self.max_tokens - request - tools

    def _describe_limit(self) -> str:
        tools = self._tools_cost_now
        extra = f" and {tools} the request's tools" if tools else ""
        return f"{self.max_tokens} tokens, {self._request_cost()} of them the request's fixed cost{extra}"

    def _counts(self, messages, lo, hi):
        part = messages[lo:hi]
        if self._count_array is not None:
            counts = self._count_array(part)
        else:
            counts = [self.counter.count_message(m) for m in part]
        if self._trusted:
            return np.ascontiguousarray(counts, dtype=np.int64)
        return self._checked(counts, lo)

    def _checked(self, counts: Any, lo: int) -> np.ndarray:
        """A custom counter's counts as int64, each an int in ``[0, 2**53]`` (else TrimmingError)."""
        arr = np.asarray(counts)
        if arr.ndim == 1 and arr.dtype.kind in "iu" and arr.dtype != np.uint64:
            arr = arr.astype(np.int64, copy=False)
            if not len(arr) or (int(arr.min()) >= 0 and int(arr.max()) <= MAX_VALUE):
                return np.ascontiguousarray(arr)
        values = list(counts)
        for i, v in enumerate(values):
            self._check_count(v, f"messages[{lo + i}]")
        return np.array([int(v) for v in values], dtype=np.int64)
