"""StateManager: both backends, round trips, invalid files, the append path."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from jianmu_fast.errors import JianmuError, StateStoreError
from jianmu_fast.message import MaxCountRetention, Message, ai, human, tool
from jianmu_fast.state import StateManager


@pytest.fixture(params=["memory", "sqlite"])
def sm(request, tmp_path):
    m = StateManager() if request.param == "memory" else StateManager.sqlite(tmp_path / "state.db", synchronous="NORMAL")
    yield m
    m.close()


def _digest(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_get_set_update_delete_snapshot(sm):
    assert sm.get("x") is None and sm.get("x", 7) == 7 and "x" not in sm
    sm.set("x", {"a": [1, 2]})
    sm.update({"y": "why"}, z=3)
    assert sm.get("x") == {"a": [1, 2]} and sm["y"] == "why" and sm["z"] == 3
    assert sm.keys() == ["x", "y", "z"] and len(sm) == 3 and list(sm) == ["x", "y", "z"]
    snap = sm.snapshot()
    assert snap == {"x": {"a": [1, 2]}, "y": "why", "z": 3}
    snap["x"]["a"].append(3)
    assert sm.get("x") == {"a": [1, 2]}  # the snapshot is a copy
    assert sm.delete("y") is True and sm.delete("y") is False and "y" not in sm
    with pytest.raises(KeyError):
        sm["y"]
    with pytest.raises(TypeError, match="state keys must be strings"):
        sm.set(1, "x")


def test_messages_round_trip_with_id_metadata_and_set_fields(sm):
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": 1}'}}]
    ms = [
        human("hi", metadata={"who": "ada", "n": [1, {"k": None}]}),
        ai(None, tool_calls=calls),
        tool("4", tool_call_id="c1", metadata={"tool_result": {"value": 4}}),
        Message.from_openai({"role": "assistant", "content": "x", "refusal": None, "reasoning_content": "r"}),
    ]
    sm.append_messages("h", ms[:2])
    sm.append_messages("h", ms[2:])
    sm.set("last", {"m": ms[0], "pair": (1, 2)})
    back = sm.get_messages("h")
    assert back == ms and sm.get("h") == ms
    assert [m.id for m in back] == [m.id for m in ms]
    assert [m.to_openai() for m in back] == [m.to_openai() for m in ms]
    pair = (1, 2) if sm.backend == "memory" else [1, 2]  # SQLite stores JSON: a tuple comes back a list
    assert sm.get("last") == {"m": ms[0], "pair": pair}


def test_set_of_a_message_list_makes_an_appendable_list(sm):
    a, b, c = human("a"), human("b"), human("c")
    sm.set("h", [a, b])
    sm.append_messages("h", [c])
    assert sm.get_messages("h") == [a, b, c]
    sm.set("empty", [])
    sm.append_messages("empty", [a])
    assert sm.get("empty") == [a]
    sm.set("n", 5)
    with pytest.raises(TypeError, match=r"state\['n'\] holds a int, not a message list"):
        sm.append_messages("n", [a])
    assert sm.clear_messages("h") == 3 and sm.get_messages("h") == [] and sm.get_messages("nope") == []


def test_retention_runs_inside_the_append(sm):
    ms = [human(str(i)) for i in range(5)]
    assert sm.append_messages("h", ms[:3], retention=MaxCountRetention(2)) == 1
    assert sm.append_messages("h", ms[3:], retention=MaxCountRetention(2)) == 2
    assert [m.content for m in sm.get_messages("h")] == ["3", "4"]


def test_closed_manager_refuses_calls(sm):
    sm.close()
    with pytest.raises(ValueError, match="is closed"):
        sm.get("x")


def test_sqlite_persists_and_reopens(tmp_path):
    path = tmp_path / "s.db"
    m = human("kept", metadata={"k": 1})
    with StateManager.sqlite(path) as sm:
        sm.append_messages("h", [m])
        sm.set("n", 1)
    with StateManager.sqlite(path) as sm:
        assert sm.get_messages("h") == [m] and sm.get("n") == 1 and sm.backend == "sqlite"
        assert sm.path == str(path)


def test_sqlite_append_writes_only_the_new_rows(tmp_path):
    with StateManager.sqlite(tmp_path / "s.db", synchronous="NORMAL") as sm:
        sm.append_messages("h", [human(str(i)) for i in range(300)])
        conn = sm._backend._conn
        before = conn.total_changes
        sm.append_messages("h", [human("new")])
        assert conn.total_changes - before == 2  # one INSERT of the row, one UPDATE of next_seq
        first = sm.get_messages("h")
        assert sm.get_messages("h")[0] is first[0]  # decoded once, served from the cache


def test_sqlite_two_managers_on_one_file_see_each_others_writes(tmp_path):
    path = tmp_path / "s.db"
    with StateManager.sqlite(path, synchronous="NORMAL") as a, StateManager.sqlite(path, synchronous="NORMAL") as b:
        a.append_messages("h", [human("1")])
        assert [m.content for m in b.get_messages("h")] == ["1"]
        b.append_messages("h", [human("2"), human("3")], retention=MaxCountRetention(2))
        assert [m.content for m in a.get_messages("h")] == ["2", "3"]
        a.clear_messages("h")
        b.set("k", 1)
        assert b.get_messages("h") == [] and a.get("k") == 1


def test_sqlite_refuses_values_json_cannot_hold_and_writes_nothing(tmp_path):
    with StateManager.sqlite(tmp_path / "s.db") as sm:
        sm.set("x", 1)
        with pytest.raises(TypeError, match=r"state\['x'\]\['s'\]: a set cannot be stored as JSON"):
            sm.update({"x": {"s": {1}}, "y": 2})
        with pytest.raises(TypeError, match=r"state\['x'\]\[0\]: dict keys must be strings"):
            sm.set("x", [{1: "a"}])
        with pytest.raises(TypeError, match=r"messages\[0\]\['metadata'\]\['obj'\]: a object"):
            sm.append_messages("h", [human("a", metadata={"obj": object()})])
        assert sm.snapshot() == {"x": 1}


def test_invalid_files_are_a_clear_error_and_left_untouched(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (t TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    for path, pattern in [
        (junk, "is not a jianmu_fast state database \\(not an SQLite file\\)"),
        (other, "is an SQLite database of another application"),
    ]:
        digest = _digest(path)
        with pytest.raises(StateStoreError, match=pattern) as ei:
            StateManager.sqlite(path)
        assert str(path) in str(ei.value) and "left untouched" in str(ei.value)
        assert isinstance(ei.value, OSError) and isinstance(ei.value, JianmuError)
        assert _digest(path) == digest
    with pytest.raises(StateStoreError, match="is a directory"):
        StateManager.sqlite(tmp_path)


def test_newer_schema_and_damaged_marker_are_refused(tmp_path):
    path = tmp_path / "s.db"
    StateManager.sqlite(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()
    with pytest.raises(StateStoreError, match="schema version 99 is newer"):
        StateManager.sqlite(path)
    foreign = tmp_path / "f.db"
    conn = sqlite3.connect(foreign)
    conn.execute("PRAGMA application_id=1234")
    conn.commit()
    conn.close()
    with pytest.raises(StateStoreError, match="application_id=0x4d2"):
        StateManager.sqlite(foreign)


def test_empty_file_and_empty_sqlite_database_are_initialized(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.db"
    sqlite3.connect(blank).close()
    for path in (empty, blank):
        with StateManager.sqlite(path) as sm:
            sm.set("a", 1)
        with StateManager.sqlite(path) as sm:
            assert sm.get("a") == 1


def test_corrupt_message_row_names_key_and_seq(tmp_path):
    path = tmp_path / "s.db"
    with StateManager.sqlite(path) as sm:
        sm.append_messages("h", [human("a")])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE state_messages SET data='{\"role\": \"robot\"}'")
    conn.commit()
    conn.close()
    with StateManager.sqlite(path) as sm, pytest.raises(StateStoreError, match=r"state\['h'\] message seq 0"):
        sm.get_messages("h")


def test_sqlite_rejects_bad_synchronous(tmp_path):
    with pytest.raises(ValueError, match="synchronous must be one of"):
        StateManager.sqlite(tmp_path / "s.db", synchronous="OFF")


# -- item 11 of issue 12: every SQLite failure is a StateStoreError naming the path and cause ---

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _history(path, n=300):
    from jianmu_fast.message import StateMessageStore

    with StateManager.sqlite(path) as sm:
        StateMessageStore(sm).extend([human(f"message {i} " + "x" * 400) for i in range(n)])


def _corrupt_middle(path):
    size = os.path.getsize(path)
    assert size > 16 * 4096, size  # many pages: the header page stays intact
    with open(path, "r+b") as f:
        f.seek(4 * 4096)
        f.write(b"\xa5\x5a" * ((size - 6 * 4096) // 2))


def test_corrupted_page_is_a_store_error_naming_path_and_cause(tmp_path):
    from jianmu_fast.message import StateMessageStore

    path = tmp_path / "state.db"
    _history(path)
    _corrupt_middle(path)
    with pytest.raises(StateStoreError) as ei:
        with StateManager.sqlite(path) as sm:
            StateMessageStore(sm).list()
    msg = str(ei.value)
    assert msg.startswith(f"{path}:") and "malformed" in msg and "corrupted" in msg
    assert isinstance(ei.value.__cause__, sqlite3.DatabaseError)


def test_read_only_database_append_is_a_store_error_and_changes_nothing(tmp_path):
    from jianmu_fast.message import StateMessageStore

    path = tmp_path / "state.db"
    _history(path, n=5)
    digest = _digest(path)
    with StateManager.sqlite(path, read_only=True) as sm:
        store = StateMessageStore(sm)
        before = store.list()
        for write in (lambda: store.append(human("new")), lambda: store.extend([human("a"), ai("b")]),
                      store.clear, lambda: sm.set("k", 1), lambda: sm.delete("messages")):
            with pytest.raises(StateStoreError) as ei:
                write()
            assert str(ei.value).startswith(f"{path}:") and "read-only" in str(ei.value)
            assert store.list() == before  # the failed write left the store as it was
    assert _digest(path) == digest
    with StateManager.sqlite(path) as sm:
        assert [m.content for m in StateMessageStore(sm).list()] == [m.content for m in before]


@pytest.mark.skipif(ROOT, reason="root ignores file permissions; read_only=True covers the same SQLite error")
def test_read_only_file_append_is_a_store_error(tmp_path):
    from jianmu_fast.message import StateMessageStore

    path = tmp_path / "state.db"
    _history(path, n=5)
    os.chmod(path, 0o444)
    with StateManager.sqlite(path) as sm:
        store = StateMessageStore(sm)
        before = store.list()
        with pytest.raises(StateStoreError, match="read-only"):
            store.append(human("new"))
        assert store.list() == before


@pytest.mark.skipif(ROOT, reason="root ignores directory permissions; the -shm test below covers the cause")
def test_valid_database_in_read_only_directory_is_not_called_invalid(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    path = d / "state.db"
    _history(path, n=5)
    os.chmod(d, 0o555)
    try:
        with pytest.raises(StateStoreError) as ei:
            with StateManager.sqlite(path) as sm:
                sm.append_messages("messages", [human("new")])
        assert "not a valid" not in str(ei.value) and str(ei.value).startswith(f"{path}:")
    finally:
        os.chmod(d, 0o755)


def test_valid_database_whose_wal_files_cannot_be_created_is_not_called_invalid(tmp_path):
    path = tmp_path / "state.db"
    _history(path, n=5)
    (tmp_path / "state.db-wal").mkdir()  # SQLite cannot create its WAL file, as in a read-only directory
    digest = _digest(path)
    with pytest.raises(StateStoreError) as ei:
        with StateManager.sqlite(path) as sm:
            sm.get_messages("messages")
    msg = str(ei.value)
    assert msg.startswith(f"{path}:") and "not a valid" not in msg and "-wal/-shm" in msg
    assert _digest(path) == digest


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/zero"])
def test_device_path_is_a_store_error(dev):
    if not os.path.exists(dev):
        pytest.skip(f"{dev} does not exist here")
    with pytest.raises(StateStoreError, match=rf"^{dev}: is a device, not a state database file"):
        StateManager.sqlite(dev)


def test_read_only_refuses_to_create(tmp_path):
    with pytest.raises(StateStoreError, match="unable to open") as ei:
        StateManager.sqlite(tmp_path / "new.db", read_only=True)
    assert str(ei.value).startswith(f"{tmp_path / 'new.db'}:")
    assert not (tmp_path / "new.db").exists()
    with pytest.raises(TypeError, match="read_only"):
        StateManager.sqlite(tmp_path / "x.db", read_only="yes")


def test_failed_commit_rolls_back_and_the_next_read_is_from_the_file(tmp_path):
    """A retention policy that fails inside the append: the transaction is rolled back, the
    cache dropped, and the store reads as before (on the same and on a new connection)."""

    class Boom:
        def evict_count(self, messages):
            raise RuntimeError("boom")

    path = tmp_path / "state.db"
    with StateManager.sqlite(path) as sm:
        sm.append_messages("h", [human("a")])
        with pytest.raises(RuntimeError, match="boom"):
            sm.append_messages("h", [human("b"), human("c")], retention=Boom())
        assert [m.content for m in sm.get_messages("h")] == ["a"]
    with StateManager.sqlite(path) as sm:
        assert [m.content for m in sm.get_messages("h")] == ["a"]
