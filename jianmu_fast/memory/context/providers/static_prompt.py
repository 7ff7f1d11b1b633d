"""``StaticPromptProvider``: one fixed system message."""

from __future__ import annotations

from typing import Any

from ....message import Message, system

__all__ = ["StaticPromptProvider"]


class StaticPromptProvider:
    """Wrap a static text as one ``role="system"`` message.

    The message is made once, so every prompt starts with the same bytes and the same id.

    >>> provider = StaticPromptProvider("You are a helpful assistant.")
    >>> [(m.role, m.content) for m in provider.get_messages({})]
    [('system', 'You are a helpful assistant.')]
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        self.text = text
        self._message = system(text)

    def __repr__(self) -> str:
        return f"StaticPromptProvider({self.text[:40]!r}{'...' if len(self.text) > 40 else ''})"

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Message]:
        """Return ``[system(text)]`` (an empty list for an empty text)."""
        return [self._message] if self.text else []
