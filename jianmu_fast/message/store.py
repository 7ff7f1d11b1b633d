"""``StateMessageStore``: the message history of one agent, on a :class:`StateManager`.

Writes (``append``, ``extend``, ``clear``) are serialized by the store's lock: each is one
transaction of the state manager (one SQLite transaction, one row per new message), then
one :class:`MessageEvent` with the next sequence number goes to every subscriber, *after*
the write and outside the lock (so a subscriber may read or write the store). Events of
concurrent writers may reach subscribers out of order; ``event.seq`` gives the write order.
A subscriber that raises is logged (``jianmu_fast.message``) and the write, and the other
subscribers, go on.

Input goes through a *coercer* first, for the whole call, before anything is written:
``extend`` stores all of its messages or none.

- :class:`StrictMessageCoercer` (the default) accepts a :class:`Message` or a chat-completions
  dict (what ``Message.from_openai`` accepts: keys other than role/content/name/
  tool_call_id/tool_calls are carried in ``extra`` and sent to the API). A dict with the
  local-only keys ``id``, ``metadata`` or ``extra`` is refused, since ``from_openai`` would send
  them to the model; use a ``Message`` or the lenient coercer for those.
- :class:`LenientMessageCoercer` also accepts a ``str`` (a user message), dicts with ``id``,
  ``metadata`` and ``extra`` keys (so ``Message.model_dump()`` output round-trips) and the role
  aliases ``"human"``/``"ai"``, and any object with ``role`` and ``content`` attributes.

Retention runs inside the write. :class:`MaxCountRetention` keeps the newest ``n`` messages
and evicts whole tool-call transactions: when the cut would leave tool results whose
assistant call was evicted at the head, those results go too (so the stored history never
starts with an orphan result and may hold fewer than ``n``). When the newest transaction
alone is longer than ``n``, it is kept whole (the history then holds more than ``n``) rather
than storing results without their call.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Optional, Protocol, Sequence

from ..errors import MessageValidationError
from ..state.manager import StateManager
from .model import Message, coerce_message

__all__ = [
    "StateMessageStore",
    "MessageCoercer",
    "StrictMessageCoercer",
    "LenientMessageCoercer",
    "MaxCountRetention",
    "MessageEvent",
]

logger = logging.getLogger("jianmu_fast.message")

_LOCAL_KEYS = ("id", "metadata", "extra")
_ROLE_ALIASES = {"human": "user", "ai": "assistant"}


class MessageCoercer(Protocol):
    """Turns one input item into a :class:`Message`, or raises ``MessageValidationError``."""

    def coerce(self, item: Any, where: str) -> Message:
        """``where`` names the item in errors, e.g. ``"messages[3]"``."""
        ...


class StrictMessageCoercer:
    """Accept a :class:`Message` or a valid chat-completions dict; refuse anything else.

    >>> StrictMessageCoercer().coerce({"role": "user", "content": "hi"}, "messages[0]").content
    'hi'
    >>> StrictMessageCoercer().coerce("hi", "messages[2]")
    Traceback (most recent call last):
    ...
    jianmu_fast.errors.MessageValidationError: messages[2]: expected a Message or a chat-completions dict, got str
    """

    def coerce(self, item: Any, where: str) -> Message:
        """Return ``item`` as a Message (see the class docstring)."""
        if isinstance(item, Mapping):
            for k in _LOCAL_KEYS:
                if k in item:
                    raise MessageValidationError(
                        f"{where}.{k}: not a chat-completions key (it would be sent to the model); "
                        "pass a Message(...) to store id/metadata, or use LenientMessageCoercer"
                    )
        return coerce_message(item, where)

    def __repr__(self) -> str:
        return "StrictMessageCoercer()"


class LenientMessageCoercer:
    """Turn what it can into a :class:`Message`, by these rules (in order):

    1. a ``Message`` is kept as it is;
    2. a ``str`` becomes a user message with that text;
    3. a dict: ``role`` may be ``"human"`` or ``"ai"`` (read as user/assistant); ``id``,
       ``metadata`` and ``extra`` fill those fields; other keys are read as by
       ``Message.from_openai`` (unknown keys are kept in ``extra``);
    4. an object with ``role`` and ``content`` attributes: those two, plus ``name``,
       ``tool_call_id``, ``tool_calls``, ``id`` and ``metadata`` when it has them and they are
       not ``None`` (no other attribute is read);
    5. anything else raises ``MessageValidationError`` naming the item.

    >>> c = LenientMessageCoercer()
    >>> [(m.role, m.content) for m in (c.coerce("hi", "m"), c.coerce({"role": "ai", "content": "yo"}, "m"))]
    [('user', 'hi'), ('assistant', 'yo')]
    """

    def coerce(self, item: Any, where: str) -> Message:
        """Return ``item`` as a Message (see the class docstring)."""
        if isinstance(item, Message):
            return item
        if isinstance(item, str):
            return Message(role="user", content=item)
        if isinstance(item, Mapping):
            d = dict(item)
            if isinstance(d.get("role"), str):
                d["role"] = _ROLE_ALIASES.get(d["role"], d["role"])
            local = {k: d.pop(k) for k in _LOCAL_KEYS if k in d}
            m = coerce_message(d, where)
            if not local:
                return m
            extra = local.pop("extra", None)
            if extra is not None:
                if not isinstance(extra, Mapping):
                    raise MessageValidationError(f"{where}.extra: expected a dict, got {type(extra).__name__}")
                local["extra"] = {**extra, **m.extra}
            return _validated(dict(m.model_dump(exclude_unset=True), **local), where)
        if hasattr(item, "role") and hasattr(item, "content"):
            role = getattr(item, "role")
            fields: dict[str, Any] = {"role": _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role}
            fields["content"] = getattr(item, "content")
            for k in ("name", "tool_call_id", "tool_calls", "id", "metadata"):
                v = getattr(item, k, None)
                if v is not None:
                    fields[k] = v
            return _validated(fields, where)
        raise MessageValidationError(
            f"{where}: cannot make a Message from {type(item).__name__}; pass a Message, a str, "
            "a dict or an object with role and content attributes"
        )

    def __repr__(self) -> str:
        return "LenientMessageCoercer()"


def _validated(fields: dict[str, Any], where: str) -> Message:
    from pydantic import ValidationError

    from .model import _validation_message

    try:
        return Message(**fields)
    except ValidationError as exc:
        raise MessageValidationError(_validation_message(exc, where)) from None
    except TypeError as exc:
        raise MessageValidationError(f"{where}: {exc}") from None


class MaxCountRetention:
    """Keep the newest ``n`` messages, evicting whole tool-call transactions (see the module
    docstring for the two edge cases).

    >>> from jianmu_fast.message import human, ai, tool
    >>> call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    >>> h = [human("q"), ai(None, tool_calls=call), tool("r", tool_call_id="c1"), ai("a")]
    >>> MaxCountRetention(3).evict_count(h), MaxCountRetention(2).evict_count(h)
    (1, 3)
    """

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"MaxCountRetention(n): n must be a positive int, got {n!r}")
        self.n = n

    def __repr__(self) -> str:
        return f"MaxCountRetention({self.n})"

    def evict_count(self, messages: Sequence[Message]) -> int:
        """How many of the oldest ``messages`` to evict."""
        total = len(messages)
        if total <= self.n:
            return 0
        cut = total - self.n
        j = cut
        while j < total and messages[j].role == "tool":
            j += 1
        if j < total:
            return j
        while cut > 0 and messages[cut].role == "tool":  # keep the newest transaction whole
            cut -= 1
        return cut


@dataclass(frozen=True)
class MessageEvent:
    """What one write did, as delivered to subscribers.

    >>> MessageEvent("append", (), "messages", 1).kind
    'append'
    """

    kind: Literal["append", "extend", "clear"]
    """The write: ``append`` (one message), ``extend`` (several) or ``clear``."""
    messages: tuple[Message, ...]
    """The messages written (empty for ``clear``)."""
    key: str
    """The state key of the store."""
    seq: int
    """The store's write sequence number: 1 for its first write, then +1 per write."""
    removed: int = 0
    """Messages removed by this write: evicted by retention, or cleared."""


