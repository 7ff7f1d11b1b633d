"""``ToolResultCapFilter``: cut every tool result over a token cap to its head and tail."""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from .... import _backend
from ....message import Message
from ..counters import SimpleTokenCounter
from ._common import DEFAULT_CUT_MARKER, ObjectCache, check_counter, check_int, edited
from ._cutter import Cutter

__all__ = ["ToolResultCapFilter"]

_extend_capped = _backend.extend_capped


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
        self._lock = threading.Lock()
        self.max_tokens = max_tokens
        self.marker = marker
        self.counter = counter

    def _forget(self) -> None:
        """Drop every cut and the hot path's lists (a setting changed: the cuts are made anew)."""
        lock = self.__dict__.get("_lock")
        if lock is None:
            self._reset()
        else:
            with lock:
                self._reset()

    def _reset(self) -> None:
        self._cache = ObjectCache()
        self._last: Optional[tuple[list[Message], list[Message]]] = None
        #: (input, its recorded part, output, cut cache, ``_fits()``) of the hot path's previous call: its input
        #: only grows by appends (see _hot_apply), so the next call with it resumes from there
        self._turn_args: Any = None
        self._shared = False  # ``_last[1]`` was handed out by the hot path

    # the settings the cuts depend on: setting one drops the cuts made (as a new filter would)
    @property
    def max_tokens(self) -> int:
        """The cap: tokens a tool result's content may count."""
        return self._max_tokens

    @max_tokens.setter
    def max_tokens(self, value: int) -> None:
        self._max_tokens = check_int("max_tokens", value, 1)
        self._forget()

    @property
    def marker(self) -> str:
        """What replaces the cut middle (``{omitted}``: the tokens left out)."""
        return self._marker

    @marker.setter
    def marker(self, marker: str) -> None:
        if not isinstance(marker, str):
            raise TypeError(f"marker: expected a str, got {type(marker).__name__}")
        try:
            marker.format(omitted=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"marker: a format string whose only field is {{omitted}}, got {marker!r} ({exc})") from None
        self._marker = marker
        self._forget()

    @property
    def counter(self) -> Any:
        """The token counter (``count_text``) the cap counts and cuts by."""
        return self._counter

    @counter.setter
    def counter(self, counter: Any) -> None:
        self._counter = check_counter(counter)
        self._cutter = Cutter(self._counter)
        self._forget()

    def __repr__(self) -> str:
        return f"ToolResultCapFilter(max_tokens={self.max_tokens}, counter={self.counter!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_last"] = None
        state["_turn_args"] = None
        state["_shared"] = False
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("max_tokens", "marker", "counter"):  # pickled before these were properties
            if key in state:
                state["_" + key] = state.pop(key)
        self.__dict__.update(state)
        self._reset()
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
            return edited(m, {"content": got[0]}, {"kind": "cut", "tokens_before": before,
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
                    return edited(m, {"content": new[0]}, {"kind": "cut", "tokens_before": before,
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
                return edited(m, {"content": trial}, {"kind": "cut", "tokens_before": before,
                                                       "tokens_after": sum(self._block_cost(b) for b in trial),
                                                       "omitted": text_total})
        return edited(m, {"content": ""}, {"kind": "cut", "tokens_before": before, "tokens_after": 0, "omitted": before})

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
            self._turn_args = None  # ``messages`` may change in any way: no hand-off resumes from it
            return self._apply(messages)[:]

    #: ``apply`` for the builder's hot path (``ContextBuilder._filter_hot``), called as
    #: ``_hot_apply(src, tools_schema)``: ``src`` is a list of Messages that is only ever grown
    #: by appends while it is the same object (the builder's prompt, or the previous stage's own
    #: output). Returns this stage's OWN output list, not a copy, under the same rule: grown in
    #: place by appends only, while it is the same object; any other change makes a new list.
    #: The caller only reads it. When ``src`` is the list of the previous call, only its new
    #: messages are looked at (one compiled call, ``_backend.cap_hot_apply``, with no Python
    #: frame: their cached cuts appended), without the lock: the lists that call appends to
    #: (``_turn_args``) are only ever appended to by the one thread that holds ``src`` (a
    #: builder's turn), and every other path works on copies of them (see ``_apply``). A cut
    #: not cached yet, and every other call, is ``_hot_rest``.
    _hot_apply = _backend.cap_hot_apply

    def _hot_rest(self, src: list[Message], tools_schema: Any = None) -> list[Message]:
        """``_hot_apply`` past its compiled turn: a cut not cached yet is made with the lock
        held; a call with another list is ``_apply`` under the lock, or, when the stage is
        busy, ``apply``'s copy."""
        args = self._turn_args
        if args is not None and src is args[0]:  # the agent loop's turn
            if _extend_capped(*args) < len(src):
                with self._lock:  # a tool result whose cut is not cached yet
                    self._extend(src, args[1], args[2])
            return args[2]
        lock = self._lock
        if not lock.acquire(False):
            return self.apply(src)
        try:
            self._turn_args = None
            out = self._apply(src)
            self._turn_args = (src, self._last[0], out, self._cache._d, self._fits())  # type: ignore[index]
            self._shared = True
            return out
        finally:
            lock.release()

    def _apply(self, messages: Sequence[Message]) -> list[Message]:
        """The output for ``messages`` (with the lock held): the previous one extended when
        ``messages`` extends the previous input (in place, unless the hot path handed it out:
        then a copy), else made anew. The stage's own list (``_last[1]``)."""
        msgs = messages if type(messages) is list else list(messages)
        last = self._last
        if last is not None and _backend.extends(last[0], msgs):
            ref, out = last  # our own lists: the previous input and its output
            if self._shared:
                # handed out by the hot path, which may still append to them (without the lock,
                # in pairs: input, output): never changed here, copies of their common length
                ref, out = ref[:], out[:]
                k = min(len(ref), len(out))
                del ref[k:], out[k:]
                self._last = (ref, out)
                self._shared = False
            self._extend(msgs, ref, out)
            return out
        ref, out = [], []
        self._extend(msgs, ref, out)
        self._last = (ref, out)
        self._shared = False
        return out

    def _extend(self, msgs: list[Message], ref: list[Message], out: list[Message]) -> None:
        """Append ``msgs[len(ref):]`` to ``ref`` and their outputs to ``out`` (with the lock
        held; ``ref`` a prefix of ``msgs``): the cached cuts in one compiled call
        (``extend_capped``), a cut not cached yet made here."""
        d = self._cache._d
        fits = self._fits()
        i = _extend_capped(msgs, ref, out, d, fits)
        while i < len(msgs):
            m = msgs[i]
            c = self.cap(m)
            ref.append(m)
            out.append(c)
            i = _extend_capped(msgs, ref, out, d, fits)

    def _fits(self) -> int:
        """``extend_capped``'s ``fits``: the cap when the counter is byte-level BPE (a text of at
        most that many UTF-8 bytes is within it uncounted, see ``Cutter.within``), else 0."""
        return self.max_tokens if self._cutter._byte_level else 0
