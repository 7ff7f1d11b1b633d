"""``build_report``: a build, with the tokens each provider added and each filter dropped.

The answer to "my prompt is over budget: which section is it?". ``build_report`` runs the
same stages as ``ContextBuilder.build`` (same order, same error isolation, same final
sanitizing step), so ``report.messages == builder.build(...)``, and records per stage:

- each provider: how many messages and tokens it contributed (by index and class name);
- each filter, and the final ``sanitize_tool_call_history`` step: the messages and tokens
  it received, kept and dropped (dropped = present before the stage, absent after, by
  message id).

Tokens are counted by ``counter`` (default: the counter of the builder's last
``TokenBudgetFilter``, else ``SimpleTokenCounter()``). Per-message counts exclude the
request's fixed overhead. The request's tools (``tools_schema``) are their own line,
``tools_tokens`` (``counter.count_tools``); ``provided_tokens`` and ``total_tokens`` are the
request as billed: ``counter.count_messages(messages)`` plus ``tools_tokens``.
"""

from __future__ import annotations

import logging
from collections import Counter as _Multiset
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ...errors import JianmuError
from ...message import Message, coerce_messages
from .counters import SimpleTokenCounter

__all__ = ["BuildReport", "ProviderReport", "StageReport", "build_report"]

logger = logging.getLogger("jianmu_fast.context")


@dataclass(frozen=True)
class ProviderReport:
    """What ``providers[index]`` contributed (``failed``: it raised and was skipped).

    >>> ProviderReport(0, "StaticPromptProvider", messages=1, tokens=7).tokens
    7
    """

    index: int
    name: str
    messages: int
    tokens: int
    failed: bool = False


@dataclass(frozen=True)
class StageReport:
    """What one filter (or the final sanitize step, ``index == -1``) kept and dropped.

    >>> StageReport(0, "MaxMessagesFilter", 5, 3, 50, 30, 2, 20).dropped_tokens
    20
    """

    index: int
    name: str
    messages_in: int
    messages_out: int
    tokens_in: int
    tokens_out: int
    dropped_messages: int
    dropped_tokens: int
    failed: bool = False
    detail: str = ""
    """What a context-editing stage did (``editing.describe_edits``): results cut or cleared,
    tokens saved, messages summarized; ``""`` for a stage that only keeps or drops."""


@dataclass
class BuildReport:
    """The result of :func:`build_report`; ``str(report)`` is a small table.

    >>> from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, MaxMessagesFilter
    >>> b = ContextBuilder(providers=[StaticPromptProvider("Be brief.")], filters=[MaxMessagesFilter(1)])
    >>> r = b.build_report({})
    >>> [(p.name, p.messages, p.tokens) for p in r.providers], r.total_tokens
    ([('StaticPromptProvider', 1, 7)], 10)
    """

    messages: list[Message]
    providers: list[ProviderReport] = field(default_factory=list)
    stages: list[StageReport] = field(default_factory=list)
    provided_tokens: int = 0
    total_tokens: int = 0
    tools_tokens: int = 0
    """What the request's tools cost (``counter.count_tools(tools_schema)``, plus what they
    cost again in this prompt where a chat template prints them more than once:
    ``TokenBudgetFilter.tools_cost(tools_schema, messages)``; 0 without tools)."""
    overhead_tokens: int = 0
    """What the request's framing costs beyond its messages and tools: ``total_tokens`` minus
    both (the chat template's fixed text and generation prompt, for ``ChatTemplateTokenCounter``)."""
    counter: Any = None
    error: Optional[JianmuError] = None
    """With ``strict=False``: the error a filter raised; ``messages`` are what reached it."""
    provided_messages: list[Message] = field(default_factory=list, repr=False, compare=False)
    """Every message the providers gave, in order (kept or not)."""
    provided_sections: list[int] = field(default_factory=list, repr=False, compare=False)
    """The index of the provider each of ``provided_messages`` came from."""

    def to_html(self, path: Any) -> None:
        """Write a self-contained HTML page of this prompt to ``path``: every provided message
        in order, kept or dropped, with its section and token count (``jianmu_fast[report]``)."""
        from ...report_html import build_report_html, write_html

        write_html(path, build_report_html(self))

    @property
    def filters(self) -> list[StageReport]:
        """The filter stages only (without the final sanitize step)."""
        return [s for s in self.stages if s.index >= 0]

    def __str__(self) -> str:
        rows = [f"{'stage':<44} {'msgs':>6} {'tokens':>8}"]
        for p in self.providers:
            rows.append(f"{f'providers[{p.index}] {p.name}' + (' (failed)' if p.failed else ''):<44} "
                        f"{'+' + str(p.messages):>6} {'+' + str(p.tokens):>8}")
        if self.tools_tokens:
            rows.append(f"{'tools (tools_schema)':<44} {'':>6} {'+' + str(self.tools_tokens):>8}")
        rows.append(f"{'provided (with request overhead)':<44} {sum(p.messages for p in self.providers):>6} "
                    f"{self.provided_tokens:>8}")
        for s in self.stages:
            label = f"filters[{s.index}] {s.name}" if s.index >= 0 else s.name
            rows.append(f"{label + (' (failed)' if s.failed else ''):<44} {'-' + str(s.dropped_messages):>6} "
                        f"{'-' + str(s.dropped_tokens):>8}" + (f"  {s.detail}" if s.detail else ""))
        rows.append(f"{'request overhead (template)':<44} {'':>6} {self.overhead_tokens:>8}")
        rows.append(f"{'sent':<44} {len(self.messages):>6} {self.total_tokens:>8}")
        if self.error is not None:
            rows.append(f"error: {self.error}")
        return "\n".join(rows)


