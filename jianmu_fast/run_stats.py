"""What a ``jianmu-fast build`` run did, gathered for its HTML report (``--report``).

The command line creates a :class:`RunCollector` only when ``--report`` is given, so a run
without it pays nothing. With it, each chunk of input lines costs:

- the providers once more per line (the *counting* phase, before the batch is built): their
  messages are labelled with the section they come from and counted in one
  ``counter.count_array`` call per chunk, which also fills the counter's cache, so the
  *trimming* phase that follows (``build_batch_report``) finds its counts there;
- a linear pass per line over its prompt (sections kept, messages dropped, the largest
  messages) and over its history (``sanitize_tool_call_history_report``, for the repairs).

Everything kept is aggregate: per-prompt numbers live in flat lists of ints (bytes per
prompt) that the page reduces to histograms and quantiles; the largest messages are a
bounded heap and the failure and repair lists are capped (their totals are not). Plotting
is elsewhere (:mod:`jianmu_fast.report_html`); this module imports no plotting library.

>>> from jianmu_fast.memory.context import ContextBuilder, SimpleTokenCounter
>>> from jianmu_fast.message import human
>>> c = RunCollector(ContextBuilder.for_chat(system_prompt="Be brief.", max_messages=1),
...                  SimpleTokenCounter(), src_name="in.jsonl")
>>> c.failure(2, "not JSON: Expecting value at column 1")
>>> s = c.finish(0.5)
>>> s.prompts, s.failures, s.failure_kinds
(0, 1, {'not JSON': 1})
"""

from __future__ import annotations

import heapq
import inspect
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

__all__ = ["RunCollector", "RunStats", "MessageEntry", "Event", "PHASES", "section_label", "failure_kind", "message_preview"]

#: The phases of a run, in the order the page shows them: ``(key, what it covers)``.
PHASES: list[tuple[str, str]] = [
    ("reading", "reading the input: bytes, UTF-8, JSON, message validation, tool-call sanitizing"),
    ("counting", "running the providers and tokenizing every provided message (fills the counter's cache)"),
    ("trimming", "build_batch_report: providers, cached counts, each filter's decision, the final sanitize step"),
    ("writing", "serializing each prompt as a JSON line and writing it"),
    ("report", "gathering these statistics (only with --report)"),
]

#: Friendly names of the built-in providers' sections.
_SECTION_NAMES = {
    "InputPersonaProvider": "persona",
    "StaticPromptProvider": "static prompt",
    "ToolsDescProvider": "tool descriptions",
    "BootstrapFilesProvider": "workspace files",
    "SkillSetPromptProvider": "skills",
    "StateHistoryProvider": "history kept",
}
_KIND = re.compile(r"^([A-Za-z][\w .-]{0,40}?):")
_PREVIEW = 80


def section_label(index: int, provider: Any, first_static: bool = False) -> str:
    """The page's name of ``providers[index]``'s section.

    >>> from jianmu_fast.memory.context import StaticPromptProvider
    >>> section_label(1, StaticPromptProvider("x"))
    'static prompt (providers[1])'
    >>> section_label(0, StaticPromptProvider("x"), first_static=True)
    'persona'
    """
    name = type(provider).__name__
    if first_static and name == "StaticPromptProvider":
        return "persona"
    if name in ("InputPersonaProvider", "StateHistoryProvider"):
        return _SECTION_NAMES[name]
    return f"{_SECTION_NAMES.get(name, name)} (providers[{index}])"


def failure_kind(reason: str) -> str:
    """The kind of a failed line: its error type, or the first clause of its reason.

    >>> failure_kind("ContextBudgetError: the pinned prefix alone needs 900 tokens")
    'ContextBudgetError'
    >>> failure_kind("not JSON: Expecting value at column 1")
    'not JSON'
    >>> failure_kind("something odd")
    'other'
    """
    m = _KIND.match(reason)
    return m.group(1) if m else "other"


