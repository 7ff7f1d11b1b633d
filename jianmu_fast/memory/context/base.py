"""The three Protocols of the Provider → Filter pipeline, plus the builder's own.

They are Protocols, not base classes: any object with the right method takes part.
``isinstance(x, MessageProvider)`` works (runtime-checkable), and ``ContextBuilder``
uses it to reject wrong arguments with a clear ``TypeError``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Protocol, Sequence, runtime_checkable

from ...message import Message

__all__ = ["MessageProvider", "ContextFilter", "TokenCounterProtocol", "ContextBuilderProtocol"]


@runtime_checkable
class MessageProvider(Protocol):
    """Contributes a block of messages to every prompt."""

    def get_messages(
        self, local_state: Any, global_state: Any = None, ctx: Any = None
    ) -> Sequence[Message]:
        """Return this provider's messages for the given state.

        Must not mutate ``local_state`` or the messages stored in it. A provider that also
        declares a ``tools_schema`` parameter (or ``**kwargs``) receives the request's tools.
        """
        ...


@runtime_checkable
class ContextFilter(Protocol):
    """Post-processes the concatenated messages (trimming, cleaning, enriching)."""

    def apply(
        self,
        messages: Sequence[Message],
        local_state: Any = None,
        global_state: Any = None,
        ctx: Any = None,
        **kwargs: Any,
    ) -> Sequence[Message]:
        """Return a new sequence; never mutate ``messages`` or the messages in it.

        A trimming filter keeps the invariants of CONTRACT.md section 3: the leading pinned
        messages whole; tool-call transactions whole; a contiguous run of units; the limit.
        """
        ...


@runtime_checkable
class TokenCounterProtocol(Protocol):
    """Counts tokens of messages.

    For a trimming filter to guarantee its budget, ``count_messages(ms)`` must equal
    ``count_messages([]) + sum(count_message(m) for m in ms)`` (a fixed per-request cost plus
    a cost per message); the counters of jianmu_fast all are.
    """

    def count_message(self, message: Message) -> int:
        """Tokens that ``message`` costs in a request, chat-format overhead included."""
        ...

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens that ``messages`` cost as one request."""
        ...


@runtime_checkable
class ContextBuilderProtocol(Protocol):
    """What LLM nodes call: the whole pipeline, or the filters alone."""

    def build(
        self,
        local_state: Any,
        global_state: Any = None,
        ctx: Any = None,
        tools_schema: Optional[Sequence[dict[str, Any]]] = None,
    ) -> list[Message]:
        """Run providers in order, concatenate, run filters in order."""
        ...

    def transform(
        self,
        messages: Sequence[Message],
        local_state: Any = None,
        global_state: Any = None,
        ctx: Any = None,
    ) -> list[Message]:
        """Run only the filters over existing messages."""
        ...
