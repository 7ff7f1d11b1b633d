"""Context editing: cap oversized tool results, clear old ones, summarize what the budget drops.

Three filters, usable alone, in any ``ContextBuilder`` and in ``ContextBuilder.for_react``:

- :class:`ToolResultCapFilter` cuts a tool result over ``max_tokens`` to its head and tail
  around a marker saying how many tokens were left out;
- :class:`ClearToolResultsFilter` replaces the content of old tool results by a placeholder
  once the prompt is over a trigger, in steps, monotonically along a growing history;
- :class:`SummarizingBudgetFilter` is a token budget that puts one summary of what it drops
  right after the pinned prefix.

They edit content, never roles or ids, so tool-call pairing stays valid. An edited message is a
new ``Message`` (the caller's object is untouched) with the same ``id`` and a
``metadata["context_edit"]`` entry saying what was done (``{"kind": "cut" | "cleared" |
"inputs_cleared" | "summary", ...}``); :func:`describe_edits` turns those into the line
``build_report`` shows. Edits are computed once per distinct message and cached, so a hot loop
returns the same objects turn after turn (the next stage's caches hit, and a prompt that
extends the previous one still does).

Run them before the budget filter, in this order: cap, clear, budget (``for_react`` does).
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures
import hashlib
import inspect
import json
import logging
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ... import _backend
from ..._editing_core_py import STATE_LEN
from ...errors import ContextBudgetError, JianmuError, TrimmingError
from ...message import Message
from .counters import SimpleTokenCounter
from .filters import Eviction, TokenBudgetFilter

__all__ = [
    "ToolResultCapFilter",
    "ClearToolResultsFilter",
    "SummarizingBudgetFilter",
    "SummaryFailedWarning",
    "summarizer_from_client",
    "describe_edits",
    "DEFAULT_CUT_MARKER",
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_HEADER",
]

logger = logging.getLogger("jianmu_fast.context")

MAX_VALUE = 1 << 53
EDIT_KEY = "context_edit"
DEFAULT_CUT_MARKER = "\n[... {omitted} tokens omitted ...]\n"
SUMMARY_HEADER = "Summary of the earlier conversation:\n"
DEFAULT_SUMMARY_PROMPT = (
    "You condense the earlier part of a conversation between a user, an assistant and its tools, "
    "so that the assistant can continue without it. Keep every fact, decision, identifier, number, "
    "file name and open question the rest of the conversation may need; drop greetings and "
    "repetition. If a previous summary is given, extend it with the new messages. Answer with "
    "the summary only, in short plain sentences."
)
_CACHE_SIZE = 8192


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or value > MAX_VALUE:
        raise ValueError(f"{name} must be an int between {lo} and 2**53, got {value!r}")
    return value


def _check_counter(counter: Any) -> Any:
    counter = SimpleTokenCounter() if counter is None else counter
    if not (callable(getattr(counter, "count_message", None)) and callable(getattr(counter, "count_messages", None))):
        raise TypeError(
            "counter: expected a TokenCounterProtocol (count_message(m), count_messages(ms)), "
            f"got {type(counter).__name__}"
        )
    return counter


def _edited(m: Message, update: dict[str, Any], edit: dict[str, Any]) -> Message:
    meta = dict(m.metadata)
    meta[EDIT_KEY] = edit
    update = dict(update)
    update["metadata"] = meta
    return m.model_copy(update=update)


class _ObjectCache:
    """Values keyed by a Message object (its identity, held weakly), at most ``size`` of them."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._d: dict[int, tuple[Any, Any]] = {}
        self._size = size

    def get(self, m: Any) -> Any:
        e = self._d.get(id(m))
        if e is not None and e[0]() is m:
            return e[1]
        return None

    def put(self, m: Any, value: Any) -> None:
        d = self._d
        d[id(m)] = (weakref.ref(m), value)
        if len(d) > self._size:
            for key in list(d)[: len(d) - (self._size * 3) // 4]:
                del d[key]


_TRUSTED = ("SimpleTokenCounter", "TiktokenTokenCounter", "HFTokenCounter")


def _counts(counter: Any, messages: Sequence[Message]) -> np.ndarray:
    fn = getattr(counter, "count_array", None)
    if fn is not None:
        arr = np.asarray(fn(messages), dtype=np.int64)
    else:
        arr = np.array([int(counter.count_message(m)) for m in messages], dtype=np.int64)
    if type(counter).__name__ not in _TRUSTED and len(arr):
        values = arr.tolist()
        if min(values) < 0 or max(values) > MAX_VALUE:
            raise TrimmingError(f"counter {counter!r} returned a count outside [0, 2**53]")
    return np.ascontiguousarray(arr)


# -- cutting text on token boundaries -------------------------------------------------------


class _Cutter:
    """Head and tail pieces of a text on the counter's token boundaries (never inside a
    UTF-8 character): tiktoken tokens for ``TiktokenTokenCounter``, the tokenizer's offsets
    for ``HFTokenCounter``, characters (by binary search on ``count_text``) otherwise."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        enc = getattr(counter, "_enc", None)
        self._enc = enc if callable(getattr(enc, "encode_ordinary", None)) and callable(getattr(enc, "decode_bytes", None)) else None
        tok = getattr(counter, "_tok", None)
        self._tok = tok if self._enc is None and callable(getattr(tok, "encode", None)) else None
        ct = getattr(counter, "count_text", None)
        if not callable(ct):
            raise TypeError(f"counter {counter!r} has no count_text(text): the cut needs one to count text pieces")
        self.count_text = ct

    def pieces(self, text: str, head: int, tail: int) -> tuple[str, str]:
        """The longest prefix of ``text`` of at most ``head`` tokens and suffix of at most
        ``tail`` tokens (of the text's own tokenization), not overlapping."""
        head, tail = max(0, head), max(0, tail)
        if self._enc is not None:
            toks = self._enc.encode_ordinary(text)
            n = len(toks)
            tail = min(tail, n - min(head, n))
            raw = text.encode("utf-8")
            h = len(self._enc.decode_bytes(toks[:head])) if head else 0
            while 0 < h < len(raw) and (raw[h] & 0xC0) == 0x80:
                h -= 1
            t = len(raw) - len(self._enc.decode_bytes(toks[n - tail:])) if tail else len(raw)
            while h < t < len(raw) and (raw[t] & 0xC0) == 0x80:
                t += 1
            t = max(t, h)
            return raw[:h].decode("utf-8"), raw[t:].decode("utf-8")
        if self._tok is not None:
            offsets = self._tok.encode(text, add_special_tokens=False).offsets
            n = len(offsets)
            head = min(head, n)
            tail = min(tail, n - head)
            h = offsets[head - 1][1] if head else 0
            t = offsets[n - tail][0] if tail else len(text)
            t = max(t, h)
            return text[:h], text[t:]
        h = self._longest(text, head, from_end=False)
        t = len(text) - self._longest(text[h:], tail, from_end=True)
        return text[:h], text[t:]

    def _longest(self, text: str, budget: int, from_end: bool) -> int:
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            piece = text[len(text) - mid:] if from_end else text[:mid]
            if self.count_text(piece) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def cut(self, text: str, max_tokens: int, marker: str) -> Optional[tuple[str, int]]:
        """``text`` cut to head + marker + tail within ``max_tokens`` (by ``count_text``), and
        the tokens left out; ``None`` when ``text`` fits already."""
        n = self.count_text(text)
        if n <= max_tokens:
            return None
        budget = max_tokens - self.count_text(marker.format(omitted=n))
        for _ in range(16):
            if budget <= 0:
                break
            head, tail = self.pieces(text, (budget + 1) // 2, budget // 2)
            omitted = max(0, n - self.count_text(head) - self.count_text(tail))
            out = head + marker.format(omitted=omitted) + tail
            got = self.count_text(out)
            if got <= max_tokens:
                return out, omitted
            budget -= max(1, got - max_tokens)
        for out in (marker.format(omitted=n), "[...]", ""):
            if self.count_text(out) <= max_tokens:
                return out, n
        return "", n  # pragma: no cover - count_text("") is 0 for every counter


# -- ToolResultCapFilter ----------------------------------------------------------------------


class ToolResultCapFilter:
    """Cut every tool result whose content counts more than ``max_tokens`` to its head and
    tail around ``marker`` (``{omitted}`` is replaced by the number of tokens left out).

    The content of a cut result counts at most ``max_tokens`` by ``counter.count_text``
    (default ``SimpleTokenCounter()``); results under the cap, and every other message, are
    returned unchanged (the same objects). Cuts fall on the counter's token boundaries and never
    split a UTF-8 character. Structured content is cut in its text blocks: whole blocks from the
    start and from the end are kept while they fit, the block where the cut falls keeps its head
    (or tail), text blocks in between are left out, other blocks stay. The cut of a message is
    computed once and cached.

    >>> from jianmu_fast.message import human, tool
    >>> f = ToolResultCapFilter(20)
    >>> out = f.apply([human("q"), tool("0123456789" * 40, tool_call_id="c1")])
    >>> out[1].content
    '012345678901234567890123\\n[... 88 tokens omitted ...]\\n678901234567890123456789'
    >>> SimpleTokenCounter().count_text(out[1].content) <= 20, out[1].metadata["context_edit"]["kind"]
    (True, 'cut')
    """

    def __init__(self, max_tokens: int, counter: Any = None, *, marker: str = DEFAULT_CUT_MARKER) -> None:
        self.max_tokens = _check_int("max_tokens", max_tokens, 1)
        if not isinstance(marker, str):
            raise TypeError(f"marker: expected a str, got {type(marker).__name__}")
        try:
            marker.format(omitted=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"marker: a format string whose only field is {{omitted}}, got {marker!r} ({exc})") from None
        self.marker = marker
        self.counter = _check_counter(counter)
        self._cutter = _Cutter(self.counter)
        self._cache = _ObjectCache()
        self._last: Optional[tuple[list[Message], list[Message]]] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ToolResultCapFilter(max_tokens={self.max_tokens}, counter={self.counter!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_last"] = None
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache = _ObjectCache()
        self._lock = threading.Lock()

    def cap(self, message: Message) -> Message:
        """``message`` cut to the cap (a tool result over it), else ``message`` itself.

        >>> from jianmu_fast.message import tool
        >>> m = tool("short", tool_call_id="c1")
        >>> ToolResultCapFilter(20).cap(m) is m
        True
        """
        if message.role != "tool":
            return message
        out = self._cache.get(message)
        if out is None:
            out = self._cap(message)
            self._cache.put(message, out)
        return out

    def _cap(self, m: Message) -> Message:
        content = m.content
        if isinstance(content, str):
            got = self._cutter.cut(content, self.max_tokens, self.marker)
            if got is None:
                return m
            before = self._cutter.count_text(content)
            return _edited(m, {"content": got[0]}, {"kind": "cut", "tokens_before": before,
                                                   "tokens_after": self._cutter.count_text(got[0]), "omitted": got[1]})
        if not content:
            return m
        return self._cap_blocks(m, list(content))

    def _block_cost(self, block: Any) -> int:
        if block.get("type") == "text":
            return self._cutter.count_text(block["text"])
        return int(getattr(self.counter, "image_tokens", SimpleTokenCounter.PER_NON_TEXT_BLOCK))

    def _cap_blocks(self, m: Message, blocks: list[Any]) -> Message:
        costs = [self._block_cost(b) for b in blocks]
        before = sum(costs)
        if before <= self.max_tokens:
            return m
        text_idx = [i for i, b in enumerate(blocks) if b.get("type") == "text"]
        fixed = before - sum(costs[i] for i in text_idx)
        omitted_guess = before - self.max_tokens
        allowance = self.max_tokens - fixed - self._cutter.count_text(self.marker.format(omitted=omitted_guess))
        for _ in range(16):
            new = self._cut_text_blocks(blocks, costs, text_idx, allowance, before - fixed)
            if new is not None:
                after = sum(self._block_cost(b) for b in new[0])
                if after <= self.max_tokens:
                    return _edited(m, {"content": new[0]}, {"kind": "cut", "tokens_before": before,
                                                             "tokens_after": after, "omitted": new[1]})
                allowance -= max(1, after - self.max_tokens)
            else:
                break
        # nothing of the text fits: the non-text blocks and the marker alone (or nothing)
        keep = [b for b in blocks if b.get("type") != "text"]
        text_total = before - fixed
        for marker in (self.marker.format(omitted=text_total), "[...]"):
            trial = keep + [{"type": "text", "text": marker}]
            if sum(self._block_cost(b) for b in trial) <= self.max_tokens:
                return _edited(m, {"content": trial}, {"kind": "cut", "tokens_before": before,
                                                       "tokens_after": sum(self._block_cost(b) for b in trial),
                                                       "omitted": text_total})
        return _edited(m, {"content": ""}, {"kind": "cut", "tokens_before": before, "tokens_after": 0, "omitted": before})

    def _cut_text_blocks(self, blocks, costs, text_idx, allowance, text_total):
        if allowance <= 0 or not text_idx:
            return None
        head_left, tail_left = (allowance + 1) // 2, allowance // 2
        i_pos = 0
        while i_pos < len(text_idx) and costs[text_idx[i_pos]] <= head_left:
            head_left -= costs[text_idx[i_pos]]
            i_pos += 1
        j_pos = len(text_idx) - 1
        while j_pos > i_pos and costs[text_idx[j_pos]] <= tail_left:
            tail_left -= costs[text_idx[j_pos]]
            j_pos -= 1
        if i_pos >= len(text_idx):
            return None  # pragma: no cover - the text blocks do not fit the allowance
        i, j = text_idx[i_pos], text_idx[j_pos]
        out: list[Any] = []
        kept = 0
        for k, b in enumerate(blocks):
            if b.get("type") != "text" or k < i or k > j:
                out.append(dict(b))
                if b.get("type") == "text":
                    kept += costs[k]
                continue
            if k == i == j:
                head, tail = self._cutter.pieces(b["text"], head_left, tail_left)
                kept += self._cutter.count_text(head) + self._cutter.count_text(tail)
                out.append({**b, "text": head + "\0MARK\0" + tail})
            elif k == i:
                head, _ = self._cutter.pieces(b["text"], head_left, 0)
                kept += self._cutter.count_text(head)
                out.append({**b, "text": head + "\0MARK\0"})
            elif k == j:
                _, tail = self._cutter.pieces(b["text"], 0, tail_left)
                kept += self._cutter.count_text(tail)
                out.append({**b, "text": tail})
        omitted = max(0, text_total - kept)
        for b in out:
            if b.get("type") == "text" and "\0MARK\0" in b["text"]:
                b["text"] = b["text"].replace("\0MARK\0", self.marker.format(omitted=omitted))
        return out, omitted

    def apply(self, messages: Sequence[Message], local_state: Any = None, global_state: Any = None,
              ctx: Any = None, **kwargs: Any) -> list[Message]:
        """``messages`` with every tool result over the cap cut (a new list; the input is untouched).

        A history that extends the previous call's (the agent loop) costs only its new messages."""
        with self._lock:
            return self._apply(messages)

    def _apply(self, messages: Sequence[Message]) -> list[Message]:
        msgs = messages if type(messages) is list else list(messages)
        last = self._last
        if last is not None:
            ref, out = last  # our own lists: the previous input and its output, grown in place
            k = len(ref)
            if _backend.extends(ref, msgs):
                if len(msgs) > k:
                    new = msgs[k:]
                    capped = [self.cap(m) for m in new]  # (raises before anything is extended)
                    ref.extend(new)
                    out.extend(capped)
                return out[:]
        out = [self.cap(m) for m in msgs]
        self._last = (msgs[:], out)
        return out[:]


# -- ClearToolResultsFilter -------------------------------------------------------------------

#: ``kinds`` codes of the clearing core (see ``jianmu_fast/_editing_core_py.py``)
_UNIT, _EXCLUDED, _CLEARABLE, _PINNED, _ASSISTANT = 0, 1, 2, 3, 4


class _ClearRecords:
    """Everything the clearing stage knows about one history, extended as it grows: its
    messages (a copy), per-message records in ``array`` buffers (appending costs what is
    appended; the compiled core reads them in place), the compiled scan's ``state`` (so a
    longer history scans only its new messages) and the output for the history so far (the
    cleared copies in place)."""

    __slots__ = ("messages", "counts", "kinds", "savings", "results", "result_kinds", "calls", "owner",
                 "n_pinned", "base", "state", "out", "cleared")

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
    steps move.)

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
        self.trigger_tokens = _check_int("trigger_tokens", trigger_tokens, 0)
        self.keep = _check_int("keep", keep, 0)
        self.clear_at_least = _check_int("clear_at_least", clear_at_least, 0)
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
        self.counter = _check_counter(counter)
        # counters whose message count is additive in the content: savings without a copy
        self._additive = self._trusted = type(self.counter).__name__ in _TRUSTED
        self._tools = TokenBudgetFilter(MAX_VALUE, self.counter)  # its cached tools_cost
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        request = self.counter.count_messages([])
        if isinstance(request, bool) or not isinstance(request, (int, np.integer)) or not 0 <= request <= MAX_VALUE:
            raise TypeError(f"counter {self.counter!r}: count_messages([]) must be an int between 0 and 2**53, got {request!r}")
        self._request = int(request)  # the request's fixed cost
        self._placeholder_cost = int(self.counter.count_text(self.placeholder)) if self._additive else 0
        self._rec = _ClearRecords(-1)
        self._cleared_cache = _ObjectCache()
        self._inputs_cache = _ObjectCache()

    def __repr__(self) -> str:
        opts = f", keep={self.keep}, clear_at_least={self.clear_at_least}"
        if self.exclude_tools:
            opts += f", exclude_tools={tuple(sorted(self.exclude_tools))!r}"
        if self.clear_tool_inputs:
            opts += ", clear_tool_inputs=True"
        return f"ClearToolResultsFilter(trigger_tokens={self.trigger_tokens}, counter={self.counter!r}{opts})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_rec", "_cleared_cache", "_inputs_cache", "_lock"):
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
            out = _edited(m, {"content": self.placeholder}, edit)
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
        out = _edited(a, {"tool_calls": calls}, {"kind": "inputs_cleared", "calls": ids})
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
        return _counts(self.counter, new).tolist()

    def _append(self, rec: _ClearRecords, msgs: list[Message], k: int) -> None:
        """Records of ``msgs[k:]`` (``msgs[:k]`` is ``rec.messages``)."""
        new = msgs[k:]
        counts = self._new_counts(new)
        kinds = rec.kinds
        savings = rec.savings
        i = k
        for m in new:
            role = m.role
            if role == "tool":
                kind, saved = self._result_record(rec, msgs, i, m, counts[i - k])
                kinds.append(kind)
                savings.append(saved)
                i += 1
                continue
            if role == "assistant":
                kinds.append(_ASSISTANT)
                if m.tool_calls:
                    for p, c in enumerate(m.tool_calls):
                        cid = c.get("id")
                        if cid:
                            rec.calls[cid] = (i, p)
            elif role == "system" and i == rec.n_pinned:
                kinds.append(_PINNED)
                rec.n_pinned += 1
            else:
                kinds.append(_UNIT)
            savings.append(0)
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
        base = self._request + (self._tools.tools_cost(tools_schema) if tools_schema else 0)
        rec = self._rec
        ref = rec.messages
        k = len(ref)
        n = len(msgs)
        if rec.base != base or not _backend.extends(ref, msgs):
            rec = self._rec = _ClearRecords(base)
            k = 0
        if n == k:
            return rec
        self._append(rec, msgs, k)
        cleared, _ = _backend.plan_clearing(rec.counts, rec.kinds, rec.savings, base, self.trigger_tokens,
                                            self.clear_at_least, self.keep, rec.state)
        rec.out.extend(msgs[k:])
        if cleared > rec.cleared:
            self._edit(rec, cleared)
        return rec

    def _edit(self, rec: _ClearRecords, cleared: int) -> None:
        """Clear the results ``rec.cleared:cleared`` in ``rec.out`` (and their calls' inputs)."""
        msgs, out = rec.messages, rec.out
        new = [i for i, kind in zip(rec.results[rec.cleared:cleared], rec.result_kinds[rec.cleared:cleared])
               if kind == _CLEARABLE]
        rec.cleared = cleared
        for i in new:
            out[i] = self._cleared_result(msgs[i])
        if self.clear_tool_inputs and new:
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
            rec = self._update(msgs, tools_schema)
            return [i for i, k in zip(rec.results[:rec.cleared], rec.result_kinds) if k == _CLEARABLE]

    def apply(self, messages: Sequence[Message], local_state: Any = None, global_state: Any = None,
              ctx: Any = None, *, tools_schema: Optional[Sequence[dict[str, Any]]] = None,
              **kwargs: Any) -> list[Message]:
        """``messages`` with the old tool results cleared (a new list; the input is untouched)."""
        try:
            with self._lock:
                msgs = messages if type(messages) is list else list(messages)
                return self._update(msgs, tools_schema).out[:]
        except JianmuError:
            raise
        except Exception as exc:
            self._rec = _ClearRecords(-1)  # never resume from a half-updated history
            raise TrimmingError(f"{type(self).__name__}: could not clear tool results ({type(exc).__name__}: {exc})") from exc


# -- SummarizingBudgetFilter ------------------------------------------------------------------


class SummaryFailedWarning(UserWarning):
    """``summarize`` raised, timed out or returned something else than a str: the prompt is
    the plain budget filter's."""


_EXECUTOR: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="jianmu-summarize")
    return _EXECUTOR


def _run_summarize(fn: Callable[[list[Message]], Any], messages: list[Message]) -> Any:
    out = fn(messages)
    if inspect.isawaitable(out):
        async def wait() -> Any:
            return await out

        out = asyncio.run(wait())
    return out


def _render(messages: Sequence[Message]) -> str:
    lines = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = " ".join(b.get("text", f"[{b.get('type')}]") for b in content)
        if m.role == "assistant" and m.tool_calls:
            calls = "; ".join(f"{c['function']['name']}({c['function'].get('arguments') or ''})" for c in m.tool_calls)
            lines.append(f"assistant calls: {calls}" + (f" ({content})" if content else ""))
        elif m.role == "tool":
            lines.append(f"tool result{f' ({m.name})' if m.name else ''}: {content}")
        else:
            lines.append(f"{m.role}: {content or ''}")
    return "\n".join(lines)


def summarizer_from_client(client: Any, *, prompt: str = DEFAULT_SUMMARY_PROMPT,
                           config: Optional[dict[str, Any]] = None) -> Callable[[list[Message]], str]:
    """A ``summarize`` callable for :class:`SummarizingBudgetFilter` that asks a
    ``jianmu_fast.model.ModelClient`` (``invoke(messages, tools=None, config=None)``):
    ``prompt`` as the system message, the messages to condense as one transcript.

    >>> from jianmu_fast.message import ai, human
    >>> class Echo:
    ...     def invoke(self, messages, *, tools=None, config=None):
    ...         return ai(f"{len(messages[1].content.splitlines())} lines condensed")
    >>> summarizer_from_client(Echo())([human("hi"), ai("hello")])
    '2 lines condensed'
    """
    if not callable(getattr(client, "invoke", None)):
        raise TypeError(f"client: expected a ModelClient (invoke(messages, tools=None, config=None)), got {type(client).__name__}")
    from ...message import human, system

    def summarize(messages: list[Message]) -> str:
        reply = client.invoke([system(prompt), human(_render(messages))], config=config)
        content = reply.content
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        return content or ""

    summarize.__qualname__ = f"summarizer_from_client({type(client).__name__})"
    return summarize


class SummarizingBudgetFilter(TokenBudgetFilter):
    """A token budget that, instead of only dropping the oldest units, puts one summary of
    them right after the pinned prefix.

    ``summarize(messages) -> str`` (sync, or async returning an awaitable) condenses what the
    budget drops; a ``ModelClient`` is accepted too (see :func:`summarizer_from_client`). The
    budget ``max_tokens`` holds for the whole request: pinned prefix, summary, kept units and
    tools (``apply(..., tools_schema=)``). ``summary_max_tokens`` of it are set aside for the
    summary message when something is dropped (its text is cut to fit); ``keep_tokens``, when
    given, bounds the newest history kept verbatim (the rest is summarized). ``eviction`` and
    ``chunk`` are ``TokenBudgetFilter``'s: with ``eviction="chunked"`` the cut, and so the span
    to summarize, moves once per chunk, and a hot loop calls ``summarize`` about once per move.

    The summary message is a ``system`` message (text after :data:`SUMMARY_HEADER`, its
    metadata ``{"context_edit": {"kind": "summary", "messages": N, "units": U}}``): right after
    the pinned system prompt it joins the leading system run, so providers that take one system
    block (Anthropic) accept it, later trimming stages keep it pinned, and the model never reads
    it as something the user said.

    The summary is a pure function of the dropped span's content (``build_batch`` equals
    per-state ``build``), and a rolling one: the span is folded at the first unit start past
    each multiple of ``chunk`` tokens (``max_tokens // 4`` with exact eviction), the first
    piece summarized alone and each next one as ``summarize([summary so far, *piece])``; every
    step is cached by the content of the span up to it. Chunked eviction moves its cut to
    exactly those points, so a longer history extends the previous summary from the newly
    dropped units with one call per move instead of summarizing everything again. If ``summarize``
    raises, times out (``timeout`` seconds) or returns something else than a str, the result
    is the plain ``TokenBudgetFilter``'s, with a :class:`SummaryFailedWarning`: never over the
    budget, never a failed build.

    >>> from jianmu_fast.message import system, human, ai
    >>> f = SummarizingBudgetFilter(70, summarize=lambda ms: "they talked", summary_max_tokens=25)
    >>> msgs = [system("Be brief.")] + [human("x" * 40), ai("y" * 40)] * 3 + [human("and now?")]
    >>> out = f.apply(msgs)
    >>> [m.role for m in out], out[1].content
    (['system', 'system', 'user', 'assistant', 'user'], 'Summary of the earlier conversation:\\nthey talked')
    """

    def __init__(
        self,
        max_tokens: int,
        counter: Any = None,
        *,
        summarize: Any,
        summary_max_tokens: int = 512,
        keep_tokens: Optional[int] = None,
        eviction: Eviction = "exact",
        chunk: Optional[int] = None,
        pinned_roles: Iterable[str] = ("system",),
        timeout: Optional[float] = 60.0,
    ) -> None:
        if not callable(summarize):
            if callable(getattr(summarize, "invoke", None)):
                summarize = summarizer_from_client(summarize)
            else:
                raise TypeError(f"summarize: expected a callable (messages) -> str or a ModelClient, got {type(summarize).__name__}")
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        # a TokenBudgetFilter: the builder calls its _trim directly (the compiled sanitize
        # decision, no Python sanitize step when the output is clean); validates the rest
        super().__init__(max_tokens, _check_counter(counter), pinned_roles=pinned_roles, eviction=eviction, chunk=chunk)
        self.summarize = summarize
        self.summary_max_tokens = _check_int("summary_max_tokens", summary_max_tokens, 1)
        if self.summary_max_tokens >= self.max_tokens:
            raise ValueError(f"summary_max_tokens ({summary_max_tokens}) must be below max_tokens ({max_tokens})")
        self.keep_tokens = None if keep_tokens is None else _check_int("keep_tokens", keep_tokens, 1)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.eviction = eviction
        self.chunk_tokens = chunk
        self._plain = TokenBudgetFilter(max_tokens, self.counter, pinned_roles=self.pinned_roles,
                                        eviction=eviction, chunk=chunk)
        self._cutter = _Cutter(self.counter)
        self._fold = chunk if eviction == "chunked" and chunk else max(1, self.max_tokens // 4)
        # the library's counters count a request as PER_REQUEST plus each message's count, so
        # kept (within max_tokens - summary_max_tokens) plus the capped summary is within budget
        self._additive = type(self.counter).__name__ in _TRUSTED
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._inner: dict[int, TokenBudgetFilter] = {}
        self._over_ref: Optional[tuple[list[Message], int]] = None
        self._last_span: Optional[tuple[list[Message], tuple[str, int]]] = None
        #: (span, its summary message, the history copy it was cut from, the cut)
        self._last: Optional[tuple[list[Message], Message, list[Message], int]] = None
        self._chain: Optional[tuple[list[Message], list[tuple[int, int, int, bytes, str]]]] = None
        self._by_content: dict[bytes, str] = {}
        self._digests = _ObjectCache()
        self._messages: dict[tuple[int, int, str], Message] = {}
        self.calls = 0
        """How many times ``summarize`` was called (successful or not)."""

    def __repr__(self) -> str:
        return (f"SummarizingBudgetFilter(max_tokens={self.max_tokens}, counter={self.counter!r}, "
                f"summarize={getattr(self.summarize, '__qualname__', self.summarize)!s}, "
                f"summary_max_tokens={self.summary_max_tokens})")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for k in ("_inner", "_over_ref", "_last_span", "_last", "_chain", "_by_content", "_messages", "_digests", "_lock"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        calls = state.get("calls", 0)
        self._reset()
        self.calls = calls

    def _inner_filter(self, limit: int) -> TokenBudgetFilter:
        f = self._inner.get(limit)
        if f is None:
            if len(self._inner) >= 8:
                self._inner.pop(next(iter(self._inner)))
            f = self._inner[limit] = TokenBudgetFilter(limit, self.counter, pinned_roles=self.pinned_roles,
                                                       eviction=self.eviction, chunk=self.chunk_tokens)
        return f

    def _trim(self, messages: Sequence[Any], tools_schema: Any, sanitize: bool) -> tuple[list[Message], bool]:
        """``(output, clean)`` as ``TokenBudgetFilter._trim``: the budget's output with a summary
        of what it dropped. A turn whose cut did not move costs what the budget filter costs:
        one inner ``_trim`` (records extended, the compiled sanitize decision), the summary
        message reused, two C-level list comparisons."""
        try:
            with self._lock:
                return self._summarized(messages, tools_schema, sanitize)
        except JianmuError:
            raise
        except Exception as exc:  # a budget stage never lets an untrimmed prompt through
            raise TrimmingError(f"{type(self).__name__}: could not trim the prompt ({type(exc).__name__}: {exc})") from exc

    def _trim_many(self, prompts: list[list[Message]], tools_schema: Any, sanitize: bool) -> list[Any]:
        out: list[Any] = []
        for p in prompts:
            try:
                out.append(self._trim(p, tools_schema, sanitize))
            except Exception as exc:
                out.append(exc)
        return out

    def _summarized(self, messages: Sequence[Any], tools_schema: Any, sanitize: bool) -> tuple[list[Message], bool]:
        msgs = messages if type(messages) is list else list(messages)
        n_pinned = 0
        pinned = self.pinned_roles
        while n_pinned < len(msgs) and msgs[n_pinned].role in pinned:
            n_pinned += 1
        limit = self.max_tokens - self.summary_max_tokens
        if self.keep_tokens is not None:
            fixed = int(self.counter.count_messages(msgs[:n_pinned])) + self._plain.tools_cost(tools_schema)
            limit = min(limit, fixed + self.keep_tokens)
        try:
            kept, clean = self._inner_filter(max(1, limit))._trim(msgs, tools_schema, sanitize)
        except ContextBudgetError:
            return self._plain._trim(msgs, tools_schema, sanitize)  # no room for a summary
        if len(kept) == len(msgs):
            return kept, clean
        over, grown = self._over(msgs, tools_schema)
        if not over:
            # everything fits the budget: nothing to summarize (the plain filter keeps it all)
            return self._plain._trim(msgs, tools_schema, sanitize)
        cut = len(msgs) - (len(kept) - n_pinned)
        last = self._last
        if grown and last is not None and last[2] is self._over_ref[0] and last[3] == cut:
            summary = last[1]  # the same history, grown, and the cut did not move: the same summary
        else:
            span = msgs[n_pinned:cut]
            if last is not None and len(last[0]) == len(span) and last[0] == span:
                summary = last[1]
            else:
                got = self._summary_text(span) if span else None
                if got is None:
                    return self._plain._trim(msgs, tools_schema, sanitize)
                summary = self._summary_message(got[0], len(span), got[1])
            self._last = (span, summary, self._over_ref[0], cut)
        out = kept[:n_pinned] + [summary] + kept[n_pinned:] if n_pinned else [summary] + kept
        if not self._additive and int(self.counter.count_messages(out)) + self._plain.tools_cost(tools_schema) > self.max_tokens:
            return self._plain._trim(msgs, tools_schema, sanitize)  # pragma: no cover - capped to fit
        # a system message right after the pinned prefix changes no tool pairing: the inner
        # filter's sanitize decision holds for the output
        return out, clean

    def _over(self, msgs: list[Message], tools_schema: Any) -> tuple[bool, bool]:
        """Whether the whole prompt is over the budget, and whether ``msgs`` grew the history
        last found over (our own copy, extended in place). A history that extends one known to
        be over (with tools that cost no less) is over too, without counting it again."""
        tools = self._plain.tools_cost(tools_schema)
        known = self._over_ref
        if known is not None:
            ref, ref_tools = known
            k = len(ref)
            if tools >= ref_tools and _backend.extends(ref, msgs):
                if len(msgs) > k:
                    ref.extend(msgs[k:])
                return True, True
        over = int(self.counter.count_messages(msgs)) + tools > self.max_tokens
        if over:
            self._over_ref = (msgs[:], tools)
        return over, False

    def _digest(self, m: Message) -> bytes:
        d = self._digests.get(m)
        if d is None:
            d = hashlib.sha256(json.dumps(m.to_openai(), sort_keys=True, ensure_ascii=False,
                                          default=repr).encode("utf-8")).digest()
            self._digests.put(m, d)
        return d

    def _folds(self, span: list[Message], start: int = 0, cum0: int = 0) -> tuple[list[tuple[int, int, int]], int]:
        """Where the rolling summary of ``span`` folds after ``start`` (a fold point, ``cum0``
        tokens after the span's start): the first unit start at or past each multiple of
        ``fold`` tokens (cumulative from the span's start), then the span's end; each with the
        tokens and the units before it from ``start`` (``-1`` tokens for the end). One pass
        over ``span[start:]`` with the counter's cached counts."""
        part = span[start:]
        counts = [self.counter.count_message(m) for m in part] if self._additive else _counts(self.counter, part).tolist()
        fold = self._fold
        level = (cum0 // fold + 1) * fold  # the next multiple of fold a unit start may reach
        acc = cum0
        units = 0
        ends: list[tuple[int, int, int]] = []
        for j, m in enumerate(part):
            if m.role != "tool":
                if acc >= level:
                    ends.append((start + j, acc, units))
                    level = (acc // fold + 1) * fold
                units += 1
            acc += counts[j]
        ends.append((len(span), -1, units))
        return ends, units

    def _summary_text(self, span: list[Message]) -> Optional[tuple[str, int]]:
        """The summary of ``span`` and its number of units, a pure function of its content: a
        fold over the pieces between ``_folds`` (each step ``summarize([summary so far,
        *piece])``), every step cached by the content of the span up to it. With chunked
        eviction the cut moves to those fold points, so a move costs one call. A span that
        extends the previous one resumes at the previous span's last fold point (the fold
        points of a span are those of every longer span), so a move also costs only its new
        messages' bookkeeping. ``span`` is the caller's own list (kept, never changed)."""
        last = self._last_span
        if last is not None and len(span) == len(last[0]) and span == last[0]:
            return last[1]
        from ...message import system

        text: Optional[str] = None
        key = b""
        lo = cum = units0 = 0
        points: list[tuple[int, int, int, bytes, str]] = []  # (fold point, tokens, units before it, key, summary)
        chain = self._chain
        if chain is not None and chain[1] and _backend.extends(chain[0], span):
            points = list(chain[1])
            lo, cum, units0, key, text = points[-1]
        ends, units = self._folds(span, lo, cum)
        for hi, before, n_units in ends:
            h = hashlib.sha256(key)
            for m in span[lo:hi]:
                h.update(self._digest(m))
            key = h.digest()
            got = self._by_content.get(key)
            if got is None:
                piece = span[lo:hi]
                got = self._call(piece if text is None else [system(SUMMARY_HEADER + text), *piece])
                if got is None:
                    return None
                if len(self._by_content) >= 1024:
                    self._by_content.pop(next(iter(self._by_content)))
                self._by_content[key] = got
            text, lo = got, hi
            if before >= 0:
                points.append((hi, before, units0 + n_units, key, got))
        self._chain = (span, points)
        out = (text or "", units0 + units)
        self._last_span = (span, out)
        return out

    def _call(self, messages: list[Message]) -> Optional[str]:
        self.calls += 1
        try:
            fut = _executor().submit(_run_summarize, self.summarize, list(messages))
            text = fut.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            self._warn(f"summarize did not answer within {self.timeout} s")
            return None
        except Exception as exc:
            self._warn(f"summarize raised {type(exc).__name__}: {exc}")
            return None
        if not isinstance(text, str):
            self._warn(f"summarize returned {type(text).__name__}, not a str")
            return None
        return text

    def _warn(self, why: str) -> None:
        logger.warning("SummarizingBudgetFilter: %s; the prompt is the plain budget filter's", why)
        warnings.warn(f"SummarizingBudgetFilter: {why}; the prompt is the plain budget filter's (no summary)",
                      SummaryFailedWarning, stacklevel=4)

    def _summary_message(self, text: str, n: int, units: int) -> Message:
        key = (n, units, text)
        m = self._messages.get(key)
        if m is not None:
            return m
        from ...message import system

        edit = {"kind": "summary", "messages": n, "units": units}
        m = system(SUMMARY_HEADER + text, metadata={EDIT_KEY: edit})
        room = self.summary_max_tokens
        if int(self.counter.count_message(m)) > room:
            text = SUMMARY_HEADER + text
            overhead = int(self.counter.count_message(m)) - self._cutter.count_text(text)
            got = self._cutter.cut(text, max(0, room - overhead), DEFAULT_CUT_MARKER)
            m = system(got[0] if got else "", metadata={EDIT_KEY: {**edit, "cut": True}})
        if len(self._messages) >= 64:
            self._messages.pop(next(iter(self._messages)))
        self._messages[key] = m
        return m


# -- reporting --------------------------------------------------------------------------------


def describe_edits(before: Sequence[Message], after: Sequence[Message], counter: Any = None) -> str:
    """What a stage edited, from the ``context_edit`` metadata of the messages it made (those
    of ``after`` that are not objects of ``before``); ``""`` when nothing.

    >>> from jianmu_fast.message import tool
    >>> m = tool("x" * 400, tool_call_id="c1")
    >>> describe_edits([m], ToolResultCapFilter(20).apply([m]))
    'cut 1 result(s) (-80 tokens)'
    """
    seen = {id(m) for m in before}
    cut = cut_tokens = cleared = cleared_tokens = inputs = 0
    summaries: list[str] = []
    for m in after:
        if id(m) in seen:
            continue
        edit = m.metadata.get(EDIT_KEY) if m.metadata else None
        if not edit:
            continue
        kind = edit.get("kind")
        if kind == "cut":
            cut += 1
            cut_tokens += int(edit.get("tokens_before", 0)) - int(edit.get("tokens_after", 0))
        elif kind == "cleared":
            cleared += 1
            cleared_tokens += int(edit.get("tokens_saved", 0))
        elif kind == "inputs_cleared":
            inputs += 1
        elif kind == "summary":
            summaries.append(f"summary of {edit.get('messages')} message(s) ({edit.get('units')} unit(s))")
    parts = []
    if cut:
        parts.append(f"cut {cut} result(s) (-{cut_tokens} tokens)")
    if cleared:
        parts.append(f"cleared {cleared} result(s) (-{cleared_tokens} tokens)")
    if inputs:
        parts.append(f"cleared the inputs of {inputs} call message(s)")
    parts.extend(summaries)
    return ", ".join(parts)
