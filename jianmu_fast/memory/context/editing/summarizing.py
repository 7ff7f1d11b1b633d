"""``SummarizingBudgetFilter``: a token budget that puts one rolling summary of what it drops
right after the pinned prefix."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import threading
import warnings
from itertools import islice
from typing import Any, Iterable, Optional, Sequence

from .... import _backend
from ....errors import ContextBudgetError, JianmuError, TrimmingError
from ....message import Message, system
from ....message.model import FrozenDict, FrozenList
from ..filters import Eviction, TokenBudgetFilter
from ._common import DEFAULT_CUT_MARKER, EDIT_KEY, TRUSTED, check_counter, check_int
from ._cutter import Cutter
from .summarizer import SummaryFailedWarning, executor, run_summarize, summarizer_from_client

__all__ = ["SummarizingBudgetFilter", "SUMMARY_HEADER"]

logger = logging.getLogger("jianmu_fast.context")
SUMMARY_HEADER = "Summary of the earlier conversation:\n"
_DIGESTS = 4096  # messages whose content digest is kept (and the message with it)


_DIGEST_TAG = b"jianmu-message-digest/3\0"


def _field(v: Any) -> bytes:
    """One field of :func:`message_digest`: a tag (``N`` none, ``S`` text, ``J`` JSON), then
    the payload's length (8 bytes) and the payload."""
    if v is None:
        return b"N"
    if isinstance(v, str):
        b = v.encode("utf-8", "surrogatepass")
        return b"S" + len(b).to_bytes(8, "little") + b
    b = json.dumps(v, sort_keys=True, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass")
    return b"J" + len(b).to_bytes(8, "little") + b


_ROLE_FIELDS = {r: _field(r) for r in ("system", "user", "assistant", "tool")}


_LISTS = (list, FrozenList)  # (a message's own lists and dicts are frozen copies)
_DICTS = (dict, FrozenDict)


def _calls_field(calls: Any) -> bytes:
    """``tool_calls`` for :func:`message_digest`: in the usual shape (a list of ``{"id", "type",
    "function": {"name", "arguments"}}`` dicts with those keys only, all str), tag ``C``, the
    number of calls (8 bytes) and each call's four strings, each length-prefixed (no JSON);
    otherwise :func:`_field` (sorted JSON, tag ``J``)."""
    if type(calls) in _LISTS:
        parts = [b"C", len(calls).to_bytes(8, "little")]
        for c in calls:
            f: Any = c.get("function") if type(c) in _DICTS and len(c) == 3 else None
            if type(f) not in _DICTS or len(f) != 2:
                break
            for v in (c.get("id"), c.get("type"), f.get("name"), f.get("arguments")):
                if type(v) is not str:
                    break
                b = v.encode("utf-8", "surrogatepass")
                parts.append(len(b).to_bytes(8, "little"))
                parts.append(b)
            else:
                continue
            break
        else:
            return b"".join(parts)
    return _field(calls)


def message_digest(m: Message) -> bytes:
    """The 32-byte content digest of ``m`` (what the summary cache keys a span by): sha256 over
    a prefix-free encoding of what ``to_openai`` sends (role, name, tool_call_id, content,
    tool_calls, extra; never ``id`` or ``metadata``), each field tagged and length-prefixed, so
    two messages that send different things never share a digest by construction. Text is
    hashed as UTF-8 bytes (no JSON of the message); tool calls of the usual shape as their
    strings (see ``_calls_field``); blocks, other tool calls and ``extra`` as sorted JSON of
    just that field. In-process only: nothing stores it.

    >>> from jianmu_fast.message import human, tool
    >>> message_digest(human("a")) == message_digest(human("a")), len(message_digest(human("a")))
    (True, 32)
    >>> message_digest(human("a")) == message_digest(human([{"type": "text", "text": "a"}]))
    False
    >>> message_digest(tool("a", tool_call_id="c1")) == message_digest(tool("a", tool_call_id="c2"))
    False
    """
    c, role, name, call_id, calls = m.content, m.role, m.name, m.tool_call_id, m.tool_calls
    if (type(c) is str or c is None) and not m.extra:  # the common case: text or none (inlined _field)
        b = b"" if c is None else c.encode("utf-8", "surrogatepass")
        return hashlib.sha256(b"".join((
            _DIGEST_TAG, _ROLE_FIELDS.get(role) or _field(role), b"N" if name is None else _field(name),
            b"N" if call_id is None else _field(call_id), b"N" if c is None else b"S",
            b"" if c is None else len(b).to_bytes(8, "little"), b, b"N" if calls is None else _calls_field(calls),
            b"N"))).digest()
    return hashlib.sha256(b"".join((_DIGEST_TAG, _field(role), _field(name), _field(call_id), _field(c),
                                    _calls_field(m.tool_calls), _field(m.extra or None)))).digest()


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
        max_tokens = check_int("max_tokens", max_tokens, 1)
        # a TokenBudgetFilter: the builder calls its _trim directly (the compiled sanitize
        # decision, no Python sanitize step when the output is clean); validates the rest
        super().__init__(max_tokens, check_counter(counter), pinned_roles=pinned_roles, eviction=eviction, chunk=chunk)
        self.summarize = summarize
        self.summary_max_tokens = check_int("summary_max_tokens", summary_max_tokens, 1)
        if self.summary_max_tokens >= self.max_tokens:
            raise ValueError(f"summary_max_tokens ({summary_max_tokens}) must be below max_tokens ({max_tokens})")
        self.keep_tokens = None if keep_tokens is None else check_int("keep_tokens", keep_tokens, 1)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.eviction = eviction
        self.chunk_tokens = chunk
        self._plain = TokenBudgetFilter(max_tokens, self.counter, pinned_roles=self.pinned_roles,
                                        eviction=eviction, chunk=chunk)
        self._cutter = Cutter(self.counter)
        self._fold = int(chunk if eviction == "chunked" and chunk else max(1, self.max_tokens // 4))
        # the library's counters count a request as PER_REQUEST plus each message's count, so
        # kept (within max_tokens - summary_max_tokens) plus the capped summary is within budget
        self._additive = type(self.counter).__name__ in TRUSTED
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        #: the last turn that put a summary in (see ``_keep_hot``): (inner filter, its records,
        #: their count, its settings, budget, budget without tools, (summary, n_pinned, cut))
        self._hot: Optional[tuple[Any, ...]] = None
        self._inner: dict[int, TokenBudgetFilter] = {}
        self._over_ref: Optional[tuple[list[Message], int]] = None
        #: (span, its summary message, the history copy it was cut from, the cut, the rolling
        #: chain's fold state at the span's end, ``_chain[4:]``, or None)
        self._last: Optional[tuple[list[Message], Message, list[Message], int, Optional[tuple[Any, ...]]]] = None
        #: the rolling summary of the last span (see ``_summary_text``): (the span as a list, or
        #: None; the records it was read from, their version, the span's start in them; its
        #: last fold point, the tokens and units before it, its key and summary; the span's
        #: length, the tokens before its end, the units from the point to its end, its key;
        #: the result ``(summary, units)``)
        self._chain: Optional[tuple[Any, ...]] = None
        self._by_content: dict[bytes, str] = {}
        #: each message's content digest by id(message), the message held (``_pins``) so that
        #: its id names it while the entry lives: looked up in C (``map``), no Python per message
        self._digests: dict[int, bytes] = {}
        self._pins: dict[int, Message] = {}
        self._messages: dict[tuple[int, int, str], Message] = {}
        self.calls = 0
        """How many times ``summarize`` was called (successful or not)."""

    # the settings the hot path's remembered turn depends on: setting one forgets it
    @property
    def max_tokens(self) -> int:
        """The budget of the whole request."""
        return self._max_tokens

    @max_tokens.setter
    def max_tokens(self, value: int) -> None:
        self._max_tokens = value
        self._hot = None

    @property
    def summary_max_tokens(self) -> int:
        """The tokens set aside for the summary message."""
        return self._summary_max_tokens

    @summary_max_tokens.setter
    def summary_max_tokens(self, value: int) -> None:
        self._summary_max_tokens = value
        self._hot = None
        self.__dict__.get("_messages", {}).clear()  # (their text was cut to the old room)

    @property
    def keep_tokens(self) -> Optional[int]:
        """The bound of the newest history kept verbatim (None: the budget's)."""
        return self._keep_tokens

    @keep_tokens.setter
    def keep_tokens(self, value: Optional[int]) -> None:
        self._keep_tokens = value
        self._hot = None

    def __repr__(self) -> str:
        return (f"SummarizingBudgetFilter(max_tokens={self.max_tokens}, counter={self.counter!r}, "
                f"summarize={getattr(self.summarize, '__qualname__', self.summarize)!s}, "
                f"summary_max_tokens={self.summary_max_tokens})")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for k in ("_inner", "_over_ref", "_last", "_chain", "_by_content", "_messages", "_digests", "_lock",
                  "_hot", "_pins"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("max_tokens", "summary_max_tokens", "keep_tokens"):  # pickled before these were properties
            if key in state:
                state["_" + key] = state.pop(key)
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

    #: ``(output, clean)`` as ``TokenBudgetFilter._trim``: the budget's output with a summary of
    #: what it dropped, called as ``_trim(messages, tools_schema, sanitize)``. A turn whose cut
    #: did not move (the prompt extends the last one, and the inner budget's plan keeps the same
    #: pinned prefix and cut, with the same budget) costs what the budget filter costs: one
    #: compiled ``Records.window`` call over the inner filter's records that builds the output
    #: with the last summary message in place, made by ``_backend.summarizing_trim`` (compiled:
    #: no Python frame); every other turn is ``_trim_rest``.
    _trim = _backend.summarizing_trim

    def _trim_rest(self, messages: Sequence[Any], tools_schema: Any, sanitize: bool,
                   got: Any) -> tuple[list[Message], bool]:
        """``_trim`` past its compiled turn (``_backend.summarizing_trim``), with the lock held:
        ``got`` is what that turn's ``Records.window`` call gave (a moved cut's ``(kept, clean,
        n_pinned, cut)``: the new span's summary put in; ``1``: no answer; ``0``: it raised),
        or None when it was not called (tools, a budget that depends on them): then the same
        call here under the budget with the tools. Otherwise the general path."""
        try:
            hot = self._hot
            if got is None and hot is not None and type(messages) is list:
                f, rec, count, cfg, budget, bare, insert = hot
                try:
                    limit = f._limit(tools_schema)
                except ContextBudgetError:
                    limit = -1
                # (tools that may cost more: each turn checked; records forgotten since, by a
                # request that moved the filter to another counter: see TokenBudgetFilter._route)
                if limit == budget and not f._vary and f._rec is rec:
                    try:
                        f._turn_msgs = messages  # (where a turn's new messages stand: _template_counts)
                        got = rec.window(messages, count, budget, cfg, sanitize, insert)
                    except Exception:  # the general path raises what it should
                        got = 0
                    else:
                        if got is not None and len(got) == 2 and (insert is not None or len(got[0]) == len(messages)):
                            return got  # type: ignore[no-any-return]
            if got == 0 and hot is not None:
                hot[0]._forget()
            elif type(got) is tuple and len(got) == 4 and hot is not None:  # the cut moved: the new span's summary
                return self._moved(hot, messages, got, tools_schema, sanitize)  # type: ignore[arg-type]
            self._hot = None
            return self._summarized(messages, tools_schema, sanitize)
        except JianmuError:
            raise
        except Exception as exc:  # a budget stage never lets an untrimmed prompt through
            raise TrimmingError(f"{type(self).__name__}: could not trim the prompt ({type(exc).__name__}: {exc})") from exc

    def _trim_many(self, prompts: list[Any], tools_schema: Any, sanitize: bool) -> tuple[list[Any], Any]:
        """``_trim`` for each prompt, as ``TokenBudgetFilter._trim_many`` returns them: ``(outputs,
        clean)``, an output being the exception its prompt raised (``clean`` False then), and
        ``clean`` None without ``sanitize``."""
        outs: list[Any] = []
        clean: list[bool] = []
        for p in prompts:
            try:
                out, ok = self._trim(p, tools_schema, sanitize)
            except Exception as exc:
                outs.append(exc)
                clean.append(False)
            else:
                outs.append(out)
                clean.append(ok)
        return outs, (clean if sanitize else None)

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
        inner = self._inner_filter(max(1, limit))
        try:
            kept, clean = inner._trim(msgs, tools_schema, sanitize)
        except ContextBudgetError:
            return self._plain._trim(msgs, tools_schema, sanitize)  # no room for a summary
        if len(kept) == len(msgs):
            if self.keep_tokens is None:  # (else the limit depends on the pinned prefix)
                self._keep_hot(inner, msgs, tools_schema, None, n_pinned, 0)
            return kept, clean
        over, grown, whole = self._over(msgs, tools_schema, sanitize)
        if not over:
            # everything fits the budget: nothing to summarize (the plain filter keeps it all)
            if whole is None:
                whole = self._plain._trim(msgs, tools_schema, sanitize)
            if self._additive:  # (so the plain filter keeps all exactly when it is not over)
                self._keep_hot(self._plain, msgs, tools_schema, None, n_pinned, 0)
            return whole
        cut = len(msgs) - (len(kept) - n_pinned)
        last = self._last
        ref = self._over_ref
        assert ref is not None  # (set by _over when it finds the prompt over the budget)
        rec = inner._rec if self._additive else None
        if grown and last is not None and last[2] is ref[0] and last[3] == cut:
            summary = last[1]  # the same history, grown, and the cut did not move: the same summary
            self._rebind(last, rec, n_pinned)
        else:
            span = msgs[n_pinned:cut]
            if last is not None and len(last[0]) == len(span) and last[0] == span:
                summary = last[1]
                self._rebind(last, rec, n_pinned)
            else:
                got = self._summary_text(msgs, n_pinned, cut, rec, span) if span else None
                if got is None:
                    return self._plain._trim(msgs, tools_schema, sanitize)
                summary = self._summary_message(got[0], len(span), got[1])
            chain = self._chain
            self._last = (span, summary, ref[0], cut,
                          chain[4:] if chain is not None and chain[9] == len(span) and span else None)
        kept.insert(n_pinned, summary)  # (the inner filter's output is a new list: ours to grow)
        out = kept
        if not self._additive and int(self.counter.count_messages(out)) + self._plain.tools_cost(tools_schema, out) > self.max_tokens:
            return self._plain._trim(msgs, tools_schema, sanitize)  # pragma: no cover - capped to fit
        # a system message right after the pinned prefix changes no tool pairing: the inner
        # filter's sanitize decision holds for the output
        if self._additive:
            self._keep_hot(inner, msgs, tools_schema, summary, n_pinned, cut)
        return out, clean

    def _rebind(self, last: tuple[Any, ...], rec: Any, n_pinned: int) -> None:
        """The span of ``last`` is the current one (same content, at ``n_pinned``): its rolling
        chain's fold state (``last[4]``), when kept, becomes the chain, read off ``rec`` (the
        records of the current history) from now on, so the next move of the cut resumes it
        (``Records.fold_step``) instead of folding the span again."""
        if last[4] is not None:
            self._chain = (None if rec is not None else last[0], rec, rec.version if rec is not None else -1,
                           n_pinned, *last[4])

    def _moved(self, hot: tuple[Any, ...], msgs: list[Message], got: tuple[Any, ...], tools_schema: Any,
               sanitize: bool) -> tuple[list[Message], bool]:
        """A hot turn whose cut moved: ``msgs`` extends the last prompt (over the budget, as it
        was, under the same budget), and ``got`` is the inner budget's ``(kept, clean, n_pinned,
        cut)``. The output is ``kept`` with the summary of ``msgs[n_pinned:cut]`` put in, as
        ``_summarized`` would make it; if ``summarize`` fails, the plain budget's."""
        kept, clean, n_pinned, cut = got
        rec = hot[1]
        chain = self._chain
        out = None
        # the common case, one compiled call (``_summary_text``'s resumed path, ``Records.fold_step``):
        # the span extends the last one over the same records (same object, version and start)
        # and every step's summary is cached
        if chain is not None and cut > n_pinned:
            step = rec.fold_step(chain, n_pinned, cut, self._fold, self._digests, self._by_content)
            if step is not None:
                self._chain = step
                out = step[13]
        if out is None:
            out = self._summary_text(msgs, n_pinned, cut, rec) if cut > n_pinned else None
            if out is None:
                self._hot = None
                return self._plain._trim(msgs, tools_schema, sanitize)
        summary = self._messages.get((cut - n_pinned, out[1], out[0]))
        if summary is None:
            summary = self._summary_message(out[0], cut - n_pinned, out[1])
        kept.insert(n_pinned, summary)
        self._hot = (hot[0], rec, hot[2], hot[3], hot[4], hot[5], (summary, n_pinned, cut))
        return kept, clean

    def _keep_hot(self, inner: TokenBudgetFilter, msgs: list[Message], tools_schema: Any, summary: Optional[Message],
                  n_pinned: int, cut: int) -> None:
        """Remember this turn for the next one (``_trim``'s fast path): ``inner``'s records hold
        ``msgs``, its plan kept ``n_pinned`` pinned messages and cut at ``cut``, and the output
        put ``summary`` after them. A next prompt that extends ``msgs`` and, under the same
        budget, gets the same plan has the same dropped span, so the same summary. With
        ``summary=None`` the output was all of ``msgs`` (``inner`` kept everything, or is the
        plain budget and the prompt was not over it): a next prompt that ``inner`` keeps whole
        under the same budget is its own output too (if the inner budget keeps it, nothing is
        dropped; if the plain one does, it is not over the budget)."""
        rec = inner._rec
        if rec is None or rec.n != len(msgs):
            return  # pragma: no cover - the inner _trim always leaves the records of msgs
        if inner._vary:  # tools that cost more in some prompts: each turn is checked (_fit_tools)
            self._hot = None
            return
        bare = not tools_schema and inner._trusted
        self._hot = (inner, rec, inner._turn_counts, inner._cfg or inner._config(), inner._limit(tools_schema), bare,
                     None if summary is None else (summary, n_pinned, cut))

    def _over(self, msgs: list[Message], tools_schema: Any,
              sanitize: bool) -> tuple[bool, bool, Optional[tuple[list[Message], bool]]]:
        """Whether the whole prompt is over the budget, whether ``msgs`` grew the history last
        found over (our own copy, extended in place), and the plain budget's ``_trim`` output
        when it was computed (else None). A history that extends one known to be over (with
        tools that cost no less) is over too, without counting it again. With the library's
        counters the plain budget keeps everything exactly when the prompt is not over, and its
        compiled plan over its records (the prompt's new messages only) costs less than
        counting the whole prompt: its output says."""
        tools = self._plain.tools_cost(tools_schema)
        known = self._over_ref
        if known is not None:
            ref, ref_tools = known
            k = len(ref)
            if tools >= ref_tools and _backend.extends(ref, msgs):
                if len(msgs) > k:
                    ref.extend(msgs[k:])
                return True, True, None
        whole = None
        if self._additive:
            try:
                whole = self._plain._trim(msgs, tools_schema, sanitize)
            except ContextBudgetError:  # (the tools alone are over the budget)
                whole = None
                over = True
            else:
                over = len(whole[0]) != len(msgs)
        else:
            over = int(self.counter.count_messages(msgs)) + tools > self.max_tokens
        if over:
            self._over_ref = (msgs[:], tools)
        return over, False, whole

    def _digest(self, m: Message) -> bytes:
        d = self._digests.get(id(m))
        if d is None:
            d = message_digest(m)
            digests, pins = self._digests, self._pins
            digests[id(m)] = d
            pins[id(m)] = m
            if len(digests) > _DIGESTS:
                for key in list(islice(digests, len(digests) - (_DIGESTS * 3) // 4)):
                    del digests[key], pins[key]
        return d

    def _summary_text(self, msgs: list[Message], a: int, b: int, rec: Any = None,
                      span: Optional[list[Message]] = None) -> Optional[tuple[str, int]]:
        """The summary of the span ``msgs[a:b]`` and its number of units, a pure function of its
        content: a fold over the pieces between its fold points (the first unit start at or
        past each multiple of ``fold`` tokens from the span's start; each step
        ``summarize([summary so far, *piece])``), every step cached by the content key of the
        span up to it (a sha256 chain over the messages' digests, see ``Records.fold_keys``).
        With chunked eviction the cut moves to those fold points, so a move costs one call.

        A span that extends the previous one resumes at the previous span's end (the fold points
        of a span are those of every longer span, and the key of its last piece continues from
        the last fold point's): a move costs only its new messages. ``rec``: records that hold
        ``msgs[:b]`` at the same positions (the inner budget's); while they only grew (the same
        object and ``version``, the span at the same start) the span extends the previous one
        without a comparison, and the fold scan and the keys are one compiled call over them.
        ``span``: the caller's own copy of ``msgs[a:b]`` (kept, never changed), compared with
        the previous span when the records cannot tell."""
        n = b - a
        chain = self._chain
        resumed = False
        if chain is not None:
            span0, rec0, version, a0, lo, cum, units0, key, text, end, acc, units, known, out = chain
            if end <= n and ((rec is not None and rec0 is rec and version == rec.version and a0 == a) or
                             (span0 is not None and span is not None and _backend.extends(span0, span))):
                if end == n:
                    return out  # type: ignore[no-any-return]
                resumed = True
        if not resumed:
            lo = cum = units0 = end = acc = units = 0
            key, text, known = b"", None, None
        fold = self._fold
        level = (cum // fold + 1) * fold
        keyed = None
        if rec is not None:  # the common case: one compiled pass (fold points, their keys)
            keyed = rec.fold_keys(a + lo, a + end, b, acc, units, level, fold, key, known, self._digests)
        if keyed is None:
            keyed = self._fold_keys(msgs, a + lo, a + end, b, acc, units, level, key, known, rec)
            if keyed is None:
                return None  # pragma: no cover - a span of over 2**62 tokens
        ends, units, acc = keyed
        by_content = self._by_content
        point_units = 0
        for hi, before, n_units, k in ends:
            got = by_content.get(k)
            if got is None:
                piece = msgs[a + lo:hi]
                got = self._call(piece if text is None else [system(SUMMARY_HEADER + text), *piece])
                if got is None:
                    return None
                if len(by_content) >= 1024:
                    by_content.pop(next(iter(by_content)))
                by_content[k] = got
            if before >= 0:  # a fold point: the next piece folds into its summary
                text, lo, cum, key, point_units = got, hi - a, before, k, n_units
            else:
                known = k
                out = (got, units0 + units)
        self._chain = (span, rec, rec.version if rec is not None else -1, a, lo, cum, units0 + point_units, key, text,
                       n, acc, units - point_units, known, out)
        return out

    def _fold_keys(self, msgs: list[Message], lo: int, first: int, hi: int, acc: int, units: int, level: int,
                   key: bytes, known: Optional[bytes], rec: Any) -> Optional[tuple[list[tuple[int, int, int, bytes]], int, int]]:
        """``Records.fold_keys`` (the one implementation of the fold scan and the key chain)
        when ``rec`` cannot answer alone: the digests of ``msgs[lo:hi]`` computed here (once per
        message, kept), the counts of ``msgs[first:hi]`` that ``rec`` lacks counted into it;
        without records (or still no answer), over records of ``msgs[lo:hi]`` alone."""
        part = msgs[lo:hi]
        digest = self._digest
        values = {id(m): digest(m) for m in part}
        fold = self._fold
        if rec is not None:
            got = rec.fold_keys(lo, first, hi, acc, units, level, fold, key, known, values)
            if got is None:  # (counts the inner budget's plan did not need)
                self._plain._fill_counts(rec, msgs, first, hi)
                got = rec.fold_keys(lo, first, hi, acc, units, level, fold, key, known, values)
            if got is not None:
                return got  # type: ignore[no-any-return]
        counts = self._plain._counts(msgs, first, hi).tolist()
        alone = _backend.Records(Message)
        alone.extend(part, [-1] * (first - lo) + counts)
        got = alone.fold_keys(0, first - lo, hi - lo, acc, units, level, fold, key, known, values)
        if got is None:
            return None  # pragma: no cover - a span of over 2**62 tokens
        ends, units, acc = got
        return [(e + lo, before, n_units, k) for e, before, n_units, k in ends], units, acc

    def _call(self, messages: list[Message]) -> Optional[str]:
        self.calls += 1
        try:
            fut = executor().submit(run_summarize, self.summarize, list(messages))
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
        from ....message import system

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