@dataclass(frozen=True, order=True)
class MessageEntry:
    """One large message of the run: ``where`` is ``FILE:LINE`` of its input line.

    >>> MessageEntry(2900, "in.jsonl:7", 12, "tool", False, "{...}").where
    'in.jsonl:7'
    """

    tokens: int
    where: str
    index: int
    """Its position in the input line's ``messages``."""
    role: str
    kept: bool
    """Whether it is in the prompt (else trimming or sanitizing left it out)."""
    preview: str
    """The start of its text (at most 80 characters)."""


@dataclass(frozen=True)
class Event:
    """A sanitize repair or a failed line: ``where`` (``FILE:LINE``), ``kind``, ``detail``.

    >>> Event("in.jsonl:3", "not JSON", "not JSON: Expecting value at column 1").kind
    'not JSON'
    """

    where: str
    kind: str
    detail: str


@dataclass
class RunStats:
    """The figures of one run, as the HTML page shows them (:meth:`RunCollector.finish`).

    Per-prompt lists (``before``, ``after``, ``dropped``, ``sections``' values) hold one int
    per written prompt, in output order; the page aggregates them.
    """

    source: str
    prompts: int = 0
    failures: int = 0
    trimmed: int = 0
    """Prompts from which at least one input message was left out."""
    tokens_before: int = 0
    """Sum over prompts of ``counter.count_messages`` of everything the providers gave."""
    tokens_after: int = 0
    """Sum of ``prompt_tokens`` (the summary's "tokens kept")."""
    tokens_dropped: int = 0
    """Sum of ``dropped.tokens`` (the summary's "dropped")."""
    messages_dropped: int = 0
    repairs: int = 0
    """Sanitize repairs: broken tool-call units left out, call ids filled, results paired."""
    seconds: float = 0.0
    budget: Optional[int] = None
    max_messages: Optional[int] = None
    tools_tokens: int = 0
    before: list[int] = field(default_factory=list)
    after: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    sections: dict[str, list[int]] = field(default_factory=dict)
    """Tokens of the prompt per section, one int per prompt; ``"request overhead"`` is the
    counter's per-request cost and ``"request's tools"`` the tools sent beside the messages."""
    largest: list[MessageEntry] = field(default_factory=list)
    repair_kinds: dict[str, int] = field(default_factory=dict)
    repair_list: list[Event] = field(default_factory=list)
    failure_kinds: dict[str, int] = field(default_factory=dict)
    failure_list: list[Event] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    cap: int = 50
    top: int = 20
    info: dict[str, str] = field(default_factory=dict)
    """Free-form settings shown under the headline (tokenizer, preset, backend, workers)."""


