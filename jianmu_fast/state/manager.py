"""``StateManager``: a thread-safe key/value state container with two backends.

Every operation takes one lock, so calls from many threads never interleave. Keys are
strings. A key holds either a plain value or a *message list*: ``set(key, [Message, ...])``
(a non-empty list or tuple of Messages only) and :meth:`StateManager.append_messages` make a
message list, which ``get`` returns as a new ``list`` of the stored Message objects.

Backends:

- **memory** (``StateManager()``, the default) keeps references, like a ``dict``: ``get``
  returns the object that was ``set`` (do not mutate it; call ``set`` again), and any Python
  object can be stored.
- **SQLite** (``StateManager.sqlite(path)``): stdlib ``sqlite3``, WAL journal, one
  transaction per write (``update`` is one transaction for all its keys), values stored as
  JSON (see ``jianmu_fast.state._codec``: a Message round-trips with its ``id`` and
  ``metadata``; a tuple comes back as a list; anything JSON cannot hold is refused with a
  ``TypeError`` naming its path). ``get`` returns a fresh decoded value. A message list is a
  table of rows keyed ``(key, seq)``: appending one message writes one row, and decoded
  messages are cached per process, so repeated reads return the same Message objects and
  read only rows they have not seen.

``snapshot()`` returns a new dict of every key, deep-copied (Message objects are immutable
and shared), so later writes never show through it.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any, Iterator, Mapping, Optional, Protocol, Sequence, Union

from ..message.model import Message

__all__ = ["StateManager", "RetentionPolicy"]

_MISSING = object()


class RetentionPolicy(Protocol):
    """Decides, after a write, how many of the oldest messages of a list to evict."""

    def evict_count(self, messages: Sequence[Message]) -> int:
        """Number of messages to drop from the front of ``messages`` (0 to ``len``)."""
        ...


def _is_message_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(m, Message) for m in value)


def _copy_value(v: Any) -> Any:
    if isinstance(v, Message):
        return v
    if isinstance(v, dict):
        return {k: _copy_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_copy_value(x) for x in v)
    return copy.deepcopy(v)


def _check_evict(n: int, total: int, retention: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= total:
        raise ValueError(f"{type(retention).__name__}.evict_count returned {n!r}; expected an int in [0, {total}]")
    return n


class _MessageList(list):
    """Marks a memory-backend value as a message list."""


class _MemoryBackend:
    name = "memory"
    path: Optional[str] = None

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        v = self._data.get(key, _MISSING)
        return list(v) if isinstance(v, _MessageList) else v

    def set_many(self, items: list[tuple[str, Any]]) -> None:
        for key, value in items:
            self._data[key] = _MessageList(value) if _is_message_list(value) else value

    def delete(self, key: str) -> bool:
        return self._data.pop(key, _MISSING) is not _MISSING

    def keys(self) -> list[str]:
        return list(self._data)

    def snapshot(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, _MessageList) else _copy_value(v)) for k, v in self._data.items()}

    def _list(self, key: str) -> _MessageList:
        v = self._data.get(key, _MISSING)
        if isinstance(v, _MessageList):
            return v
        if v is _MISSING or (isinstance(v, (list, tuple)) and len(v) == 0):
            lst = self._data[key] = _MessageList()
            return lst
        raise TypeError(f"state[{key!r}] holds a {type(v).__name__}, not a message list")

    def append_messages(self, key: str, messages: list[Message], retention: Any) -> int:
        lst = self._list(key)
        lst.extend(messages)
        if retention is None:
            return 0
        try:
            n = _check_evict(retention.evict_count(lst), len(lst), retention)
        except BaseException:
            del lst[len(lst) - len(messages) :]
            raise
        if n:
            del lst[:n]
        return n

    def get_messages(self, key: str) -> list[Message]:
        v = self._data.get(key, _MISSING)
        if v is _MISSING:
            return []
        if isinstance(v, _MessageList):
            return list(v)
        if isinstance(v, (list, tuple)) and len(v) == 0:
            return []
        raise TypeError(f"state[{key!r}] holds a {type(v).__name__}, not a message list")

    def clear_messages(self, key: str) -> int:
        v = self._data.get(key, _MISSING)
        if v is _MISSING:
            return 0
        lst = self._list(key)
        n = len(lst)
        lst.clear()
        return n

    def close(self) -> None:
        pass


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"state keys must be strings, got {type(key).__name__} {key!r}")
    return key


class StateManager:
    """A thread-safe state container: ``get`` / ``set`` / ``update`` / ``delete`` / ``snapshot``.

    >>> sm = StateManager()
    >>> sm.set("turn", 1)
    >>> sm.update({"user": "ada"}, turn=2)
    >>> sm.get("turn"), sm["user"], sm.get("missing", "-"), "user" in sm
    (2, 'ada', '-', True)
    >>> sm.snapshot()
    {'turn': 2, 'user': 'ada'}
    """

    def __init__(self, *, _backend: Any = None) -> None:
        self._backend = _backend if _backend is not None else _MemoryBackend()
        self._lock = threading.RLock()
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (batch workers under ``spawn``): the lock is recreated; an SQLite manager
        reopens its file by path (the copy shares the database); a memory manager is copied.

        >>> import pickle
        >>> sm = StateManager(); sm.set("a", 1)
        >>> pickle.loads(pickle.dumps(sm)).get("a")
        1
        """
        with self._lock:
            return {"_backend": self._backend, "_closed": self._closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._backend = state["_backend"]
        self._closed = state["_closed"]
        self._lock = threading.RLock()

    @classmethod
    def sqlite(
        cls, path: Union[str, "os.PathLike[str]"], *, timeout: float = 30.0, synchronous: str = "FULL", read_only: bool = False
    ) -> "StateManager":
        """A StateManager persisted in the SQLite file ``path`` (created when missing).

        ``read_only=True`` opens an existing state database for reading only (SQLite
        ``mode=ro``): every write raises :class:`~jianmu_fast.errors.StateStoreError`.
        Any SQLite failure (a corrupted file, a read-only file or directory, a lock held
        past ``timeout``) is a ``StateStoreError`` naming the file and the cause, and a
        write that fails leaves the database exactly as it was.

        ``synchronous="FULL"`` (the default) makes every returned write survive a power
        loss; ``"NORMAL"`` survives a process crash only and is about 50x faster per
        write on a disk that honours ``fsync``. A file that is not a jianmu_fast state
        database raises :class:`~jianmu_fast.errors.StateStoreError` and is left untouched.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "state.db")
        >>> with StateManager.sqlite(path) as sm:
        ...     sm.set("turn", 3)
        >>> with StateManager.sqlite(path) as sm:
        ...     sm.get("turn")
        3
        """
        from .sqlite import SQLiteBackend

        return cls(_backend=SQLiteBackend(path, timeout=timeout, synchronous=synchronous, read_only=read_only))

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """``"memory"`` or ``"sqlite"``."""
        return self._backend.name

    @property
    def path(self) -> Optional[str]:
        """The database file of the SQLite backend (``None`` in memory)."""
        return self._backend.path

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"StateManager(backend={self.backend!r}{where})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def close(self) -> None:
        """Close the backend (the SQLite connection). Further calls raise ``ValueError``."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._backend.close()

    def __enter__(self) -> "StateManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- values -----------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is not set."""
        _check_key(key)
        with self._lock:
            self._check_open()
            v = self._backend.get(key)
        return default if v is _MISSING else v

    def __getitem__(self, key: str) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` (one transaction). A non-empty list of Messages becomes a
        message list."""
        self.update({_check_key(key): value})

    def update(self, mapping: Optional[Mapping[str, Any]] = None, /, **kwargs: Any) -> None:
        """Set several keys at once, atomically (one transaction on SQLite).

        >>> sm = StateManager(); sm.update(a=1, b=2); sm.keys()
        ['a', 'b']
        """
        items: list[tuple[str, Any]] = []
        if mapping is not None:
            if not isinstance(mapping, Mapping):
                raise TypeError(f"update() takes a mapping, got {type(mapping).__name__}")
            items.extend((_check_key(k), v) for k, v in mapping.items())
        items.extend(kwargs.items())
        if not items:
            return
        with self._lock:
            self._check_open()
            self._backend.set_many(items)

    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it was set."""
        _check_key(key)
        with self._lock:
            self._check_open()
            return self._backend.delete(key)

    def keys(self) -> list[str]:
        """The keys, in the order they were first set."""
        with self._lock:
            self._check_open()
            return self._backend.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the whole state as a dict (Messages shared: they are immutable)."""
        with self._lock:
            self._check_open()
            return self._backend.snapshot()

    # -- message lists ----------------------------------------------------------------------

    def append_messages(self, key: str, messages: Sequence[Message], *, retention: Any = None) -> int:
        """Append ``messages`` to the message list ``key`` in one transaction (created when
        missing); return how many old messages ``retention`` evicted.

        Only the new messages are written. ``retention`` (e.g.
        :class:`~jianmu_fast.message.store.MaxCountRetention`) sees the whole list after the
        append, inside the same transaction.

        >>> from jianmu_fast.message import human
        >>> sm = StateManager(); sm.append_messages("h", [human("a"), human("b")])
        0
        >>> [m.content for m in sm.get_messages("h")]
        ['a', 'b']
        """
        _check_key(key)
        msgs = list(messages)
        for i, m in enumerate(msgs):
            if not isinstance(m, Message):
                raise TypeError(f"messages[{i}]: expected a Message, got {type(m).__name__}")
        with self._lock:
            self._check_open()
            return self._backend.append_messages(key, msgs, retention)

    def get_messages(self, key: str) -> list[Message]:
        """The message list ``key`` as a new list (empty when the key is not set)."""
        _check_key(key)
        with self._lock:
            self._check_open()
            return self._backend.get_messages(key)

    def clear_messages(self, key: str) -> int:
        """Empty the message list ``key``; return how many messages it held."""
        _check_key(key)
        with self._lock:
            self._check_open()
            return self._backend.clear_messages(key)