class StateMessageStore:
    """A thread-safe message history with coercion, retention and change events.

    >>> store = StateMessageStore(max_messages=2)
    >>> seen = []
    >>> unsubscribe = store.subscribe(lambda ev: seen.append((ev.kind, ev.seq, ev.removed)))
    >>> _ = store.append({"role": "user", "content": "hi"})
    >>> _ = store.extend([{"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}])
    >>> [m.content for m in store.list()], seen
    (['hello', 'bye'], [('append', 1, 0), ('extend', 2, 1)])
    >>> unsubscribe(); store.clear(); len(store), len(seen)
    (0, 2)
    """

    def __init__(
        self,
        state_manager: Optional[StateManager] = None,
        key: str = "messages",
        coercer: Optional[MessageCoercer] = None,
        retention: Any = None,
        max_messages: Optional[int] = None,
    ) -> None:
        if state_manager is not None and not isinstance(state_manager, StateManager):
            raise TypeError(f"state_manager: expected a StateManager or None, got {type(state_manager).__name__}")
        if not isinstance(key, str):
            raise TypeError(f"key: expected a str, got {type(key).__name__}")
        if retention is not None and max_messages is not None:
            raise ValueError("pass retention= or max_messages=, not both (max_messages=N means MaxCountRetention(N))")
        if max_messages is not None:
            retention = MaxCountRetention(max_messages)
        if retention is not None and not callable(getattr(retention, "evict_count", None)):
            raise TypeError(f"retention: expected an object with evict_count(messages), got {type(retention).__name__}")
        coercer = coercer if coercer is not None else StrictMessageCoercer()
        if not callable(getattr(coercer, "coerce", None)):
            raise TypeError(f"coercer: expected an object with coerce(item, where), got {type(coercer).__name__}")
        self.state_manager = state_manager if state_manager is not None else StateManager()
        self.key = key
        self.coercer = coercer
        self.retention = retention
        self._lock = threading.Lock()
        self._subscribers: tuple[Callable[[MessageEvent], Any], ...] = ()
        self._seq = 0

    def __repr__(self) -> str:
        return f"StateMessageStore(key={self.key!r}, backend={self.state_manager.backend!r}, retention={self.retention!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (batch workers under ``spawn``): the lock is recreated; the state manager
        pickles as it does (SQLite: reopened by path); subscribers go along and must pickle.

        >>> import pickle
        >>> s = StateMessageStore(max_messages=3); _ = s.append({"role": "user", "content": "hi"})
        >>> [m.content for m in pickle.loads(pickle.dumps(s)).list()]
        ['hi']
        """
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- writes -----------------------------------------------------------------------------

    def append(self, message: Any) -> Message:
        """Coerce and store one message; return the stored Message."""
        m = self.coercer.coerce(message, "message")
        self._write("append", [m])
        return m

    def extend(self, messages: Iterable[Any]) -> list[Message]:
        """Coerce every item, then store them all in one write (or, on an error, none)."""
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
            raise MessageValidationError(f"messages: expected a list of messages, got {type(messages).__name__}")
        coerce = self.coercer.coerce
        ms = [coerce(item, f"messages[{i}]") for i, item in enumerate(messages)]
        if ms:
            self._write("extend", ms)
        return ms

    def clear(self) -> None:
        """Remove every message of this store's key."""
        with self._lock:
            n = self.state_manager.clear_messages(self.key)
            event = self._event("clear", (), n)
            subs = self._subscribers
        self._notify(event, subs)

    def _write(self, kind: Literal["append", "extend"], ms: list[Message]) -> None:
        with self._lock:
            evicted = self.state_manager.append_messages(self.key, ms, retention=self.retention)
            event = self._event(kind, tuple(ms), evicted)
            subs = self._subscribers
        self._notify(event, subs)

    def _event(self, kind: Any, ms: tuple[Message, ...], removed: int) -> MessageEvent:
        self._seq += 1
        return MessageEvent(kind, ms, self.key, self._seq, removed)

    # -- reads ------------------------------------------------------------------------------

    def list(self) -> list[Message]:
        """The stored messages, oldest first, as a new list."""
        return self.state_manager.get_messages(self.key)

    def __len__(self) -> int:
        return len(self.list())

    # -- events -----------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[MessageEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` after every write; return a function that unsubscribes."""
        if not callable(callback):
            raise TypeError(f"callback: expected a callable, got {type(callback).__name__}")
        token = _Subscription(callback)
        with self._lock:
            self._subscribers = self._subscribers + (token,)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not token)

        return unsubscribe

    def _notify(self, event: MessageEvent, subs: tuple[Callable[[MessageEvent], Any], ...]) -> None:
        for cb in subs:
            try:
                cb(event)
            except Exception:
                logger.exception(
                    "StateMessageStore(key=%r): subscriber %r failed on event seq %d; the write is kept",
                    self.key,
                    getattr(cb, "callback", cb),
                    event.seq,
                )


class _Subscription:
    """Wraps a callback so the same function may be subscribed twice and unsubscribed once."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[MessageEvent], Any]) -> None:
        self.callback = callback

    def __call__(self, event: MessageEvent) -> Any:
        return self.callback(event)