class _Muted(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def message_preview(message: Any) -> str:
    """The start of a message's text on one line (at most 80 characters; a call message
    without text shows its calls).

    >>> from jianmu_fast.message import human
    >>> message_preview(human("two\\nlines " + "x" * 100))[:12], len(message_preview(human("y" * 100)))
    ('two lines xx', 80)
    """
    content = message.content
    if isinstance(content, str):
        text = content
    elif content:
        text = " ".join(b.get("text", f"[{b.get('type', '?')}]") for b in content if isinstance(b, dict))
    else:
        text = ""
    if not text and message.tool_calls:
        text = ", ".join(f"{c['function']['name']}({c['function'].get('arguments') or ''})" for c in message.tool_calls)
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[:_PREVIEW - 1] + "…"


class RunCollector:
    """Gathers a run's figures chunk by chunk; :meth:`finish` returns the :class:`RunStats`.

    ``builder`` and ``counter`` are the run's; ``tools`` the request's tool schemas (their
    cost is a section of every prompt); ``src_name`` is the ``FILE`` of ``FILE:LINE``.
    The command line calls :meth:`count` before a chunk is built, :meth:`built` after, and
    :meth:`add_lines` once it is written; each ends a phase (:meth:`lap`).
    """

    def __init__(self, builder: Any, counter: Any, *, src_name: str, tools: Optional[Sequence[Any]] = None,
                 top: int = 20, cap: int = 50) -> None:
        self.builder = builder
        self.counter = counter
        self.tools = list(tools) if tools else None
        budget = max_messages = None
        for flt in getattr(builder, "filters", []):
            budget = getattr(flt, "max_tokens", budget)
            max_messages = getattr(flt, "max_messages", max_messages)
        self.stats = RunStats(source=src_name, budget=budget, max_messages=max_messages, top=top, cap=cap,
                              phases={key: 0.0 for key, _ in PHASES})
        self.stats.tools_tokens = int(counter.count_tools(self.tools)) if self.tools else 0
        providers = list(getattr(builder, "providers", []))
        first_static = bool(providers) and type(providers[0]).__name__ == "StaticPromptProvider"
        self._labels = [section_label(i, p, first_static and i == 0) for i, p in enumerate(providers)]
        self._takes_tools = [self._accepts_tools(p) for p in providers]
        for label in [*self._labels, "other (added by a filter)", "request overhead"]:
            self.stats.sections.setdefault(label, [])
        if self.tools:
            self.stats.sections["request's tools"] = []
        self._heap: list[MessageEntry] = []
        self._provided: dict[int, tuple[list[Any], list[int], Any]] = {}
        self._prompts: dict[int, list[Any]] = {}
        self._t = time.perf_counter()

    @staticmethod
    def _accepts_tools(provider: Any) -> bool:
        try:
            params = inspect.signature(provider.get_messages).parameters
        except (TypeError, ValueError):
            return False
        return "tools_schema" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    # -- phases ------------------------------------------------------------------------------

    def lap(self, phase: str) -> None:
        """Add the time since the previous lap to ``phase`` (a key of :data:`PHASES`)."""
        now = time.perf_counter()
        self.stats.phases[phase] = self.stats.phases.get(phase, 0.0) + (now - self._t)
        self._t = now

    # -- per chunk ---------------------------------------------------------------------------

    def count(self, lines: Sequence[Any]) -> None:
        """The counting phase of a chunk: run the providers of each line's ``state()``, label
        and count every provided message (one ``count_array`` call). Times itself."""
        self.lap("reading")
        flat: list[Any] = []
        per_line: list[tuple[int, list[Any], list[int]]] = []
        for line in lines:
            state = line.state()
            msgs: list[Any] = []
            secs: list[int] = []
            for i, provider in enumerate(self.builder.providers):
                try:
                    if self._takes_tools[i]:
                        block = provider.get_messages(state, None, None, tools_schema=self.tools)
                    else:
                        block = provider.get_messages(state, None, None)
                    from .message import coerce_messages

                    block = coerce_messages(block, f"providers[{i}]")
                except Exception:  # the build reports it (skipped provider, or the line's error)
                    continue
                msgs.extend(block)
                secs.extend([i] * len(block))
            per_line.append((line.lineno, msgs, secs))
            flat.extend(msgs)
        counts = self._count(flat)
        k = 0
        for lineno, msgs, secs in per_line:
            self._provided[lineno] = (msgs, secs, counts[k:k + len(msgs)])
            k += len(msgs)
        self.lap("counting")

    def _count(self, messages: list[Any]) -> list[int]:
        if not messages:
            return []
        array = getattr(self.counter, "count_array", None)
        if array is not None:
            return [int(x) for x in array(messages)]
        return [int(self.counter.count_message(m)) for m in messages]

    def built(self, lines: Sequence[Any], results: Sequence[Any]) -> None:
        """After a chunk is built: keep each line's prompt (``results``: a prompt, or the
        exception its build raised) until :meth:`add_lines`. Ends the trimming phase."""
        self.lap("trimming")
        for line, result in zip(lines, results):
            if not isinstance(result, BaseException):
                self._prompts[line.lineno] = result

    def add_lines(self, lines: Sequence[Any], stop_early: bool) -> None:
        """After a chunk is written: each line's figures, in the order the command reports
        them (under ``stop_early``, up to the first failure). Ends the writing phase."""
        self.lap("writing")
        for line in lines:
            if line.error is not None:
                self.failure(line.lineno, line.error)
                if stop_early:
                    break
                continue
            self._success(line, self._prompts.get(line.lineno) or [])
        self._provided.clear()
        self._prompts.clear()
        self.lap("report")

    def failure(self, lineno: int, reason: str) -> None:
        """Record a failed input line."""
        st = self.stats
        st.failures += 1
        kind = failure_kind(reason)
        st.failure_kinds[kind] = st.failure_kinds.get(kind, 0) + 1
        if len(st.failure_list) < st.cap:
            st.failure_list.append(Event(f"{st.source}:{lineno}", kind, reason))

    def _success(self, line: Any, prompt: list[Any]) -> None:
        st = self.stats
        where = f"{st.source}:{line.lineno}"
        msgs, secs, counts = self._provided.pop(line.lineno, ([], [], []))
        by_id = {m.id: (m, s, c) for m, s, c in zip(msgs, secs, counts)}
        before = int(self.counter.count_messages(msgs)) if msgs else line.tokens
        after = int(line.tokens)
        history = line.history
        first = line.persona if line.replace_persona else 0
        kept_ids = {m.id for m in prompt}
        n_dropped = sum(1 for i in range(first, len(history)) if history[i].id not in kept_ids)
        st.prompts += 1
        st.trimmed += n_dropped > 0
        st.tokens_before += before
        st.tokens_after += after
        st.tokens_dropped += int(line.dropped_tokens)
        st.messages_dropped += n_dropped
        st.before.append(before)
        st.after.append(after)
        st.dropped.append(n_dropped)
        # sections of what was sent
        per = [0] * len(self._labels)
        other = 0
        for m in prompt:
            hit = by_id.get(m.id)
            if hit is not None and hit[0] is m:
                per[hit[1]] += hit[2]
            else:
                c = int(self.counter.count_message(m))
                if hit is not None:
                    per[hit[1]] += c
                else:
                    other += c
        sections = st.sections
        for label, v in zip(self._labels, per):
            sections[label].append(v)
        sections["other (added by a filter)"].append(other)
        sections["request overhead"].append(after - sum(per) - other)
        if self.tools:
            sections["request's tools"].append(st.tools_tokens)
        # the largest messages, as sent to the model (annotated copies keep the input's id)
        position = {m.id: i for i, m in enumerate(history)}
        heap = self._heap
        floor = heap[0].tokens if len(heap) >= st.top else -1
        for m, _s, c in zip(msgs, secs, counts):
            if c > floor and m.id in position:
                entry = MessageEntry(c, where, position[m.id], m.role, m.id in kept_ids, message_preview(m))
                if len(heap) < st.top:
                    heapq.heappush(heap, entry)
                else:
                    heapq.heapreplace(heap, entry)
                floor = heap[0].tokens if len(heap) >= st.top else -1
        self._repairs(where, history)

    def _repairs(self, where: str, history: list[Any]) -> None:
        from .message.sanitize import sanitize_tool_call_history_report

        log = logging.getLogger("jianmu_fast.message")
        mute = _Muted()
        log.addFilter(mute)
        try:
            report = sanitize_tool_call_history_report(history, on_broken_tail="drop")
        finally:
            log.removeFilter(mute)
        events = [("broken tool-call unit left out", f"messages{list(d.indices)}: {d.reason}") for d in report.dropped]
        events += [("call id filled from its result",
                    f"messages[{f.index}].tool_calls[{f.call_index}].id = {f.tool_call_id!r}") for f in report.filled]
        events += [("tool result paired with its single call",
                    f"messages[{f.index}].tool_call_id = {f.tool_call_id!r}") for f in report.filled_results]
        st = self.stats
        for kind, detail in events:
            st.repairs += 1
            st.repair_kinds[kind] = st.repair_kinds.get(kind, 0) + 1
            if len(st.repair_list) < st.cap:
                st.repair_list.append(Event(where, kind, detail))

    # -- the end -----------------------------------------------------------------------------

    def finish(self, seconds: float, **info: str) -> RunStats:
        """The run's :class:`RunStats`; ``seconds`` is the wall time the summary printed."""
        self.lap("writing")
        st = self.stats
        st.seconds = seconds
        st.largest = sorted(self._heap, key=lambda e: (-e.tokens, e.where, e.index))
        st.info.update(info)
        if not any(st.sections.get("other (added by a filter)", [])):
            st.sections.pop("other (added by a filter)", None)
        return st
