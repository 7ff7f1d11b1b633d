"""How much of a run of prompts a provider's prompt cache could serve.

Model providers cache the longest prefix a request shares with an earlier one and bill it
at a fraction of the price. :func:`prefix_cache_stats` takes the prompts of consecutive
turns (each a list of :class:`~jianmu_fast.message.Message` or chat-completions dicts) and
reports, message by message:

``prefix_hit_rate``
    the share of turns after the first whose prompt starts with the *whole* previous
    prompt (``prompt[t][:len(prompt[t-1])] == prompt[t-1]``, comparing ``to_openai()``
    dicts), i.e. the turns whose request only appended to the previous one;
``cached_token_share``
    the tokens of the longest common message prefix of each prompt with the previous one,
    summed over the turns after the first, divided by the tokens of *all* prompts, the first
    one included (the first prompt is never a cache hit). A prefix's tokens are
    ``sum(counter.count_message(m))`` over its messages; a prompt's tokens are
    ``counter.count_messages(prompt)``, which adds the request's fixed cost.

Both are message-level figures against the immediately preceding prompt only: a real cache
may also match part of the first differing message and prompts older than the previous
one, and rounds cached lengths down to blocks (for example 128 tokens). They measure how
stable the start of the prompt is, which is what the filters control.

>>> from jianmu_fast.message import system, human, ai
>>> s, u1, a1, u2 = system("sys"), human("hi"), ai("hello"), human("bye")
>>> st = prefix_cache_stats([[s, u1], [s, u1, a1, u2], [s, u2]])
>>> st.turns, st.prefix_hits, st.prefix_hit_rate
(3, 1, 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from .errors import MessageValidationError
from .message import coerce_messages

__all__ = ["PrefixCacheStats", "TurnStats", "prefix_cache_stats", "common_prefix_length", "turn_ends"]


@dataclass(frozen=True)
class TurnStats:
    """One prompt of the run, as :func:`prefix_cache_stats` measured it (``per_turn``).

    >>> TurnStats(turn=2, messages=5, prompt_tokens=40, cached_tokens=30, prefix_hit=True).cached_tokens
    30
    """

    turn: int
    """Position of the prompt in the run (0 is the first)."""
    messages: int
    """Messages in the prompt."""
    prompt_tokens: int
    """``counter.count_messages(prompt)``."""
    cached_tokens: int
    """Tokens of its longest common message prefix with the previous prompt (0 for the first)."""
    prefix_hit: bool
    """Whether it starts with the whole previous prompt (False for the first)."""


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix-cache figures of a run of prompts; see the module docstring for the definitions.

    >>> PrefixCacheStats(turns=1, prefix_hits=0, total_tokens=10, cached_tokens=0).mean_prompt_tokens
    10.0
    """

    turns: int
    """Number of prompts (model calls)."""

    prefix_hits: int
    """Turns after the first whose prompt starts with the whole previous prompt."""

    total_tokens: int
    """Tokens of all prompts, ``sum(counter.count_messages(p))``."""

    cached_tokens: int
    """Tokens of the longest common message prefix of each prompt with the previous one."""

    per_turn: tuple[TurnStats, ...] = field(default=(), compare=False, repr=False)
    """Each prompt's figures, in order (what :meth:`to_html` draws; empty when built by hand)."""

    def to_html(self, path: Any, *, budget: Optional[int] = None, title: str = "prompt per model call") -> None:
        """Write a self-contained HTML page of the run, turn by turn, to ``path`` (needs
        ``pip install 'jianmu_fast[report]'``): each prompt's size against ``budget``, the
        tokens a prefix cache could serve, and the totals.
        """
        from .report_html import turns_report_html, write_html

        write_html(path, turns_report_html(self, budget=budget, title=title))

    @property
    def prefix_hit_rate(self) -> float:
        """``prefix_hits / (turns - 1)``; 1.0 when there are fewer than two turns."""
        return self.prefix_hits / (self.turns - 1) if self.turns > 1 else 1.0

    @property
    def cached_token_share(self) -> float:
        """``cached_tokens / total_tokens``; 0.0 when there are no tokens."""
        return self.cached_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def mean_prompt_tokens(self) -> float:
        """``total_tokens / turns``; 0.0 when there are no turns."""
        return self.total_tokens / self.turns if self.turns else 0.0


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Number of leading positions where ``a`` and ``b`` hold equal items.

    >>> common_prefix_length([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_cache_stats(prompts: Iterable[Sequence[Any]], counter: Optional[Any] = None) -> PrefixCacheStats:
    """Prefix-cache figures of consecutive prompts (lists of Messages or chat-completions dicts).

    ``counter`` is a token counter (``count_message``, ``count_messages``); the default is
    ``SimpleTokenCounter()``. A prompt that is not a list of messages raises
    ``MessageValidationError`` naming it (``prompts[3][1].role: ...``).

    >>> from jianmu_fast.message import system, human, ai
    >>> from jianmu_fast.memory.context import SimpleTokenCounter
    >>> s, u1, a1, u2 = system("sys"), human("hi"), ai("hello"), human("bye")
    >>> st = prefix_cache_stats([[s, u1], [s, u1, a1, u2], [s, u2]], SimpleTokenCounter())
    >>> st.total_tokens, st.cached_tokens, st.cached_token_share   # 13 + 24 + 13; 10 + 5
    (50, 15, 0.3)
    """
    if counter is None:
        from .memory.context.counters import SimpleTokenCounter

        counter = SimpleTokenCounter()
    if isinstance(prompts, (str, bytes)):
        raise MessageValidationError(f"prompts: expected a sequence of prompts, got {type(prompts).__name__}")
    turns = hits = total = cached = 0
    prev: Optional[list[dict[str, Any]]] = None
    per_turn: list[TurnStats] = []
    for t, prompt in enumerate(prompts):
        msgs = coerce_messages(prompt, f"prompts[{t}]")
        wire = [m.to_openai() for m in msgs]
        turns += 1
        size = int(counter.count_messages(msgs))
        total += size
        hit, here = False, 0
        if prev is not None:
            k = common_prefix_length(prev, wire)
            hit = k == len(prev)
            hits += hit
            here = sum(int(counter.count_message(m)) for m in msgs[:k])
            cached += here
        per_turn.append(TurnStats(t, len(msgs), size, here, hit))
        prev = wire
    return PrefixCacheStats(turns=turns, prefix_hits=hits, total_tokens=total, cached_tokens=cached,
                            per_turn=tuple(per_turn))


def turn_ends(messages: Sequence[Any]) -> list[int]:
    """History lengths at which an agent calls the model: after each user message and after
    each complete run of tool results. Replaying ``history[:end]`` for each gives one prompt
    per model call, what ``prefix_cache_stats`` compares.

    >>> from jianmu_fast.message import human, ai, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> turn_ends([human("q"), ai(None, tool_calls=call), tool("r", tool_call_id="c1"), ai("a"), human("q2")])
    [1, 3, 5]
    """
    ends = []
    n = len(messages)
    for i, m in enumerate(messages):
        if m.role == "user" or (m.role == "tool" and (i + 1 == n or messages[i + 1].role != "tool")):
            ends.append(i + 1)
    return ends
