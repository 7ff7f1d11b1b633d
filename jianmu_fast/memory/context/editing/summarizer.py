"""The ``summarize`` side of ``SummarizingBudgetFilter``: its warning, a summarizer made from a
``ModelClient``, and the worker threads that run a (sync or async) ``summarize`` under a timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from typing import Any, Callable, Optional, Sequence

from ....message import Message

__all__ = ["SummaryFailedWarning", "summarizer_from_client", "DEFAULT_SUMMARY_PROMPT", "executor", "run_summarize"]

DEFAULT_SUMMARY_PROMPT = (
    "You condense the earlier part of a conversation between a user, an assistant and its tools, "
    "so that the assistant can continue without it. Keep every fact, decision, identifier, number, "
    "file name and open question the rest of the conversation may need; drop greetings and "
    "repetition. If a previous summary is given, extend it with the new messages. Answer with "
    "the summary only, in short plain sentences."
)


class SummaryFailedWarning(UserWarning):
    """``summarize`` raised, timed out or returned something else than a str: the prompt is
    the plain budget filter's."""


_EXECUTOR: Optional[concurrent.futures.ThreadPoolExecutor] = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="jianmu-summarize")
    return _EXECUTOR


def run_summarize(fn: Callable[[list[Message]], Any], messages: list[Message]) -> Any:
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
    from ....message import human, system

    def summarize(messages: list[Message]) -> str:
        reply = client.invoke([system(prompt), human(_render(messages))], config=config)
        content = reply.content
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        return content or ""

    summarize.__qualname__ = f"summarizer_from_client({type(client).__name__})"
    return summarize
