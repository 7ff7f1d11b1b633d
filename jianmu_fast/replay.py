"""Replay one conversation through a builder, one prompt per model call, and see each turn.

:func:`replay` cuts the history where an agent calls the model
(:func:`~jianmu_fast.prefix_cache.turn_ends`), builds each prompt with
:func:`~jianmu_fast.memory.context.report.build_report` (so the result of each turn is what
``builder.build`` returns, and each stage's removals are known), and measures the run with
:func:`~jianmu_fast.prefix_cache.prefix_cache_stats` on those prompts with the same counter.
``jianmu-fast replay CONVERSATION.json`` is this function on a file.

>>> from jianmu_fast.memory.context import ContextBuilder
>>> from jianmu_fast.message import human, ai
>>> b = ContextBuilder.for_chat(system_prompt="Be brief.", max_messages=2)
>>> r = replay(b, [human("q1"), ai("a1"), human("q2"), ai("a2"), human("q3")])
>>> r.stats.turns, [t.first_kept for t in r.turns], r.stats.prefix_hits
(3, [0, 1, 3], 0)
>>> print(r.to_text())
3 model-call turns; prefix hit rate 0.0 % (0 of 2 turns start with the whole previous prompt); cached tokens 25.5 % (14 of 55)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .message import coerce_messages
from .prefix_cache import PrefixCacheStats, prefix_cache_stats, turn_ends

__all__ = ["replay", "Replay", "ReplayTurn"]


@dataclass(frozen=True)
class ReplayTurn:
    """One model call of a replay.

    >>> ReplayTurn(turn=0, history=1, first_kept=0, removed=(), tools_tokens=0, billed_tokens=20).history
    1
    """

    turn: int
    """Position of the model call (0 is the first)."""
    history: int
    """How many history messages had happened before it (``history[:history]`` was built)."""
    first_kept: Optional[int]
    """Position (in the replayed messages, plus ``offset``) of the oldest history message the
    prompt kept after the leading system messages (which are pinned); ``None`` when it kept none."""
    removed: tuple[tuple[str, int, int], ...]
    """``(stage, messages, tokens)`` each filter stage and the final sanitize step removed."""
    tools_tokens: int
    """What the request's tools cost (0 without tools)."""
    billed_tokens: int
    """The request as billed: the prompt's tokens plus ``tools_tokens``."""


@dataclass
class Replay:
    """What :func:`replay` returns: the prompts, each turn's record, and the prefix-cache figures."""

    prompts: list[list[Any]]
    turns: list[ReplayTurn]
    stats: PrefixCacheStats
    budget: Optional[int] = None
    """The builder's token budget (its last ``TokenBudgetFilter``'s ``max_tokens``), if any."""
    title: str = field(default="conversation")

    def to_text(self) -> str:
        """The one-line summary ``jianmu-fast replay --format text`` prints."""
        st = self.stats
        return (f"{st.turns} model-call turn{'s' if st.turns != 1 else ''}; prefix hit rate "
                f"{100 * st.prefix_hit_rate:.1f} % ({st.prefix_hits} of {max(st.turns - 1, 0)} turns start with "
                f"the whole previous prompt); cached tokens {100 * st.cached_token_share:.1f} % "
                f"({st.cached_tokens} of {st.total_tokens})")

    def to_html(self, path: Any) -> None:
        """Write the replay's self-contained HTML page to ``path`` (``jianmu_fast[report]``)."""
        from .report_html import turns_report_html, write_html

        write_html(path, turns_report_html(self.stats, self.turns, budget=self.budget, title=self.title))


def _budget(builder: Any) -> Optional[int]:
    budget = None
    for flt in getattr(builder, "filters", []):
        if type(flt).__name__ == "TokenBudgetFilter" or hasattr(flt, "max_tokens"):
            budget = getattr(flt, "max_tokens", budget)
    return budget


def replay(
    builder: Any,
    messages: Sequence[Any],
    *,
    tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    counter: Any = None,
    state: Optional[Callable[[list[Any]], Any]] = None,
    offset: int = 0,
    title: str = "conversation",
) -> Replay:
    """Build the prompt of each model call of ``messages`` (Messages or chat-completions
    dicts) with ``builder``, and measure the run.

    ``state(history_prefix)`` makes each turn's local state (default ``{"messages": prefix}``);
    ``counter`` defaults to the counter of the builder's last ``TokenBudgetFilter`` (as
    ``build_report``'s does); ``offset`` is added to the positions ``first_kept`` reports (the
    command line passes the number of leading system messages it took as the persona). A
    turn whose build raises raises, with the turn in a note of the exception.
    """
    from .memory.context.report import build_report

    history = coerce_messages(messages, "messages")
    make_state = state if state is not None else (lambda prefix: {"messages": prefix})
    lead = 0  # a leading run of system messages is pinned: the window starts after it
    while lead < len(history) and history[lead].role == "system":
        lead += 1
    position = {m.id: i for i, m in enumerate(history) if i >= lead}
    prompts: list[list[Any]] = []
    turns: list[ReplayTurn] = []
    used_counter = counter
    for t, end in enumerate(turn_ends(history)):
        try:
            report = build_report(builder, make_state(history[:end]), tools_schema=tools_schema, counter=counter)
        except Exception as exc:
            exc.add_note(f"while building model-call turn {t} (history messages[:{end}])")
            raise
        used_counter = report.counter
        kept = [position[m.id] for m in report.messages if m.id in position]
        removed = tuple((s.name if s.index < 0 else f"filters[{s.index}] {s.name}", s.dropped_messages,
                         s.dropped_tokens) for s in report.stages)
        turns.append(ReplayTurn(t, end, (min(kept) + offset) if kept else None, removed, report.tools_tokens,
                                report.total_tokens))
        prompts.append(report.messages)
    stats = prefix_cache_stats(prompts, used_counter)
    return Replay(prompts, turns, stats, _budget(builder), title)