def _default_counter(builder: Any) -> Any:
    for flt in reversed(getattr(builder, "filters", [])):
        c = getattr(flt, "counter", None)
        if c is not None and callable(getattr(c, "count_message", None)):
            return c
    return SimpleTokenCounter()


def _dropped(before: Sequence[Message], after: Sequence[Message], count) -> tuple[int, int]:
    left = _Multiset(m.id for m in after)
    n = tokens = 0
    for m in before:
        if left[m.id] > 0:
            left[m.id] -= 1
        else:
            n += 1
            tokens += count(m)
    return n, tokens


def build_report(
    builder: Any,
    local_state: Any,
    global_state: Any = None,
    ctx: Any = None,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    counter: Any = None,
    *,
    strict: bool = True,
) -> BuildReport:
    """Run ``builder`` like ``build()`` and report each stage (see the module docstring).

    ``strict=False`` records a ``JianmuError`` raised by a filter (a ``ContextBudgetError``,
    say) in ``report.error`` instead of raising it; ``messages`` are then what reached that
    filter.

    >>> from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, TokenBudgetFilter
    >>> b = ContextBuilder(providers=[StaticPromptProvider("x" * 400)], filters=[TokenBudgetFilter(20)])
    >>> type(build_report(b, {}, strict=False).error).__name__
    'ContextBudgetError'
    """
    counter = counter if counter is not None else _default_counter(builder)
    cache: dict[int, int] = {}

    def count(m: Message) -> int:
        key = id(m)
        if key not in cache:
            cache[key] = int(counter.count_message(m))
        return cache[key]

    held: list[Message] = []  # keeps counted messages alive so id() keys stay unique
    report = BuildReport(messages=[], counter=counter)
    messages: list[Message] = []
    takes_tools = getattr(builder, "_provider_takes_tools", [False] * len(builder.providers))
    for i, provider in enumerate(builder.providers):
        name = type(provider).__name__
        try:
            if takes_tools[i]:
                block = provider.get_messages(local_state, global_state, ctx, tools_schema=tools_schema)
            else:
                block = provider.get_messages(local_state, global_state, ctx)
            block = coerce_messages(block, f"providers[{i}] ({name}) output")
        except JianmuError:
            raise
        except Exception:
            logger.exception("providers[%d] (%s) failed; its messages are skipped", i, name)
            report.providers.append(ProviderReport(i, name, 0, 0, failed=True))
            continue
        held.extend(block)
        report.providers.append(ProviderReport(i, name, len(block), sum(count(m) for m in block)))
        messages.extend(block)
        report.provided_sections.extend([i] * len(block))
    report.provided_messages = list(messages)
    tools_cost = _tools_pricer(counter)
    report.tools_tokens = tools_cost(tools_schema, messages) if tools_schema else 0
    report.provided_tokens = int(counter.count_messages(messages)) + report.tools_tokens

    def stage(index: int, name: str, before: list[Message], after: list[Message], failed: bool = False) -> None:
        held.extend(after)
        n, t = _dropped(before, after, count)
        from .editing import describe_edits

        report.stages.append(StageReport(
            index, name, len(before), len(after), sum(count(m) for m in before),
            sum(count(m) for m in after), n, t, failed, describe_edits(before, after),
        ))

    for i, flt in enumerate(builder.filters):
        try:
            out = builder._apply_filter(i, messages, local_state, global_state, ctx, tools_schema)
        except JianmuError as exc:
            if strict:
                raise
            report.error = exc
            stage(i, type(flt).__name__, messages, messages, failed=True)
            break
        # _apply_filter returns its input list itself only when the filter raised (and was skipped)
        stage(i, type(flt).__name__, messages, out, failed=out is messages)
        messages = out
    if report.error is None:
        out = builder._finish(messages, tools_schema)
        if getattr(builder, "sanitize", False):
            stage(-1, "sanitize_tool_call_history", messages, out)
        messages = out
    report.messages = messages
    report.tools_tokens = tools_cost(tools_schema, messages) if tools_schema else 0
    report.total_tokens = int(counter.count_messages(messages)) + report.tools_tokens
    report.overhead_tokens = report.total_tokens - report.tools_tokens - sum(count(m) for m in messages)
    return report


def _tools_pricer(counter: Any) -> Any:
    """``tools_cost(tools_schema, messages)`` of a ``TokenBudgetFilter`` with ``counter``: the
    tools' cost in the request of ``messages``, as the budget charges it (one filter for the
    provided and the final prompt: the tools are counted once)."""
    from .filters import TokenBudgetFilter

    return TokenBudgetFilter(1, counter).tools_cost
