"""The SQLite backend of :class:`~jianmu_fast.state.StateManager`.

Schema (version 1), marked with ``PRAGMA application_id = 0x4A4D4653`` ("JMFS") and
``PRAGMA user_version = 1``::

    state_values(key TEXT PRIMARY KEY, kind TEXT 'value'|'messages', value TEXT (JSON),
                 head_seq INTEGER, next_seq INTEGER)
    state_messages(key TEXT, seq INTEGER, role TEXT, data TEXT (JSON record),
                   PRIMARY KEY (key, seq)) WITHOUT ROWID

A message list ``key`` holds exactly the rows ``head_seq <= seq < next_seq``; ``next_seq``
only grows, so a ``(key, seq)`` pair is never reused and the per-process cache of decoded
messages stays right even when another process writes the same file: a read fetches the
``(head_seq, next_seq)`` row, drops what was evicted from the cache and reads only new rows.

Opening checks before writing anything: the path must be a regular file (or not exist), a
non-empty file must start with the SQLite header and carry our application id (or be an
SQLite database with no tables at all); otherwise
:class:`~jianmu_fast.errors.StateStoreError` is raised and the file is left as it was.

Every SQLite failure, at any call, is a :class:`~jianmu_fast.errors.StateStoreError` that
names the file, the operation, SQLite's message and what it means (a corrupted file, a
read-only file or directory, a lock held too long, ...); the ``sqlite3`` error is chained.
A write that fails is rolled back whole (the store is exactly as it was) and the
per-process cache is dropped, so the next read comes from the file.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import stat
from typing import Any, Callable, Optional, TypeVar
from urllib.parse import quote

from ..errors import StateStoreError
from ..message.model import Message
from ._codec import decode_message, decode_value, encode_message, encode_value
from .manager import _MISSING, _check_evict, _is_message_list

__all__ = ["SQLiteBackend", "APPLICATION_ID", "SCHEMA_VERSION", "store_error"]

APPLICATION_ID = 0x4A4D4653
SCHEMA_VERSION = 1
_HEADER = b"SQLite format 3\x00"
_SYNC = ("FULL", "NORMAL", "EXTRA")
_F = TypeVar("_F", bound=Callable[..., Any])

#: (part of SQLite's message, what it means for the user), first match wins
_CAUSES = (
    ("malformed", "the file is corrupted; restore it from a backup, or use a new path"),
    ("not a database", "the file is not an SQLite database, or is corrupted"),
    ("readonly", "the database is read-only: check the permissions of the file and of its directory "
                 "(SQLite writes -wal/-shm files beside it), or open it read_only=True to read"),
    ("unable to open", "SQLite cannot open the file or create its -wal/-shm files beside it: "
                       "check that the file and its directory exist and are writable"),
    ("locked", "another connection held the lock longer than the timeout; retry, or raise timeout="),
    ("busy", "another connection held the lock longer than the timeout; retry, or raise timeout="),
    ("disk i/o", "an I/O error reading or writing the file or its -wal/-shm files"),
    ("full", "the disk is full"),
)


def store_error(path: Optional[str], op: str, exc: BaseException) -> StateStoreError:
    """The :class:`StateStoreError` for an ``sqlite3`` error ``exc`` raised by ``op``.

    >>> str(store_error("/s.db", "reading", sqlite3.DatabaseError("database disk image is malformed")))
    '/s.db: reading failed: database disk image is malformed (the file is corrupted; restore it from a backup, or use a new path)'
    """
    text = str(exc) or type(exc).__name__
    low = text.lower()
    hint = next((h for needle, h in _CAUSES if needle in low), None)
    return StateStoreError(f"{path}: {op} failed: {text}" + (f" ({hint})" if hint else ""))


def _guarded(op: str) -> Callable[[_F], _F]:
    """Turn an ``sqlite3.Error`` of the wrapped backend method into a StateStoreError."""

    def deco(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(self: "SQLiteBackend", *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except sqlite3.Error as exc:
                self._cache.clear()
                raise store_error(self.path, op, exc) from exc

        return wrapper  # type: ignore[return-value]

    return deco

_SCHEMA = """
CREATE TABLE state_values (
    key TEXT PRIMARY KEY NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('value', 'messages')),
    value TEXT,
    head_seq INTEGER NOT NULL DEFAULT 0,
    next_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE state_messages (
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (key, seq)
) WITHOUT ROWID;
"""


class _Cache:
    __slots__ = ("head", "msgs")

    def __init__(self, head: int, msgs: list[Message]) -> None:
        self.head = head
        self.msgs = msgs

    @property
    def next(self) -> int:
        return self.head + len(self.msgs)


def _check_file(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateStoreError(f"{path}: cannot be opened ({exc.strerror or exc})") from exc
    if stat.S_ISDIR(st.st_mode):
        raise StateStoreError(f"{path}: is a directory, not a state database file; pass a file path")
    if not stat.S_ISREG(st.st_mode):
        kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise StateStoreError(
            f"{path}: is {kind}, not a state database file; pass the path of a regular file (or a new path)"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateStoreError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if head and head != _HEADER:
        raise StateStoreError(
            f"{path}: is not a jianmu_fast state database (not an SQLite file); it was left untouched. "
            "Pass the path of a state database, or a new path to create one."
        )


class SQLiteBackend:
    """One SQLite connection; the owning StateManager serializes calls with its lock."""

    name = "sqlite"

    def __init__(self, path: Any, *, timeout: float = 30.0, synchronous: str = "FULL", read_only: bool = False) -> None:
        self.path: Optional[str] = os.fspath(path)
        sync = str(synchronous).upper()
        if sync not in _SYNC:
            raise ValueError(f"synchronous must be one of {_SYNC}, got {synchronous!r}")
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only: expected a bool, got {type(read_only).__name__}")
        self.read_only = read_only
        self._timeout = timeout
        self._sync_mode = sync
        self._closed = False
        self._cache: dict[str, _Cache] = {}
        _check_file(self.path)
        try:
            if read_only:
                uri = "file:" + quote(os.path.abspath(self.path)) + "?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False)
            else:
                self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise store_error(self.path, "opening", exc) from exc
        try:
            self._open_schema()
            if not read_only:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute(f"PRAGMA synchronous={sync}")
        except StateStoreError:
            self._conn.close()
            raise
        except sqlite3.Error as exc:
            self._conn.close()
            low = str(exc).lower()
            if "not a database" in low or "malformed" in low:
                raise StateStoreError(
                    f"{self.path}: is not a valid jianmu_fast state database ({exc}); it was left untouched."
                ) from exc
            raise store_error(self.path, "opening", exc) from exc

    def __getstate__(self) -> dict[str, Any]:
        """Pickled by path: the copy reopens the file (the database is shared, the cache is not)."""
        return {"path": self.path, "timeout": self._timeout, "synchronous": self._sync_mode,
                "read_only": self.read_only, "closed": self._closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["closed"]:
            self.path, self.read_only, self._timeout, self._sync_mode = (
                state["path"], state["read_only"], state["timeout"], state["synchronous"])
            self._closed, self._cache = True, {}
            return
        self.__init__(state["path"], timeout=state["timeout"], synchronous=state["synchronous"],  # type: ignore[misc]
                      read_only=state["read_only"])

    def _open_schema(self) -> None:
        c = self._conn
        app = c.execute("PRAGMA application_id").fetchone()[0]
        if app == 0 and self.read_only:
            raise StateStoreError(
                f"{self.path}: is not a jianmu_fast state database (no state marker), and read_only=True "
                "cannot create one; open it without read_only, or pass the path of a state database."
            )
        if app == 0:
            c.execute("BEGIN IMMEDIATE")
            try:
                app = c.execute("PRAGMA application_id").fetchone()[0]
                n_tables = c.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if app == 0 and n_tables == 0:
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            c.execute(stmt)
                    c.execute(f"PRAGMA application_id={APPLICATION_ID}")
                    c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                c.execute("COMMIT")
            except BaseException:
                _rollback(c)
                raise
            if app == 0 and n_tables:
                raise StateStoreError(
                    f"{self.path}: is an SQLite database of another application ({n_tables} schema object(s), "
                    "no jianmu_fast state marker); it was left untouched. Use a new path for the state database."
                )
        elif app != APPLICATION_ID:
            raise StateStoreError(
                f"{self.path}: is an SQLite database of another application (application_id={app:#x}, "
                f"expected {APPLICATION_ID:#x}); it was left untouched. Use a new path for the state database."
            )
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateStoreError(
                f"{self.path}: state schema version {version} is newer than this jianmu_fast supports "
                f"({SCHEMA_VERSION}); upgrade jianmu_fast to read it."
            )
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"state_values", "state_messages"} <= tables:
            raise StateStoreError(f"{self.path}: has the jianmu_fast marker but lacks its tables; the file is damaged.")

    # -- transactions -------------------------------------------------------------------------

    def _write(self, fn: Any, *args: Any) -> Any:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            out = fn(*args)
            c.execute("COMMIT")
        except BaseException:
            _rollback(c)
            self._cache.clear()  # tentative cache changes are gone; reload on the next read
            raise
        return out

    def _row(self, key: str) -> Optional[tuple[str, Optional[str], int, int]]:
        return self._conn.execute(
            "SELECT kind, value, head_seq, next_seq FROM state_values WHERE key=?", (key,)
        ).fetchone()

    def _decode_rows(self, key: str, rows: Any) -> list[Message]:
        out = []
        for seq, data in rows:
            try:
                out.append(decode_message(data))
            except ValueError as exc:
                raise StateStoreError(f"{self.path}: state[{key!r}] message seq {seq} is not a valid message: {exc}") from None
        return out

    def _sync(self, key: str, head: int, nxt: int) -> _Cache:
        """Bring the cache of ``key`` to rows ``[head, nxt)``, reading only unseen rows."""
        c = self._cache.get(key)
        if c is None or head > c.next or head < c.head or nxt < c.next:
            rows = self._conn.execute(
                "SELECT seq, data FROM state_messages WHERE key=? AND seq>=? AND seq<? ORDER BY seq", (key, head, nxt)
            ).fetchall()
            c = self._cache[key] = _Cache(head, self._decode_rows(key, rows))
        else:
            if head > c.head:
                del c.msgs[: head - c.head]
                c.head = head
            if nxt > c.next:
                rows = self._conn.execute(
                    "SELECT seq, data FROM state_messages WHERE key=? AND seq>=? AND seq<? ORDER BY seq", (key, c.next, nxt)
                ).fetchall()
                c.msgs.extend(self._decode_rows(key, rows))
        if c.next != nxt:
            raise StateStoreError(f"{self.path}: state[{key!r}] is missing message rows (expected seq {head}..{nxt - 1})")
        return c

    def _decode_value(self, key: str, text: Optional[str]) -> Any:
        try:
            return decode_value(text) if text is not None else None
        except ValueError as exc:
            raise StateStoreError(f"{self.path}: state[{key!r}] holds a value that cannot be decoded: {exc}") from None

    # -- operations ---------------------------------------------------------------------------

    @_guarded("reading")
    def get(self, key: str) -> Any:
        row = self._row(key)
        if row is None:
            return _MISSING
        kind, value, head, nxt = row
        if kind == "messages":
            return list(self._sync(key, head, nxt).msgs)
        return self._decode_value(key, value)

    @_guarded("writing")
    def set_many(self, items: list[tuple[str, Any]]) -> None:
        encoded: list[tuple[str, Any, Any]] = []
        for key, value in items:
            if _is_message_list(value):
                encoded.append((key, list(value), [encode_message(m, f"state[{key!r}][{i}]") for i, m in enumerate(value)]))
            else:
                encoded.append((key, None, encode_value(value, f"state[{key!r}]")))
        self._write(self._set_many, encoded)

    def _set_many(self, encoded: list[tuple[str, Any, Any]]) -> None:
        c = self._conn
        for key, msgs, data in encoded:
            row = self._row(key)
            nxt = row[3] if row is not None else 0
            c.execute("DELETE FROM state_messages WHERE key=?", (key,))
            if msgs is None:
                c.execute(
                    "INSERT INTO state_values (key, kind, value, head_seq, next_seq) VALUES (?, 'value', ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET kind='value', value=excluded.value",
                    (key, data, nxt, nxt),
                )
                self._cache.pop(key, None)
            else:
                c.executemany(
                    "INSERT INTO state_messages (key, seq, role, data) VALUES (?, ?, ?, ?)",
                    [(key, nxt + i, m.role, d) for i, (m, d) in enumerate(zip(msgs, data))],
                )
                end = nxt + len(msgs)
                c.execute(
                    "INSERT INTO state_values (key, kind, value, head_seq, next_seq) VALUES (?, 'messages', NULL, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET kind='messages', value=NULL, head_seq=?, next_seq=?",
                    (key, nxt, end, nxt, end),
                )
                self._cache[key] = _Cache(nxt, msgs)

    @_guarded("deleting")
    def delete(self, key: str) -> bool:
        def run() -> bool:
            self._conn.execute("DELETE FROM state_messages WHERE key=?", (key,))
            return self._conn.execute("DELETE FROM state_values WHERE key=?", (key,)).rowcount > 0

        self._cache.pop(key, None)
        return self._write(run)

    @_guarded("listing the keys")
    def keys(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT key FROM state_values ORDER BY rowid")]

    @_guarded("reading")
    def snapshot(self) -> dict[str, Any]:
        out = {}
        for key in self.keys():
            v = self.get(key)
            if v is not _MISSING:
                out[key] = v
        return out

    def _message_row(self, key: str) -> tuple[int, int]:
        """``(head, next)`` of the message list ``key``, converting an empty list value or
        creating the row (inside a write transaction)."""
        row = self._row(key)
        if row is None:
            self._conn.execute(
                "INSERT INTO state_values (key, kind, value, head_seq, next_seq) VALUES (?, 'messages', NULL, 0, 0)", (key,)
            )
            return 0, 0
        kind, value, head, nxt = row
        if kind == "value":
            v = self._decode_value(key, value)
            if not (isinstance(v, list) and len(v) == 0):
                raise TypeError(f"state[{key!r}] holds a {type(v).__name__}, not a message list")
            self._conn.execute("UPDATE state_values SET kind='messages', value=NULL, head_seq=? WHERE key=?", (nxt, key))
            return nxt, nxt
        return head, nxt

    @_guarded("appending messages")
    def append_messages(self, key: str, messages: list[Message], retention: Any) -> int:
        data = [encode_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        return self._write(self._append, key, messages, data, retention)

    def _append(self, key: str, messages: list[Message], data: list[str], retention: Any) -> int:
        c = self._conn
        head, nxt = self._message_row(key)
        cache = self._sync(key, head, nxt)
        c.executemany(
            "INSERT INTO state_messages (key, seq, role, data) VALUES (?, ?, ?, ?)",
            [(key, nxt + i, m.role, d) for i, (m, d) in enumerate(zip(messages, data))],
        )
        nxt += len(messages)
        cache.msgs.extend(messages)  # undone by _write's cache.clear() if the commit fails
        evicted = 0
        if retention is not None:
            evicted = _check_evict(retention.evict_count(cache.msgs), len(cache.msgs), retention)
        if evicted:
            c.execute("DELETE FROM state_messages WHERE key=? AND seq<?", (key, head + evicted))
            del cache.msgs[:evicted]
            head += evicted
            cache.head = head
        c.execute("UPDATE state_values SET head_seq=?, next_seq=? WHERE key=?", (head, nxt, key))
        return evicted

    @_guarded("reading messages")
    def get_messages(self, key: str) -> list[Message]:
        row = self._row(key)
        if row is None:
            return []
        kind, value, head, nxt = row
        if kind == "value":
            v = self._decode_value(key, value)
            if isinstance(v, list) and len(v) == 0:
                return []
            raise TypeError(f"state[{key!r}] holds a {type(v).__name__}, not a message list")
        return list(self._sync(key, head, nxt).msgs)

    @_guarded("clearing messages")
    def clear_messages(self, key: str) -> int:
        def run() -> int:
            row = self._row(key)
            if row is None:
                return 0
            head, nxt = self._message_row(key)
            self._conn.execute("DELETE FROM state_messages WHERE key=?", (key,))
            self._conn.execute("UPDATE state_values SET head_seq=? WHERE key=?", (nxt, key))
            self._cache[key] = _Cache(nxt, [])
            return nxt - head

        return self._write(run)

    def close(self) -> None:
        self._cache.clear()
        self._closed = True
        try:
            self._conn.close()
        except sqlite3.Error as exc:
            raise store_error(self.path, "closing", exc) from exc


def _rollback(c: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already done so."""
    try:
        if c.in_transaction:
            c.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # SQLite rolled back on its own (an I/O error, a full disk); nothing was committed
