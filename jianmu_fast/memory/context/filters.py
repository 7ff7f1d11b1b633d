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
compiled core (``jianmu_fast._backend``) over per-message records (role, count, call ids)
that a filter keeps for its last prompt (``Records``). When the next prompt extends that
one (the agent loop: the same list grown in place, or a list that starts with the same
messages), one compiled call records just the new messages (counted by the counter, each
distinct text tokenized once), finds the window by binary search over prefix sums of the
counts, and builds the output list: a turn costs its new messages plus O(log n). A prompt
that shares only a prefix with the last one (a message edited, inserted or deleted in the
middle: context editing clearing old tool results) keeps the records of that prefix and
re-records the messages after it, unless the changed messages keep their roles and ids (a
clearing step's placeholders): then only those records take the new messages and counts, in
the same compiled call. Other prompts are recorded anew, and only the tail of the history
that can possibly be kept is counted.

Ranges (validated here, ``ValueError`` naming the argument): ``max_messages``, ``max_tokens``
and ``chunk`` are at most ``2**53`` (``MAX_VALUE``), and so is every count a counter returns;
inside them the compiled core's arithmetic cannot overflow. A built-in trimming filter fails
only with a library error: a counter that raises, or returns a count that is not an int in
``[0, 2**53]``, is a :class:`~jianmu_fast.errors.TrimmingError` naming the message.

The request's tools: ``TokenBudgetFilter.apply(messages, tools_schema=tools)`` (the builder
passes the request's tools so) budgets the whole request, messages plus chat overhead plus
``counter.count_tools(tools)``; the tools' count is cached by content. Where a chat template
prints the tools more than once for some prompts (``ChatTemplateTokenCounter.tools_surplus``),
the output pays for each time they are printed (``tools_cost(tools, output)``).

``eviction="chunked"`` trades maximality for a stable prompt prefix: once over the limit the
cut moves forward by at least ``chunk`` (tokens or messages) at a time and stays put while
the conversation grows, so prompt caches keep hitting. See ``_filter_core_py``.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Sequence

import json
import threading
from functools import partial
from operator import countOf

import numpy as np

from ... import _backend
from ..._template_base import NOT_YET
from ...errors import ContextBudgetError, JianmuError, TrimmingError
from ...message import Message
from ...message.model import coerce_message, thaw
from .chat_template import ChatTemplateTokenCounter
from .counters import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter

__all__ = ["MaxMessagesFilter", "TokenBudgetFilter", "split_units"]

Eviction = Literal["exact", "chunked"]
_EMPTY = np.zeros(0, dtype=np.int64)
MAX_VALUE = _backend.MAX_VALUE
#: the chat-template core (loaded with ``chat_template`` above): its JSON snapshots tell a tool list
#: passed again unchanged without comparing it (``_tools_entry``)
_tc = _backend.template_core()
#: counters whose counts are always ints in range (never re-checked)
_SYSTEM_ONLY = frozenset(("system",))
_NOT_YET = NOT_YET  # (turn_list's: a turn's charges left to the filter's own path)
_TRUSTED_COUNTERS = (SimpleTokenCounter, TiktokenTokenCounter, HFTokenCounter)
_CACHED_COUNTERS = (TiktokenTokenCounter, HFTokenCounter)
_ZERO = np.zeros(1, dtype=np.int64)


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


def _coerce(item: Any, i: int) -> Message:
    return coerce_message(item, f"messages[{i}]")


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


_ROLE = _backend.ROLE_CODES
_ROLE_BIT = {r: 1 << c for r, c in _ROLE.items()}


def _list_counter(counter: Any) -> Any:
    """For the library's cached counters, ``counter._counts`` without its Python frame (the
    compiled ``counts_of`` bound to the counter): a turn's new messages counted as a list of
    ints in range (``ChatTemplateTokenCounter``: its own list of per-message costs, no array
    to check); None for other counters."""
    if type(counter) is ChatTemplateTokenCounter:  # (the filter's own: _template_counts)
        return None
    return partial(_backend.counts_of, counter) if type(counter) in _CACHED_COUNTERS else None


class _WindowFilter:
    """Shared façade: the records of the prompt (``_backend.Records``, extended in place along
    a growing history: a turn appends its new messages' records), one call of the compiled
    planner over them (which asks for the counts it needs), and the output sliced from the
    plan. The batch path (``_batch_plan``) calls ``_trim_many``: the same planner over all
    prompts (``plan_windows``), one table of records for every distinct message."""

    _unit_name = "tokens"
    _pinned_free = False  # pinned messages cost nothing against the limit
    _rec: Any = None
    #: the prompt of the call under way (``TokenBudgetFilter._template_counts`` reads it)
    _turn_msgs: Optional[list[Any]] = None
    #: the planner's settings (pinned_mask, from_start, chunk, pinned_free); None after a change
    _cfg: Optional[tuple[int, bool, int, bool]] = None
    #: each instance makes its own; this one serves subclasses whose __init__ skips ours
    _lock = threading.Lock()

    @property
    def pinned_roles(self) -> frozenset[str]:
        """The roles of the leading run of messages that is always kept."""
        return self._pinned_roles

    @pinned_roles.setter
    def pinned_roles(self, roles: Iterable[str]) -> None:
        self._pinned_roles = _check_roles(roles)
        self._cfg = None
        self._rec = None  # (a ChatTemplateTokenCounter's charges depend on what stays pinned)

    @property
    def trim_from_start(self) -> bool:
        """True: drop the oldest units first; False: the newest."""
        return self._trim_from_start

    @trim_from_start.setter
    def trim_from_start(self, value: bool) -> None:
        self._trim_from_start = value
        self._cfg = None

    @property
    def chunk(self) -> int:
        """The eviction step of ``eviction="chunked"`` (0: exact eviction)."""
        return self._chunk

    @chunk.setter
    def chunk(self, value: int) -> None:
        self._chunk = value
        self._cfg = None

    def _config(self) -> tuple[int, bool, int, bool]:
        """The planner's settings, computed once per change of a setting."""
        cfg = self._cfg
        if cfg is None:
            mask = 0
            for r in self.pinned_roles:
                mask |= _ROLE_BIT[r]
            cfg = self._cfg = (mask, bool(self.trim_from_start), self.chunk, self._pinned_free)
        return cfg

    #: whether the last ``_limit``'s tools may cost more in some prompts than the limit charged
    #: (``TokenBudgetFilter``: a chat template printing them more than once): the output is
    #: then checked by ``_fit_tools``
    _vary = False

    def _limit(self, tools_schema: Any = None) -> int:
        """The core's budget: what the pinned prefix plus the kept run may cost."""
        raise NotImplementedError

    def _fit_tools(self, msgs: list[Any], tools_schema: Any, limit: int, sanitize: bool,
                   got: tuple[list[Message], bool]) -> tuple[list[Message], bool]:
        """``got`` fitted to tools that cost more in some prompts (``TokenBudgetFilter``'s; a
        filter that does not budget tools never sets ``_vary``)."""
        return got

    def _counts(self, messages: Sequence[Message], lo: int, hi: int) -> np.ndarray:
        """int64 cost of each of ``messages[lo:hi]``."""
        raise NotImplementedError

    @property
    def _mask(self) -> int:
        return self._config()[0]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_rec", "_lock", "_cfg", "_turn_msgs"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("pinned_roles", "trim_from_start", "chunk"):  # pickled before these were properties
            if key in state:
                state["_" + key] = state.pop(key)
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _forget(self) -> None:
        self._rec = None

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
        return self._trim(messages, tools_schema, False)[0]

    def _trim(self, messages: Sequence[Any], tools_schema: Any, sanitize: bool) -> tuple[list[Message], bool]:
        """``(output, clean)``; with ``sanitize``, ``clean`` says the output needs no
        sanitizing (decided in compiled code); otherwise it is False."""
        try:
            with self._lock:
                msgs = messages if type(messages) is list else list(messages)
                limit = self._limit(tools_schema)
                rec = self._rec
                self._turn_msgs = msgs
                got = None
                if rec is not None and limit >= 0:
                    # the agent loop: the prompt extends the last one; one compiled call records
                    # the new messages (counted by _turn_counts), plans and slices the output
                    got = rec.window(msgs, self._turn_counts, limit, self._cfg or self._config(), sanitize)
                if got is None:
                    got = self._trim_general(msgs, limit, sanitize)
                if self._vary:
                    return self._fit_tools(msgs, tools_schema, limit, sanitize, got)
                return got
        except JianmuError:
            raise
        except Exception as exc:  # a built-in trimming filter fails only with a library error
            self._forget()
            raise TrimmingError(
                f"{type(self).__name__}: could not trim the prompt ({type(exc).__name__}: {exc})"
            ) from exc

    def _records_of(self, msgs: list[Any], rec: Any) -> tuple[Any, list[Message]]:
        """Records for ``msgs`` (and ``msgs`` as Messages) when the last ones were not simply
        extended: ``rec`` when ``msgs`` extends its messages with items that are not
        Messages yet (coerced here), new records otherwise."""
        if rec is not None:
            k = rec.n
            new = [m if type(m) is Message else _coerce(m, k + i) for i, m in enumerate(msgs[k:])]
            rec.extend(new, self._new_counts(new))
            return rec, msgs[:k] + new
        if countOf(map(type, msgs), Message) != len(msgs):
            msgs = [m if type(m) is Message else _coerce(m, i) for i, m in enumerate(msgs)]
        rec = self._rec = _backend.Records(Message)
        if msgs:
            rec.extend(msgs, self._eager_counts(msgs))
        return rec, msgs

    def _eager_counts(self, msgs: list[Message]) -> Any:
        return None

    def _new_counts(self, new: list[Message]) -> Any:
        """Counts of the messages a turn appends (an int64 array, or a list of ints)."""
        return self._counts(new, 0, len(new))

    def _turn_counts(self, new: list[Message]) -> Any:
        """Counts of the messages a turn appends (``Records.window``'s ``count``); an
        instance attribute may shadow it with a faster equivalent (the counter's own)."""
        return self._new_counts(new)

    def _trim_general(self, msgs: list[Any], limit: int, sanitize: bool) -> tuple[list[Message], bool]:
        """``_trim`` when the compiled turn did not decide: new records, counts to fill, or a
        plan that keeps nothing (its error)."""
        rec = self._rec
        k = rec.advance(msgs, self._new_counts) if rec is not None else -1
        if k < 0:
            rec, msgs = self._records_of(msgs, rec if k == -2 else None)
        n = rec.n
        cfg = self._cfg or self._config()
        budget = limit if limit > 0 else 0
        status, n_pinned, lo, hi = rec.plan(budget, *cfg)
        while status:  # the planner asks for counts it does not have yet
            self._fill_counts(rec, msgs, lo, hi)
            status, n_pinned, lo, hi = rec.plan(budget, *cfg)
        if n_pinned == n or lo == hi or limit < 0:
            self._check_decision(msgs, rec, n_pinned, lo, hi, limit)
        out = msgs[:n_pinned] + msgs[lo:hi] if n_pinned else msgs[lo:hi]
        clean = rec.sanitize(n_pinned, lo, hi) == 0 if sanitize else False
        return out, clean

    @property
    def _in_context(self) -> bool:
        """Whether the counter charges a message by its neighbours (``ChatTemplateTokenCounter``:
        a unit's rendering may depend on them): records are then counted in runs where they
        stand in the prompt, never as a list of messages from different places."""
        return type(getattr(self, "_counter", None)) is ChatTemplateTokenCounter

    def _fill_counts(self, rec: Any, msgs: list[Message], lo: int, hi: int) -> None:
        """Count the records of ``msgs[lo:hi]`` not counted yet."""
        need = np.flatnonzero(rec.counts[lo:hi] < 0)
        if len(need) == hi - lo:
            rec.set_counts(np.arange(lo, hi, dtype=np.int64), self._counts(msgs, lo, hi))
        elif self._in_context:  # each run of them where it stands (see _in_context)
            need += lo
            breaks = np.flatnonzero(np.diff(need) != 1) + 1
            for run in np.split(need, breaks):
                a = int(run[0])
                rec.set_counts(run, self._counts(msgs, a, a + len(run)))
        else:
            need += lo
            rec.set_counts(need, self._counts([msgs[i] for i in need.tolist()], 0, len(need)))

    # -- the batch path: the routine lives in _batch_plan (one compiled pass per step) --------

    def _trim_many(self, prompts: list[Any], tools_schema: Any, sanitize: bool) -> tuple[list[Any], Any]:
        """``_trim`` for many prompts: ``(outputs, clean)``; see ``_batch_plan.trim_many``."""
        from ._batch_plan import trim_many

        return trim_many(self, prompts, tools_schema, sanitize)

    def _one(self, msgs: Any, tools_schema: Any, sanitize: bool) -> Any:
        from ._batch_plan import one

        return one(self, msgs, tools_schema, sanitize)

    def _eager_counts_many(self, distinct: list[Message], mean_len: float) -> Optional[np.ndarray]:
        from ._batch_plan import eager_counts_many

        return eager_counts_many(self, distinct, mean_len)

    def _check_decision(self, msgs: list[Message], rec: Any, n_pinned: int, lo: int, hi: int, limit: int) -> None:
        """Raise the ``ContextBudgetError`` of a plan that keeps nothing (or is over)."""
        n = rec.n
        if n_pinned < n and lo != hi and limit >= 0:
            return
        counts = rec.counts
        pinned_cost = 0 if self._pinned_free else int(counts[:n_pinned].sum())
        if n_pinned == n:
            if pinned_cost > limit:
                self._raise(msgs, n_pinned, pinned_cost, limit)
            return
        roles = rec.roles
        if self.trim_from_start:
            u1 = n
            u0 = n - 1
            while u0 > n_pinned and roles[u0] == 3:
                u0 -= 1
        else:
            u0 = n_pinned
            u1 = u0 + 1
            while u1 < n and roles[u1] == 3:
                u1 += 1
        unit = counts[u0:u1]
        if (unit < 0).any():
            unit = self._counts(msgs, u0, u1)
        self._raise(msgs, n_pinned, pinned_cost, limit, u0, u1, int(unit.sum()))

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
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MaxMessagesFilter(max_messages={self.max_messages}{self._repr_options()})"

    def _limit(self, tools_schema: Any = None) -> int:
        return self.max_messages

    _pinned_free = True

    def _counts(self, messages, lo, hi):
        return np.ones(hi - lo, dtype=np.int64)

    def _new_counts(self, new):
        return [1] * len(new)

    def _turn_counts(self, new):
        return [1] * len(new)

    def _eager_counts(self, msgs):
        return np.ones(len(msgs), dtype=np.int64)

    def _eager_counts_many(self, distinct, mean_len):
        return np.ones(len(distinct), dtype=np.int64)


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
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TokenBudgetFilter(max_tokens={self.max_tokens}, counter={self.counter!r}{self._repr_options()})"

    @property
    def counter(self) -> Any:
        """The token counter. Setting another one checks it and forgets cached counts."""
        return self._user_counter

    @counter.setter
    def counter(self, counter: Any) -> None:
        if not (callable(getattr(counter, "count_message", None)) and callable(getattr(counter, "count_messages", None))):
            raise TypeError(
                "counter: expected a TokenCounterProtocol (count_message(m), count_messages(ms)), "
                f"got {type(counter).__name__}"
            )
        self._user_counter = counter
        self._use(counter)

    def _use(self, counter: Any) -> None:
        """Count with ``counter`` from now on: the user's, or (a request with tools, on a model
        that names a "tool_use" chat template) the counter of that template, whose charges
        bound what the request costs (``_route``); cached counts are forgotten."""
        self._counter = counter
        self._count_array = getattr(counter, "count_array", None)
        self._trusted = type(counter) in _TRUSTED_COUNTERS
        # the library's cached counters: a turn's few new messages skip the array round trip
        self._list_counts = _list_counter(counter)
        self._set_turn_counts()
        self._forget()
        self._tools_last: Optional[tuple[Any, tuple[int, bool], Optional[list], Any]] = None  # (a copy, its entry, a snapshot, the list)
        self._tools_by_json: dict[str, tuple[int, bool]] = {}
        self._tools_cost_now = 0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_list_counts", None)
        state.pop("_turn_counts", None)
        user = state.pop("_user_counter", None)
        if user is not None and user is not state.get("_counter"):  # (the tool_use template's: rebuilt)
            state.update(_counter=user, _count_array=getattr(user, "count_array", None))
        state["_tools_last"] = None
        state["_tools_by_json"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        counter = state.get("_counter")
        self._user_counter = counter
        self._list_counts = _list_counter(counter)
        self._set_turn_counts()

    def _trim_known(self, messages: Sequence[Any], tools_schema: Any, known: Any) -> tuple[list[Message], bool]:
        """``_trim(messages, tools_schema, True)`` after a clearing stage (the builder's unrolled
        plan [clearing, budget]): ``known`` is its ``(ref, counts, counter)``
        (``ClearingTurn.counted``) or None; with this filter's counter, the turn's new messages
        that are the clearing's own records take its counts (``Records.window``'s ``known``)
        instead of being looked up again. The same output."""
        if known is None or known[2] is not self._counter:
            return self._trim(messages, tools_schema, True)
        try:
            with self._lock:
                msgs = messages if type(messages) is list else list(messages)
                limit = self._limit(tools_schema)
                rec = self._rec
                self._turn_msgs = msgs
                got = None
                if rec is not None and limit >= 0:
                    got = rec.window(msgs, self._turn_counts, limit, self._cfg or self._config(), True, None, known)
                if got is None:
                    got = self._trim_general(msgs, limit, True)
                if self._vary:
                    return self._fit_tools(msgs, tools_schema, limit, True, got)
                return got
        except JianmuError:
            raise
        except Exception as exc:  # (as _trim)
            self._forget()
            raise TrimmingError(
                f"{type(self).__name__}: could not trim the prompt ({type(exc).__name__}: {exc})"
            ) from exc

    def _set_turn_counts(self) -> None:
        """A library counter counts a turn's messages itself (trusted: ints in range, a list).
        A ``ChatTemplateTokenCounter``'s are this filter's ``_template_counts``, reached through
        the class (``_new_counts``): a bound method kept on the instance would be a reference
        cycle, and every filter (an eval run builds one a conversation) would live on, with its
        records, until the garbage collector's next pass over its generation."""
        if self._list_counts is not None:
            self._turn_counts = self._list_counts  # type: ignore[method-assign]
        else:
            self.__dict__.pop("_turn_counts", None)

    def _check_count(self, value: Any, where: str) -> int:
        """A count from a custom counter: an int in ``[0, 2**53]``, else ``TrimmingError``."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and 0 <= value <= MAX_VALUE:
            return int(value)
        raise TrimmingError(
            f"{type(self).__name__}: counter {self.counter!r} returned {value!r} for {where}; a count "
            "must be an int between 0 and 2**53"
        )

    def _request_cost(self) -> int:
        counter = self._counter
        if self._trusted:  # count_messages([]) of the library's counters is their PER_REQUEST
            return counter.PER_REQUEST
        if type(counter) is ChatTemplateTokenCounter:  # its count_messages([]), computed when built
            return counter._empty  # type: ignore[no-any-return]
        return self._check_count(counter.count_messages([]), "count_messages([])")

    def _new_counts(self, new: list[Message]) -> Any:
        fast = self._list_counts
        if fast is not None:
            return fast(new)  # trusted: ints in range, as a plain list
        counter = self._counter
        if type(counter) is ChatTemplateTokenCounter:
            # (None: counted later, see _template_counts; the usual turn in one compiled call,
            # _template_counts' and _slice_list's: results continuing a unit take their path)
            rec = self._rec
            pinned = self._pinned_roles
            got = counter._turn_list(self._turn_msgs, rec.n if rec is not None else 0, new,
                                     0 if pinned == _SYSTEM_ONLY else 1 if pinned <= _SYSTEM_ONLY else 2)
            return self._template_counts(new) if got is _NOT_YET else got
        return self._counts(new, 0, len(new))

    #: ``Records.window``'s ``count`` where no counter's own is kept on the instance (a
    #: ``ChatTemplateTokenCounter``'s: see ``_set_turn_counts``), one Python call less
    _turn_counts = _new_counts

    def tools_cost(self, tools_schema: Optional[Sequence[dict[str, Any]]], messages: Optional[Sequence[Any]] = None) -> int:
        """What the request's tools cost by this filter's counter (``count_tools``; a counter
        without it: 8 per tool plus ``count_text`` of its compact JSON), cached by content:
        the same tools in a new list (new dicts, equal content) are not counted again.

        With ``messages`` (a prompt this filter kept, or one to check): what they cost in that
        prompt -- for a ``ChatTemplateTokenCounter``, exactly (``count_tools(tools,
        messages)``), which is more where the template prints the tools more than once
        (``tools_surplus``: Mistral's, for a repeated last user message); the filter's output
        keeps ``count_messages(out) + tools_cost(tools, out)`` within ``max_tokens``.

        >>> f = TokenBudgetFilter(1000, SimpleTokenCounter())
        >>> f.tools_cost([{"name": "f"}]), f.tools_cost([{"name": "f"}]), f.tools_cost(None)
        (11, 11, 0)
        """
        if not tools_schema:
            return 0
        user = self.counter
        if messages and type(user) is ChatTemplateTokenCounter:
            # what they cost in that prompt, exactly (at most what the budget charges: the
            # tools' cost without messages, plus the surplus of tools a template repeats;
            # cached by the prompt's signature: see its count_tools)
            return int(user.count_tools(tools_schema, messages))
        self._route(tools_schema)
        return self._tools_entry(tools_schema)[0]

    def _route(self, tools_schema: Any) -> None:
        """Count with the counter that prices this request: a model's "tool_use" chat template
        renders a request with tools (``ChatTemplateTokenCounter.count_tools``), so its
        charges, fixed cost and tools' cost budget it; the user's counter otherwise."""
        user = self._user_counter
        want = user
        if tools_schema and type(user) is ChatTemplateTokenCounter and user._tool_use_template is not None:
            want = user._tools_counter()
        if want is not self._counter:
            self._use(want)

    def _tools_entry(self, tools_schema: Sequence[dict[str, Any]]) -> tuple[int, bool]:
        """``(cost, vary)`` of non-empty tools: ``tools_cost``, and whether they may cost more in
        some prompts (the counter's ``tools_surplus`` is then asked about each output)."""
        counter = self._counter
        template = type(counter) is ChatTemplateTokenCounter
        key: Optional[str]
        if template:
            # the counter's own entry (its checks and reuse; ~1.8 us for the same list): its JSON
            # prints as the template does, keys in their order and 1.0 apart from 1, where the
            # key below (sorted, compared by ==) would reuse another list's cost
            key = counter._tools_entry(tools_schema)[0]
        else:
            last = self._tools_last
            if last is not None and last[2] is not None and _tc.json_unchanged(last[2], tools_schema):
                return last[1]  # (no list or dict of it changed: identity checks, no comparison)
            if last is not None and last[0] == tools_schema:  # C-level deep comparison, no JSON
                # (a list passed a second time is snapshot, not every list an agent builds anew)
                snap = _tc.json_snapshot(tools_schema) if tools_schema is last[3] else None
                self._tools_last = (last[0], last[1], snap, tools_schema)
                return last[1]
            try:
                key = json.dumps(tools_schema, sort_keys=True, separators=(",", ":"), default=repr)
            except (TypeError, ValueError):
                key = None
        got = self._tools_by_json.get(key) if key is not None else None
        if got is None:
            got = (self._count_tools(tools_schema), template and counter._repeats_tools(tools_schema))
            if key is not None:
                if len(self._tools_by_json) >= 16:
                    self._tools_by_json.pop(next(iter(self._tools_by_json)))
                self._tools_by_json[key] = got
        if not template:
            # a deep copy: the caller may edit their dicts in place before the next call
            self._tools_last = (thaw(list(tools_schema)), got, _tc.json_snapshot(tools_schema), tools_schema)
        return got

    def _count_tools(self, tools_schema: Sequence[dict[str, Any]]) -> int:
        counter = self._counter
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
        if type(self._counter) is ChatTemplateTokenCounter:
            self._route(tools_schema)
        if not tools_schema:
            self._vary = False
            if self._trusted:  # the agent loop without tools: no calls
                self._tools_cost_now = 0
                return self.max_tokens - self._counter.PER_REQUEST
            if type(self._counter) is ChatTemplateTokenCounter:
                self._tools_cost_now = 0  # its count_messages([]), an int it computed when built
                return self.max_tokens - self._counter._empty
        request = self._request_cost()
        if tools_schema:
            tools, self._vary = self._tools_entry(tools_schema)
        else:
            tools = 0
        self._tools_cost_now = tools
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

    def _fit_tools(self, msgs: list[Any], tools_schema: Any, limit: int, sanitize: bool,
                   got: tuple[list[Message], bool]) -> tuple[list[Message], bool]:
        """``got`` (the output under ``limit``), trimmed further while the tools cost more in
        it than ``limit`` charged (``counter.tools_surplus``: Mistral's template prints them
        again before every user message equal to the last one), so that its cost plus that
        surplus is within ``limit``.

        An output over it is planned again under a lower budget, the larger of two: ``limit``
        less the surplus (the output keeps its repeats and pays for them), and, when the
        oldest message is dropped first, what the output costs after its oldest unpinned
        repeat (it drops that repeat, and with it some of the surplus). Each step plans less
        than the last, so this ends: with the largest output that fits when the newest are
        kept (fewer messages never cost more tools), or with the planner's
        ``ContextBudgetError`` when nothing fits."""
        counter = self._counter
        pinned = self.pinned_roles
        budget = limit
        while True:
            out = got[0]
            # (no repeat: no surplus, without rendering; the usual turn)
            repeats = counter._user_repeats(out)
            extra = counter._repeat_surplus(tools_schema, out) if repeats else 0
            if not extra:
                return got
            counts = self._counts(out, 0, len(out)).tolist()
            k = 0
            while k < len(out) and out[k].role in pinned and out[k] is msgs[k]:
                k += 1
            cost = sum(counts[k:]) if self._pinned_free else sum(counts)
            if cost + extra <= limit:
                return got
            budget = min(budget - 1, limit - extra)
            if self.trim_from_start:
                oldest = [i for i in repeats if i >= k]
                if oldest:
                    budget = max(budget, cost - sum(counts[k:oldest[0] + 1]))
            self._tools_cost_now = self.tools_cost(tools_schema) + extra  # (its error message says so)
            got = self._trim_general(msgs, budget, sanitize)

    def _describe_limit(self) -> str:
        tools = self._tools_cost_now
        extra = f" and {tools} the request's tools" if tools else ""
        return f"{self.max_tokens} tokens, {self._request_cost()} of them the request's fixed cost{extra}"

    def _eager_counts(self, msgs):
        return self._counts(msgs, 0, len(msgs)) if len(msgs) <= 64 else None

    def _counts(self, messages, lo, hi):
        if type(self._counter) is ChatTemplateTokenCounter:  # its costs of a slice (see count_list)
            a, counts = self._unit_counts(messages, lo, hi)
            return np.ascontiguousarray(counts[lo - a:], dtype=np.int64)
        part = messages[lo:hi]
        if self._count_array is not None:
            counts = self._count_array(part)
        else:
            counts = [self._counter.count_message(m) for m in part]
        if self._trusted:
            return np.ascontiguousarray(counts, dtype=np.int64)
        return self._checked(counts, lo)

    def _template_counts(self, new: list[Message]) -> Optional[list[int]]:
        """A turn's new messages counted by a ``ChatTemplateTokenCounter`` where they stand:
        ``new`` is ``self._turn_msgs[k:]`` (``k`` records before them), the first a system
        message charged as the conversation's first only at ``k == 0``, results that continue
        the unit before them counted with it (see ``_counts``), so each message is charged what
        a fresh filter charges it. None (counted later, where the plan needs them, by
        ``_fill_counts``) for messages that are not that slice: records patched in place, or
        items coerced to Messages."""
        msgs, rec = self._turn_msgs, self._rec
        k = rec.n if rec is not None else 0
        if (msgs is None or not new or len(msgs) - k != len(new) or msgs[k] is not new[0]
                or msgs[-1] is not new[-1]):
            return None
        if k and new[0].role == "tool":  # results that continue the unit before them
            a, counts = self._unit_counts(rec.msgs + new, k, k + len(new))
            # (the unit's earlier messages cost the same as a prefix of the longer unit on the
            # bundled templates; where a template's unit changes kind as it grows, their
            # records take the longer unit's charges, as a fresh filter gives them)
            if rec.counts[a:k].tolist() != counts[:k - a]:
                rec.set_counts(np.arange(a, k, dtype=np.int64), counts[:k - a])
            return counts[k - a:]  # type: ignore[no-any-return]
        return self._slice_list(msgs, k, new)

    def _unit_counts(self, msgs: list[Any], lo: int, hi: int) -> tuple[int, list[int]]:
        """``(a, counts)``: a ``ChatTemplateTokenCounter``'s charges of ``msgs[a:hi]``, ``a`` the
        start of the unit ``msgs[lo]`` is in (a tool result costs what it adds to its call and
        the results before it, wherever a slice starts), after the message before it."""
        a = lo
        while a > 0 and msgs[a].role == "tool":
            a -= 1
        return a, self._slice_list(msgs, a, msgs[a:hi])

    def _slice_list(self, msgs: list[Any], a: int, part: list[Any]) -> list[int]:
        """The counter's ``count_list(part, start, pred, opened)`` for ``part = msgs[a:hi]`` (its
        charges of the slice; ``a`` a unit start) with what the slice's place in ``msgs`` tells:
        ``start``, ``msgs[a]`` is the conversation's first message; ``pred``, the role of
        ``msgs[a - 1]`` ("call" for an assistant message with calls), None (every neighbour) at
        ``a == 0``, "any" (every unit, every neighbour) when messages other than system ones are
        pinned (a kept prompt may put any unit after the last of them); ``opened``, ``msgs``
        opens with a system message and only system messages are pinned (every kept prompt keeps
        it: no other message stands first). One Python call a turn (the hot loop's
        ``_template_counts``)."""
        pinned = self._pinned_roles
        first = msgs[0] if msgs else None
        opened = pinned == _SYSTEM_ONLY and type(first) is Message and first.role == "system"
        pred: Optional[str] = None
        if not pinned <= _SYSTEM_ONLY:
            pred = "any"
        elif a:
            m = msgs[a - 1]
            if type(m) is Message:
                pred = "call" if m.role == "assistant" and m.tool_calls else m.role
        return self._counter._count_list(part, a == 0, pred, opened)  # type: ignore[no-any-return]

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
