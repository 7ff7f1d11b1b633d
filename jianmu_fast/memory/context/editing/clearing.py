"""``ClearToolResultsFilter``: replace old tool results by a placeholder once the prompt is over
a trigger, in steps, monotonically along a growing history (the decision is the compiled
``plan_clearing``, see ``jianmu_fast/_editing_core_py.py``)."""

from __future__ import annotations

import array
import threading
from typing import Any, Iterable, NoReturn, Optional, Sequence

import numpy as np

from .... import _backend
from ...._editing_core_py import STATE_LEN, TURN_MAX as _TURN_MAX
from ....errors import JianmuError, TrimmingError
from ....message import Message
from ..counters import SimpleTokenCounter
from ..filters import _CACHED_COUNTERS, TokenBudgetFilter
from ._common import MAX_VALUE, TRUSTED, ObjectCache, check_counter, check_int, checked_counts, edited

__all__ = ["ClearToolResultsFilter"]

_clearing_turn = _backend.clearing_turn
_place_cleared = _backend.place_cleared
#: settings the compiled turn's arguments hold (set again: they are read again)
_ARMED_BY = frozenset({"_placeholder_cost", "_request"})
#: the settings: a change starts the records anew (the decision is a function of the messages and
#: the current settings), and of the placeholder or the counter, the costs derived from them too
_SETTINGS = frozenset({"trigger_tokens", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"})
_DERIVED_FROM = frozenset({"placeholder", "counter"})

#: ``kinds`` codes of the clearing core (see ``jianmu_fast/_editing_core_py.py``)
_UNIT, _EXCLUDED, _CLEARABLE, _PINNED, _ASSISTANT = 0, 1, 2, 3, 4


class _ClearRecords:
    """Everything the clearing stage knows about one history, extended as it grows: its
    messages (a copy), per-message records in ``array`` buffers (appending costs what is
    appended; the compiled core reads them in place), the compiled scan's ``state`` (so a
    longer history scans only its new messages) and the output for the history so far (the
    cleared copies in place)."""

    __slots__ = ("messages", "counts", "kinds", "savings", "results", "result_kinds", "calls", "owner",
                 "n_pinned", "base", "state", "out", "cleared", "shared")

    def __init__(self, base: int) -> None:
        self.messages: list[Message] = []
        self.counts = array.array("q")        # cost of each message, uncleared
        self.kinds = array.array("b")         # the core's kinds (see _editing_core_py)
        self.savings = array.array("q")       # what clearing each result saves
        self.results: list[int] = []          # indices of tool results, in order
        self.result_kinds: list[int] = []     # their kinds (1 excluded, 2 clearable)
        self.calls: dict[str, tuple[int, int]] = {}  # call id -> (assistant index, position in its calls)
        self.owner: dict[int, tuple[int, int]] = {}  # result index -> (assistant index, call position)
        self.n_pinned = 0                     # leading system messages so far
        self.base = base                      # the request's fixed cost and tools the scan used
        self.state = array.array("q", bytes(8 * STATE_LEN))
        self.out: list[Message] = []          # the output for ``messages``
        self.cleared = 0                      # results of ``out`` cleared (the core's ``cleared``)
        self.shared = False                   # ``out`` was handed out (the hot path): never changed but by appends

    @property
    def n(self) -> int:
        return len(self.messages)


class ClearToolResultsFilter:
    """Replace the content of old tool results by ``placeholder`` once the prompt is over
    ``trigger_tokens``.

    The prompt is counted as ``TokenBudgetFilter`` counts it: the messages with their chat
    overhead, the request's fixed cost and the request's tools (``apply(..., tools_schema=)``).
    Never cleared: the ``keep`` newest tool results (of any tool) and results of tools named in
    ``exclude_tools``. With ``clear_tool_inputs=True`` the arguments of the calls whose results
    were cleared become ``{}``. Every message keeps its role and ids.

    The decision is a pure function of the messages and settings, made by the compiled core
    (``plan_clearing``, see ``jianmu_fast/_editing_core_py.py``) in a scan over per-message
    records of the growing history, resumed where the previous call stopped when the history
    extends the previous one. With ``clear_at_least=0`` every eligible result is cleared
    whenever the prompt is over the trigger (all but the ``keep`` newest results). With
    ``clear_at_least=C > 0`` the two stages' steps are designed together: the scan follows
    ``TokenBudgetFilter(trigger_tokens, eviction="chunked", chunk=C)`` (pinned system prompt,
    units), and a *step* is taken only where that filter's cut moves anyway (the prompt stops
    extending the previous one there, so the step costs no cache miss of its own; at the
    moving message, or at the next one that is not an assistant message). A step clears the
    oldest eligible results, at least ``C`` tokens of them or all that are eligible, as many as
    keep the cut's room (how far the prompt may grow before the cut moves again, computed on
    the cleared costs) at nine tenths of what the move alone leaves or more; none if no run
    does. The decision is monotone: as a conversation grows, a result once cleared stays
    cleared, so between two steps each prompt extends the previous one. (It depends on the
    messages before it, the pinned system prompt and the tools included: change those and the
    steps move. A setting changed on the instance applies from the next call, as to a new
    filter.)

    >>> from jianmu_fast.message import human, ai, tool
    >>> def call(i):
    ...     return ai(None, tool_calls=[{"id": f"c{i}", "type": "function",
    ...                                  "function": {"name": "search", "arguments": "{}"}}])
    >>> history = [human("find it")]
    >>> for i in range(5):
    ...     history += [call(i), tool("result " * 100, tool_call_id=f"c{i}")]
    >>> out = ClearToolResultsFilter(500, keep=2).apply(history)
    >>> [m.content[:6] for m in out if m.role == "tool"]
    ['[clear', '[clear', '[clear', 'result', 'result']
    >>> [m.id for m in out] == [m.id for m in history]
    True
    """

    def __init__(
        self,
        trigger_tokens: int,
        counter: Any = None,
        *,
        keep: int = 3,
        clear_at_least: int = 0,
        exclude_tools: Iterable[str] = (),
        clear_tool_inputs: bool = False,
        placeholder: str = "[cleared]",
    ) -> None:
        self.trigger_tokens = check_int("trigger_tokens", trigger_tokens, 0)
        self.keep = check_int("keep", keep, 0)
        self.clear_at_least = check_int("clear_at_least", clear_at_least, 0)
        if isinstance(exclude_tools, (str, bytes)):
            raise TypeError(f"exclude_tools must be a collection of tool names, not a string ({exclude_tools!r})")
        names = tuple(exclude_tools)
        for i, name in enumerate(names):
            if not isinstance(name, str):
                raise TypeError(f"exclude_tools[{i}]: expected a tool name (str), got {type(name).__name__}")
        self.exclude_tools = frozenset(names)
        if not isinstance(clear_tool_inputs, bool):
            raise TypeError(f"clear_tool_inputs: expected a bool, got {type(clear_tool_inputs).__name__}")
        self.clear_tool_inputs = clear_tool_inputs
        if not isinstance(placeholder, str):
            raise TypeError(f"placeholder: expected a str, got {type(placeholder).__name__}")
        self.placeholder = placeholder
        self.counter = check_counter(counter)
        # counters whose message count is additive in the content: savings without a copy
        self._additive = self._trusted = type(self.counter).__name__ in TRUSTED
        self._tools = TokenBudgetFilter(MAX_VALUE, self.counter)  # its cached tools_cost
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        request = self.counter.count_messages([])
        if isinstance(request, bool) or not isinstance(request, (int, np.integer)) or not 0 <= request <= MAX_VALUE:
            raise TypeError(f"counter {self.counter!r}: count_messages([]) must be an int between 0 and 2**53, got {request!r}")
        self._request = int(request)  # the request's fixed cost
        self._placeholder_cost = int(self.counter.count_text(self.placeholder)) if self._additive else 0
        if "_hot_turn" not in self.__dict__:
            # the builder's hot call (see _arm): one per filter, never replaced (a plan holds it)
            self._hot_turn = _backend.ClearingTurn(self, Message)
        self._rec = _ClearRecords(-1)
        self._turn_args: Optional[tuple[Any, ...]] = None  # see _arm
        # the compiled turn (``clearing_turn``) reads the counter's caches
        self._cached = type(self.counter) in _CACHED_COUNTERS
        self._cleared_cache = ObjectCache()
        self._inputs_cache = ObjectCache()

    def __repr__(self) -> str:
        opts = f", keep={self.keep}, clear_at_least={self.clear_at_least}"
        if self.exclude_tools:
            opts += f", exclude_tools={tuple(sorted(self.exclude_tools))!r}"
        if self.clear_tool_inputs:
            opts += ", clear_tool_inputs=True"
        return f"ClearToolResultsFilter(trigger_tokens={self.trigger_tokens}, counter={self.counter!r}{opts})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_rec", "_cleared_cache", "_inputs_cache", "_lock", "_turn_args", "_hot_turn"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # -- records ---------------------------------------------------------------------------

    def _cleared_result(self, m: Message) -> Message:
        out = self._cleared_cache.get(m)
        if out is None:
            edit: dict[str, Any] = {"kind": "cleared"}
            out = edited(m, {"content": self.placeholder}, edit)
            # metadata holds ``edit`` itself (never sent, never counted): fill in what was saved
            edit["tokens_saved"] = max(0, int(self.counter.count_message(m)) - int(self.counter.count_message(out)))
            self._cleared_cache.put(m, out)
        return out

    def _result_saving(self, m: Message, count: int) -> int:
        """Tokens clearing ``m`` saves (its content's cost less the placeholder's)."""
        if self._additive:
            ct = self.counter.count_text
            c = m.content
            if type(c) is str or isinstance(c, str):
                cost = ct(c)
            elif c:
                image = int(getattr(self.counter, "image_tokens", SimpleTokenCounter.PER_NON_TEXT_BLOCK))
                cost = sum(ct(b["text"]) if b.get("type") == "text" else image for b in c)
            else:
                cost = 0
            return cost - self._placeholder_cost
        return count - int(self.counter.count_message(self._cleared_result(m)))

    def _without_inputs(self, a: Message, positions: frozenset[int]) -> Message:
        got = self._inputs_cache.get(a)
        if got is not None and got[0] == positions:
            return got[1]
        calls = [dict(c) for c in a.tool_calls or ()]
        ids = []
        for p in sorted(positions):
            fn = dict(calls[p]["function"])
            fn["arguments"] = "{}"
            calls[p]["function"] = fn
            ids.append(calls[p].get("id"))
        out = edited(a, {"tool_calls": calls}, {"kind": "inputs_cleared", "calls": ids})
        self._inputs_cache.put(a, (positions, out))
        return out

    def _new_counts(self, new: list[Message]) -> list[int]:
        if len(new) <= 4:
            count = self.counter.count_message
            counts = [count(m) for m in new]
            if not self._trusted and (min(counts) < 0 or max(counts) > MAX_VALUE or
                                      not all(isinstance(c, (int, np.integer)) for c in counts)):
                raise TrimmingError(f"counter {self.counter!r} returned a count outside [0, 2**53]")
            return counts
        return checked_counts(self.counter, new).tolist()

    def _append(self, rec: _ClearRecords, msgs: list[Message], k: int, new: list[Message]) -> None:
        """Records of ``new``, that is ``msgs[k:]`` (``msgs[:k]`` is ``rec.messages``)."""
        if self._trusted and len(new) <= _TURN_MAX:  # a turn, or a short fresh start: no array, no check
            count = self.counter.count_message
            counts = [count(m) for m in new]
        else:
            counts = self._new_counts(new)
        add_kind = rec.kinds.append
        add_saving = rec.savings.append
        # calls and owners serve exclude_tools and clear_tool_inputs only (a change of either
        # starts the records anew); without them a result with text content is recorded inline
        plain = self._additive and not self.exclude_tools and not self.clear_tool_inputs
        text, placeholder = self.counter.count_text, self._placeholder_cost
        i = k
        for m in new:
            role = m.role
            if role == "tool":
                content = m.content
                if plain and type(content) is str:
                    rec.results.append(i)
                    rec.result_kinds.append(_CLEARABLE)
                    add_kind(_CLEARABLE)
                    add_saving(min(max(0, text(content) - placeholder), counts[i - k]))
                else:
                    kind, saved = self._result_record(rec, msgs, i, m, counts[i - k])
                    add_kind(kind)
                    add_saving(saved)
                i += 1
                continue
            if role == "assistant":
                add_kind(_ASSISTANT)
                if m.tool_calls and not plain:
                    for p, c in enumerate(m.tool_calls):
                        cid = c.get("id")
                        if cid:
                            rec.calls[cid] = (i, p)
            elif role == "system" and i == rec.n_pinned:
                add_kind(_PINNED)
                rec.n_pinned += 1
            else:
                add_kind(_UNIT)
            add_saving(0)
            i += 1
        rec.counts.extend(counts)
        rec.messages.extend(new)

    def _result_record(self, rec: _ClearRecords, msgs: list[Message], i: int, m: Message,
                       count: int) -> tuple[int, int]:
        """The kind of the tool result ``msgs[i]`` and what clearing it saves."""
        rec.results.append(i)
        owner = rec.calls.get(m.tool_call_id) if m.tool_call_id else None
        if owner is None:
            a = i - 1
            while a >= 0 and msgs[a].role == "tool":
                a -= 1
            if a >= 0 and msgs[a].role == "assistant" and len(msgs[a].tool_calls or ()) == 1:
                owner = (a, 0)
        name = m.name
        if owner is not None:
            rec.owner[i] = owner
            name = (msgs[owner[0]].tool_calls or ())[owner[1]]["function"]["name"]
        if name in self.exclude_tools:
            rec.result_kinds.append(_EXCLUDED)
            return _EXCLUDED, 0
        rec.result_kinds.append(_CLEARABLE)
        c = m.content
        if self._additive and type(c) is str:  # (_result_saving's common case, inline)
            saved = self.counter.count_text(c) - self._placeholder_cost
        else:
            saved = self._result_saving(m, count)
        if self.clear_tool_inputs and owner is not None:
            call_msg = msgs[owner[0]]
            saved += int(self.counter.count_message(call_msg)) - int(
                self.counter.count_message(self._without_inputs(call_msg, frozenset((owner[1],)))))
        return _CLEARABLE, min(max(0, saved), count)

    # -- the filter --------------------------------------------------------------------------

    def _update(self, msgs: list[Message], tools_schema: Any) -> _ClearRecords:
        """The records of ``msgs``, their decision made and their output up to date. A history
        that extends the previous one (the agent loop) costs only its new messages: one C-level
        comparison of the old part, records and a resumed compiled scan for the new part, and
        the previous output objects extended (the cleared copies are the same objects turn
        after turn, so the next stage sees a prompt that extends its previous one)."""
        base = self._base(tools_schema, msgs)
        rec = self._rec
        ref = rec.messages
        k = len(ref)
        n = len(msgs)
        if rec.base != base or not _backend.extends(ref, msgs):
            rec = self._rec = _ClearRecords(base)
            k = 0
        if n == k:
            if rec.state[0] != n or rec.state[2] != rec.cleared:
                self._plan(rec)  # (records a compiled turn made: their scan or their step's copies)
            return rec
        new = msgs[k:]
        self._append(rec, msgs, k, new)
        if rec.shared:  # handed out: a new list (see _hot_apply)
            rec.out = rec.out + new
            rec.shared = False
            self._turn_args = None
        else:
            rec.out.extend(new)
        self._plan(rec)
        return rec

    def _plan(self, rec: _ClearRecords) -> None:
        """The compiled scan over the records not scanned yet, and the output's new clearing."""
        cleared, _ = _backend.plan_clearing(rec.counts, rec.kinds, rec.savings, rec.base, self.trigger_tokens,
                                            self.clear_at_least, self.keep, rec.state)
        if cleared > rec.cleared:
            self._step(rec, cleared)

    def _step(self, rec: _ClearRecords, cleared: int) -> None:
        """The output's new clearing: the results ``rec.cleared:cleared`` (a new list if handed out)."""
        if rec.shared:  # handed out: a new list (see _hot_apply)
            rec.out = rec.out[:]
            rec.shared = False
            self._turn_args = None
        self._edit(rec, cleared)

    def _edit(self, rec: _ClearRecords, cleared: int) -> None:
        """Clear the results ``rec.cleared:cleared`` in ``rec.out`` (and their calls' inputs)."""
        msgs, out = rec.messages, rec.out
        start = first = rec.cleared
        rec.cleared = cleared
        # the cached copies placed in one compiled call (a step clears many); a copy not made yet is
        # made here, and the call goes on after it
        cache = self._cleared_cache._d
        while True:
            r = _place_cleared(out, msgs, rec.results, rec.result_kinds, start, cleared, cache)
            if r >= cleared:
                break
            i = rec.results[r]
            out[i] = self._cleared_result(msgs[i])
            start = r + 1
        new = [i for i, kind in zip(rec.results[first:cleared], rec.result_kinds[first:cleared])
               if kind == _CLEARABLE] if self.clear_tool_inputs else ()
        if new:
            owner = rec.owner
            touched = {owner[i][0] for i in new if i in owner}
            cleared_calls: dict[int, set[int]] = {}
            for i, kind in zip(rec.results[:cleared], rec.result_kinds):
                o = owner.get(i)
                if kind == _CLEARABLE and o is not None and o[0] in touched:
                    cleared_calls.setdefault(o[0], set()).add(o[1])
            for a, positions in cleared_calls.items():
                out[a] = self._without_inputs(msgs[a], frozenset(positions))

    def cleared_results(self, messages: Sequence[Message], tools_schema: Any = None) -> list[int]:
        """Indices of the tool results of ``messages`` that ``apply`` clears.

        >>> from jianmu_fast.message import human
        >>> ClearToolResultsFilter(10).cleared_results([human("hi")])
        []
        """
        msgs = messages if isinstance(messages, list) else list(messages)
        with self._lock:
            self._turn_args = None
            rec = self._update(msgs, tools_schema)
            return [i for i, k in zip(rec.results[:rec.cleared], rec.result_kinds) if k == _CLEARABLE]

    def apply(self, messages: Sequence[Message], local_state: Any = None, global_state: Any = None,
              ctx: Any = None, *, tools_schema: Optional[Sequence[dict[str, Any]]] = None,
              **kwargs: Any) -> list[Message]:
        """``messages`` with the old tool results cleared (a new list; the input is untouched)."""
        try:
            with self._lock:
                self._turn_args = None  # ``messages`` may change in any way: no hand-off resumes from it
                msgs = messages if type(messages) is list else list(messages)
                return self._update(msgs, tools_schema).out[:]
        except JianmuError:
            raise
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> NoReturn:
        self._rec = _ClearRecords(-1)  # never resume from a half-updated history (no compiled turn either)
        raise TrimmingError(f"{type(self).__name__}: could not clear tool results ({type(exc).__name__}: {exc})") from exc

    def _hot_apply(self, src: list[Message], tools_schema: Any = None) -> list[Message]:
        """``apply`` for the builder's hot path (``ContextBuilder._filter_hot``): ``src`` is a
        list of Messages that is only ever grown by appends while it is the same object (the
        builder's prompt, or the previous stage's own output). Returns this stage's OWN output
        list, not a copy, under the same rule: grown in place by appends only, while it is the
        same object; a clearing step or an input that does not extend the previous one makes a
        new list. The caller only reads it. When ``src`` is the list of the previous call, the
        new messages' records and the scan's decision are one compiled call
        (``clearing_turn``), which leaves only a step or a move of the chunked cut to the full
        scan; a call that finds the stage busy gets ``apply``'s copy."""
        lock = self._lock
        if not lock.acquire(False):
            return self.apply(src, tools_schema=tools_schema)
        try:
            self._hot_turn.disarm(True)  # (re-armed by _arm or rearm below; else disarmed for good)
            args = self._turn_args
            if args is not None and src is args[0] and not tools_schema:
                rec = self._rec
                st = rec.state
                if st[2] > rec.cleared and st[0] == len(rec.messages) == len(src) == len(rec.out):
                    # a step the compiled turn (_hot_turn) recorded and scanned: its cleared copies
                    self._step(rec, st[2])
                    self._arm(src)
                    return rec.out
                # the agent loop's turn: one compiled call, the full scan only for a step or a move
                got = _clearing_turn(*args)
                rec = self._rec
                if got == 0 and rec.state[2] == rec.cleared:
                    if self._turn_args is args:  # (what the compiled turn held: armed again, cheaply)
                        self._hot_turn.rearm()
                    else:
                        self._arm(src)
                    return args[2]
                if got >= 0:  # (a step the compiled turn (_hot_turn) scanned: its cleared copies)
                    self._plan(rec)
                    self._arm(src)
                    return self._rec.out
            self._turn_args = None
            rec = self._update(src, tools_schema)
            if not tools_schema:
                self._arm(src)
            rec.shared = True
            return rec.out
        except JianmuError:
            raise
        except Exception as exc:
            self._failed(exc)
        finally:
            lock.release()

    def _warm(self, src: list[Message], k: int) -> None:
        """Count the new messages ``src[k:]`` (and their tool results' contents) into the
        counter's caches, which the compiled turn reads (``_hot_turn``: a turn whose new
        messages were not counted yet). Takes no lock (the counter is shared anyway); a counter
        that fails leaves it to ``_hot_apply``."""
        count, text = self.counter.count_message, self.counter.count_text
        try:
            for m in src[k:k + _TURN_MAX]:
                count(m)
                if m.role == "tool" and type(m.content) is str:
                    text(m.content)
        except Exception:  # (the general path reports it)
            pass

    def _arm(self, src: list[Message]) -> None:
        """The compiled turn's arguments for the next hot call with ``src`` (the input of this
        one, which only grows by appends), when it may be taken: a counter with the message
        and text caches, no ``exclude_tools``, no ``clear_tool_inputs`` and no tools (their
        cost would be checked per call)."""
        rec = self._rec
        if self._cached and not self.exclude_tools and not self.clear_tool_inputs and rec.base == self._request:
            rec.shared = True
            args = (src, rec.messages, rec.out, rec.counts, rec.kinds, rec.savings, rec.results,
                    rec.result_kinds, rec.state, self.counter,
                    (self._placeholder_cost, self.trigger_tokens, self.clear_at_least, self.keep))
            self._turn_args = args
            self._hot_turn.arm(*args)
        else:
            self._turn_args = None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "_turn_args" and value is None:
            turn = self.__dict__.get("_hot_turn")
            if turn is not None:
                turn.disarm()
        elif name in _ARMED_BY or name == "_rec":  # the compiled turn's arguments are read again
            self._turn_args = None
        elif "_rec" in self.__dict__ and (name in _SETTINGS or name in _DERIVED_FROM):
            # a setting changed after records were made (records made without calls and owners by
            # the compiled turn included): the next call starts anew, on either path
            if name in _DERIVED_FROM:
                if name == "counter":
                    object.__setattr__(self, "counter", check_counter(value))
                    self._additive = self._trusted = type(self.counter).__name__ in TRUSTED
                    self._tools = TokenBudgetFilter(MAX_VALUE, self.counter)
                self._reset()
            else:
                self._rec = _ClearRecords(-1)

    def _base(self, tools_schema: Any, msgs: Sequence[Message] = ()) -> int:
        """What the request of ``msgs`` costs before its messages: its fixed cost and
        ``tools_schema``, as often as the template prints them for ``msgs`` (Mistral's again
        for a repeated last user message, which clearing keeps: it clears only tool results
        and call arguments)."""
        return self._request + (self._tools.tools_cost(tools_schema, msgs) if tools_schema else 0)
