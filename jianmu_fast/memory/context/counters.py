"""Token counters: ``SimpleTokenCounter`` (no dependencies), and the exact ones.

Every counter has ``count_text``, ``count_message``, ``count_messages``, ``count_array``
(one int64 count per message, what the compiled core consumes) and ``count_tools``.
``count_messages(ms) == count_messages([]) + sum(count_message(m) for m in ms)``, which is
what lets ``TokenBudgetFilter`` guarantee its budget.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Sequence

import numpy as np

from ...message import Message

__all__ = ["SimpleTokenCounter"]


class SimpleTokenCounter:
    """Estimate tokens as characters divided by ``chars_per_token`` (default 4), rounded up.

    The formula, per message::

        count_message(m) = 4                                   # role and message framing
                         + ceil(len(text) / cpt)               # str content, or each text block
                         + 85 per non-text content block       # images, audio, files
                         + ceil(len(name) / cpt) + 1           # if name is set
                         + ceil(len(tool_call_id) / cpt)       # if tool_call_id is set
                         + for each tool call: 3 + ceil(len(id) / cpt)
                               + ceil(len(function.name) / cpt) + ceil(len(function.arguments) / cpt)
        count_messages(ms) = 3 + sum(count_message(m))         # 3: the reply's priming

    >>> c = SimpleTokenCounter()
    >>> c.count_text("What is 2+2?")
    3
    >>> from jianmu_fast.message import human
    >>> c.count_message(human("What is 2+2?")), c.count_messages([human("What is 2+2?")])
    (7, 10)
    """

    PER_MESSAGE = 4
    PER_NAME = 1
    PER_TOOL_CALL = 3
    PER_REQUEST = 3
    PER_NON_TEXT_BLOCK = 85
    PER_TOOL = 8

    def __init__(self, chars_per_token: float = 4) -> None:
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, (int, float)):
            raise TypeError(f"chars_per_token must be a number, got {type(chars_per_token).__name__}")
        if not chars_per_token > 0 or math.isinf(chars_per_token):
            raise ValueError(f"chars_per_token must be a positive finite number, got {chars_per_token}")
        self.chars_per_token = chars_per_token

    def __repr__(self) -> str:
        return f"SimpleTokenCounter(chars_per_token={self.chars_per_token!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is SimpleTokenCounter and other.chars_per_token == self.chars_per_token

    def __hash__(self) -> int:
        return hash((SimpleTokenCounter, self.chars_per_token))

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``; 0 for the empty string."""
        cpt = self.chars_per_token
        if type(cpt) is int:
            return -(-len(text) // cpt)
        return math.ceil(len(text) / cpt)

    def count_message(self, message: Message) -> int:
        """Tokens of one message, by the formula in the class docstring."""
        ct = self.count_text
        total = self.PER_MESSAGE
        content = message.content
        if isinstance(content, str):
            total += ct(content)
        elif content:
            for block in content:
                if block.get("type") == "text":
                    total += ct(block["text"])
                else:
                    total += self.PER_NON_TEXT_BLOCK
        if message.name:
            total += ct(message.name) + self.PER_NAME
        if message.tool_call_id:
            total += ct(message.tool_call_id)
        if message.tool_calls:
            for call in message.tool_calls:
                fn = call["function"]
                total += (
                    self.PER_TOOL_CALL
                    + ct(call.get("id") or "")
                    + ct(fn["name"])
                    + ct(fn.get("arguments") or "")
                )
        return total

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: ``3 + sum(count_message(m))``."""
        return self.PER_REQUEST + sum(self.count_message(m) for m in messages)

    def count_array(self, messages: Sequence[Message]) -> np.ndarray:
        """One int64 count per message."""
        return np.fromiter((self.count_message(m) for m in messages), dtype=np.int64, count=len(messages))

    def count_tools(self, tools_schema: Sequence[dict[str, Any]] | None) -> int:
        """Tokens of a request's ``tools`` list: 8 per tool plus its compact JSON text."""
        if not tools_schema:
            return 0
        return sum(
            self.PER_TOOL + self.count_text(json.dumps(t, separators=(",", ":"), sort_keys=True))
            for t in tools_schema
        )
