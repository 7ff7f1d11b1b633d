"""LangChain peers with the same tiktoken counter as ``TiktokenTokenCounter``.

``TiktokenCount(encoding)`` counts LangChain messages with the very formula of
``TiktokenTokenCounter`` (3 + role + content + name + per tool call 1 + name + JSON
arguments, plus 3 per request), re-tokenizing everything on every call, as a LangChain user
who passes a tiktoken ``token_counter`` to ``trim_messages`` does. ``MemoCount`` is the same
with a per-message cache keyed by the message object (identity-checked), the best a
LangChain user can do without changing LangChain.

>>> from langchain_core.messages import HumanMessage
>>> c = TiktokenCount("o200k_base")
>>> c([HumanMessage("hello world")])
9
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from langchain_core.messages import BaseMessage, convert_to_messages, trim_messages

from jianmu_fast.memory.context._encodings import load_tiktoken_encoding
from jianmu_fast.message import Message

__all__ = ["TiktokenCount", "MemoCount", "to_langchain", "lc_trim", "originals"]

_ROLE = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


class TiktokenCount:
    """``token_counter`` for ``trim_messages``: list of LangChain messages -> tokens."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        enc = load_tiktoken_encoding(encoding)  # the offline copy; tiktoken.get_encoding needs the network
        self.encode = enc.encode_ordinary

    def one(self, m: BaseMessage) -> int:
        encode = self.encode
        n = 3 + len(encode(_ROLE[m.type]))
        c = m.content
        if isinstance(c, str):
            n += len(encode(c))
        else:
            for block in c:
                if isinstance(block, str):
                    n += len(encode(block))
                elif block.get("type") == "text":
                    n += len(encode(block["text"]))
                else:
                    n += 85
        if m.name:
            n += 1 + len(encode(m.name))
        for call in getattr(m, "tool_calls", None) or ():
            n += 1 + len(encode(call["name"])) + len(encode(json.dumps(call["args"], ensure_ascii=False)))
        return n

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        return 3 + sum(self.one(m) for m in messages)


class MemoCount(TiktokenCount):
    """``TiktokenCount`` with a per-message cache keyed by object identity."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        super().__init__(encoding)
        self.memo: dict[int, tuple[BaseMessage, int]] = {}

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        memo = self.memo
        total = 3
        for m in messages:
            e = memo.get(id(m))
            if e is None or e[0] is not m:
                e = memo[id(m)] = (m, self.one(m))
            total += e[1]
        return total


def to_langchain(msgs: Sequence[Message]) -> list[BaseMessage]:
    """Convert once (outside any timed region); the LangChain ``id`` is the Message ``id``."""
    return convert_to_messages([{**m.to_openai(), "id": m.id} for m in msgs])


def lc_trim(lc_messages: list[BaseMessage], max_tokens: int, counter: Any) -> list[BaseMessage]:
    """The documented LangChain way to trim a chat history to a token budget."""
    return trim_messages(lc_messages, max_tokens=max_tokens, token_counter=counter, strategy="last",
                         include_system=True, start_on="human", allow_partial=False)


def originals(out: Sequence[BaseMessage], by_id: dict[str, Message]) -> list[Message]:
    """Our Messages for LangChain's output (by id)."""
    return [by_id[m.id] for m in out]
