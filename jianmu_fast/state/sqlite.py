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

Opening checks before writing anything: a non-empty file must start with the SQLite header
and carry our application id (or be an SQLite database with no tables at all); otherwise
:class:`~jianmu_fast.errors.StateStoreError` is raised and the file is left as it was.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Optional

from ..errors import StateStoreError
from ..message.model import Message
from ._codec import decode_message, decode_value, encode_message, encode_value
from .manager import _MISSING, _check_evict, _is_message_list

__all__ = ["SQLiteBackend", "APPLICATION_ID", "SCHEMA_VERSION"]

APPLICATION_ID = 0x4A4D4653
SCHEMA_VERSION = 1
_HEADER = b"SQLite format 3\x00"
_SYNC = ("FULL", "NORMAL", "EXTRA")

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
    if os.path.isdir(path):
        raise StateStoreError(f"{path}: is a directory, not a state database file; pass a file path")
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

    def __init__(self, path: Any, *, timeout: float = 30.0, synchronous: str = "FULL") -> None:
        self.path: Optional[str] = os.fspath(path)
        sync = str(synchronous).upper()
        if sync not in _SYNC:
            raise ValueError(f"synchronous must be one of {_SYNC}, got {synchronous!r}")
        _check_file(self.path)
        try:
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateStoreError(f"{self.path}: cannot open as an SQLite database ({exc})") from exc
        try:
            self._open_schema()
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={sync}")
        except StateStoreError:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StateStoreError(
                f"{self.path}: is not a valid jianmu_fast state database ({exc}); it was left untouched."
            ) from exc
        self._cache: dict[str, _Cache] = {}

    def _open_schema(self) -> None:
        c = self._conn
        app = c.execute("PRAGMA application_id").fetchone()[0]
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
                c.execute("ROLLBACK")
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
            if c.in_transaction:
                c.execute("ROLLBACK")
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

    def get(self, key: str) -> Any:
        row = self._row(key)
        if row is None:
            return _MISSING
        kind, value, head, nxt = row
        if kind == "messages":
            return list(self._sync(key, head, nxt).msgs)
        return self._decode_value(key, value)

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

    def delete(self, key: str) -> bool:
        def run() -> bool:
            self._conn.execute("DELETE FROM state_messages WHERE key=?", (key,))
            return self._conn.execute("DELETE FROM state_values WHERE key=?", (key,)).rowcount > 0

        self._cache.pop(key, None)
        return self._write(run)

    def keys(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT key FROM state_values ORDER BY rowid")]

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
        self._conn.close()
