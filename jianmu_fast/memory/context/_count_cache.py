"""The cached counting machinery shared by the exact counters.

Two bounded caches per counter, both safe to share between threads:

- **text cache**: ``str -> token count``. Each distinct text is tokenized once. One entry
  costs about 150 bytes (dict slot, key reference, the int) plus the text itself when
  nothing else holds it any more; the cache holds at most ``cache_size`` entries and at most
  ``MAX_CACHED_CHARS`` characters of keys (texts over 1/64 of that are not kept), and when
  full evicts the oldest-inserted entries down to three quarters of both bounds.
- **message cache**: ``id(message) -> (weakref(message), count, role, content count)`` (the
  last two, the content's count when it is a str, else None, are what the clearing's records
  read, in the same look-up). A recount of an unchanged
  ``Message`` object is one dict hit. The weak reference proves the entry belongs to this very
  object (an ``id`` reused by a new object never matches), keeps nothing alive, and makes a
  copy (``model_copy(update=...)``, same ``id`` field, other content) a different key. A
  ``Message`` is deeply immutable where it is counted (content blocks and ``tool_calls`` are
  frozen copies, see ``jianmu_fast.message.model``; ``metadata`` is never counted), so an
  entry never goes stale; a message whose lists are not frozen (made with
  ``model_construct``, bypassing validation) is counted but never cached. About 200 bytes per
  entry (~220 with the role and content count), at most ``cache_size`` entries. The compiled
  loop stops the cyclic garbage collector tracking an entry and its weak reference (no
  callback: it holds nothing strongly, and dies with its message all the same), which
  behind many conversations brought on full collections.

Cache misses of a ``count_array`` call are collected first, de-duplicated, and tokenized in
one pass by the subclass's ``_encode_counts(texts)``; the loop over the messages (cache
look-ups, the chat formula, one lock acquisition to store what was counted) is compiled
(``_backend.counts_of``), so a turn's few new messages cost little beyond tokenizing them.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ... import _backend
from ...message import Message
from ...message.model import FrozenList, coerce_message

__all__ = ["CachedChatCounter", "DEFAULT_CACHE_SIZE"]

DEFAULT_CACHE_SIZE = 1 << 16


def _check_cache_size(cache_size: Any) -> int:
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"cache_size must be a positive int, got {cache_size!r}")
    return cache_size


def _check_tokens(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


class CachedChatCounter:
    """Chat-format counting over a cached exact tokenizer (subclassed by the exact counters).

    Subclasses set the overhead constants and implement ``_encode_counts(texts) -> list[int]``.
    """

    PER_MESSAGE = 3
    PER_NAME = 1
    PER_TOOL_CALL = 1
    PER_REQUEST = 3
    COUNT_TOOL_CALL_ID = False
    #: the text cache also stops growing past this many characters of keys
    MAX_CACHED_CHARS = 1 << 26

    cache_size: int
    #: what ``counts_of`` counts without coercing, and the frozen list type of a cacheable message
    _message_type = Message
    _frozen_list = FrozenList
    #: ``len(_direct_encode(text))`` is ``_encode_counts([text])[0]`` (None: call _encode_counts)
    _direct_encode: Any = None
    #: characters an engine rule has been asked for (``engine="auto"``); -1: no rule pending.
    #: ``counts_of`` adds what it encodes by ``_direct_encode``, and leaves a call that would
    #: reach ``AUTO_FASTOKENS_CHARS`` to ``_encode_counts`` (which applies the rule)
    _auto_chars = -1
    AUTO_FASTOKENS_CHARS = 0

    def _init_cache(self, cache_size: int, image_tokens: int) -> None:
        self.cache_size = _check_cache_size(cache_size)
        self._image_tokens = _check_tokens("image_tokens", image_tokens)
        self._lock = threading.Lock()
        self._texts: dict[str, int] = {}
        self._chars = 0
        self._msgs: dict[int, tuple[Any, ...]] = {}
        self._role_base: dict[str, int] = {}

    @property
    def image_tokens(self) -> int:
        """Fixed cost of each non-text content block (read-only: cached counts depend on it)."""
        return self._image_tokens

    # -- subclass hook ------------------------------------------------------------------

    def _encode_counts(self, texts: list[str]) -> list[int]:
        """Exact token counts of ``texts`` (distinct, not cached), in one pass."""
        raise NotImplementedError

    # -- caches ---------------------------------------------------------------------------

    def clear_cache(self) -> None:
        """Forget every cached count (the tokenizer stays loaded).

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> c = TiktokenTokenCounter("o200k_base")
        >>> c.count_text("hello"); c.clear_cache(); c.cache_info()
        1
        {'texts': 0, 'messages': 0, 'cache_size': 65536}
        """
        with self._lock:
            self._texts = {}
            self._chars = 0
            self._msgs = {}

    def cache_info(self) -> dict[str, int]:
        """Entries held in the text and message caches, and the bound of each.

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> TiktokenTokenCounter("o200k_base", cache_size=100).cache_info()
        {'texts': 0, 'messages': 0, 'cache_size': 100}
        """
        return {"texts": len(self._texts), "messages": len(self._msgs), "cache_size": self.cache_size}

    def _store_texts(self, texts: list[str], counts: list[int]) -> None:
        with self._lock:
            self._put_texts(texts, counts)

    def _put_texts(self, texts: list[str], counts: list[int]) -> None:
        """``_store_texts`` with the lock held."""
        cache = self._texts
        longest = self.MAX_CACHED_CHARS >> 6
        for t, c in zip(texts, counts):
            if t not in cache and len(t) <= longest:  # huge texts: the message cache only
                cache[t] = c
                self._chars += len(t)
        if len(cache) > self.cache_size or self._chars > self.MAX_CACHED_CHARS:
            self._evict_texts()

    def _evict_texts(self) -> None:
        """With the lock held: drop the oldest texts down to three quarters of both bounds."""
        cache = self._texts
        keep_n = (self.cache_size * 3) // 4
        keep_chars = (self.MAX_CACHED_CHARS * 3) // 4
        for key in list(cache):  # oldest first
            if len(cache) <= keep_n and self._chars <= keep_chars:
                break
            del cache[key]
            self._chars -= len(key)

    def _role_cost(self, role: str) -> int:
        base = self._role_base.get(role)
        if base is None:
            base = self.PER_MESSAGE + self.count_text(role)
            self._role_base[role] = base
        return base

    # -- the public API ---------------------------------------------------------------------

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text``; special-token text is counted as ordinary text.

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> TiktokenTokenCounter("o200k_base").count_text("tiktoken is great!")
        6
        """
        if type(text) is not str:
            if not isinstance(text, str):
                raise TypeError(f"text must be a str, got {type(text).__name__}")
            text = str(text)
        n = self._texts.get(text)
        if n is not None:
            return n
        n = self._encode_counts([text])[0]
        self._store_texts([text], [n])
        return n

    def count_message(self, message: Message) -> int:
        """Tokens ``message`` costs in a request (see the class docstring for the formula).

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> from jianmu_fast.message import human
        >>> TiktokenTokenCounter("o200k_base").count_message(human("Hi!", name="ann"))
        8
        """
        e = self._msgs.get(id(message))
        if e is not None and e[0]() is message:
            return e[1]
        return self._counts([message], "message")[0]

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: ``PER_REQUEST + sum(count_message(m) for m in messages)``.

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> from jianmu_fast.message import human, system
        >>> c = TiktokenTokenCounter("o200k_base")
        >>> c.count_messages([system("Be brief."), human("Hi!")]), c.count_messages([])
        (16, 3)
        """
        ms = messages if isinstance(messages, (list, tuple)) else list(messages)
        return self.PER_REQUEST + sum(self._counts(ms, "messages"))

    def count_array(self, messages: Sequence[Message]) -> np.ndarray:
        """One int64 count per message, what the compiled core consumes.

        Cache misses are tokenized together, in one pass over the distinct missing texts.

        >>> from jianmu_fast.memory.context import TiktokenTokenCounter
        >>> from jianmu_fast.message import human, system
        >>> TiktokenTokenCounter("o200k_base").count_array([system("Be brief."), human("Hi!")])
        array([7, 6])
        """
        ms = messages if isinstance(messages, (list, tuple)) else list(messages)
        return np.array(self._counts(ms, "messages"), dtype=np.int64)

    # -- the loop ----------------------------------------------------------------------------

    def _counts(self, ms: Sequence[Any], where: str = "messages") -> list[int]:
        """One count per message of ``ms`` (a list or tuple): the message cache, then the
        misses counted together (``_backend.counts_of``, compiled; its pure-Python twin
        ``_filter_core_py.counts_of`` is the specification); ``where`` names ``ms`` in a
        coercion error."""
        return _backend.counts_of(self, ms, where)

    @staticmethod
    def _coerce(item: Any, where: str) -> Message:
        if isinstance(item, Mapping) or isinstance(item, Message):
            return coerce_message(item, where)
        from ...errors import MessageValidationError

        raise MessageValidationError(
            f"{where}: expected a Message or a chat-completions dict, got {type(item).__name__}"
        )
