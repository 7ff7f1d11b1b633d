"""StateMessageStore: coercers, retention, events, threads, and a writer killed mid-append."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.message import (
    LenientMessageCoercer,
    MaxCountRetention,
    Message,
    MessageEvent,
    StateMessageStore,
    StrictMessageCoercer,
    ai,
    human,
    tool,
)
from jianmu_fast.state import StateManager

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))


@pytest.fixture(params=["memory", "sqlite"])
def state(request, tmp_path):
    m = StateManager() if request.param == "memory" else StateManager.sqlite(tmp_path / "s.db", synchronous="NORMAL")
    yield m
    m.close()


def call(cid, name="f"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


# -- coercion -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ({"role": "robot", "content": "x"}, r"^messages\[2\]\.role: Input should be"),
        ("just text", r"^messages\[2\]: expected a Message or a chat-completions dict, got str"),
        ({"content": "x"}, r"^messages\[2\]\.role: field required"),
        ({"role": "user", "content": "x", "metadata": {}}, r"^messages\[2\]\.metadata: not a chat-completions key"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": ""}}]},
         r"^messages\[2\]\.tool_calls: tool_calls\[0\]\.function\.name must be a non-empty string"),
    ],
)
def test_strict_extend_names_index_and_field_and_stores_nothing(state, bad, pattern):
    store = StateMessageStore(state)
    events = []
    store.subscribe(events.append)
    store.append(human("before"))
    with pytest.raises(MessageValidationError, match=pattern):
        store.extend([human("ok"), {"role": "user", "content": "fine"}, bad, human("after")])
    assert [m.content for m in store.list()] == ["before"]
    assert [e.kind for e in events] == ["append"]
    with pytest.raises(MessageValidationError, match=r"^message: expected a Message"):
        store.append(42)
    with pytest.raises(MessageValidationError, match="expected a list of messages, got dict"):
        store.extend({"role": "user", "content": "x"})


def test_strict_accepts_provider_specific_keys_into_extra():
    m = StrictMessageCoercer().coerce({"role": "assistant", "content": "x", "refusal": None}, "m")
    assert m.extra == {"refusal": None} and m.to_openai() == {"role": "assistant", "content": "x", "refusal": None}


def test_lenient_rules():
    c = LenientMessageCoercer()
    msg = human("kept")
    assert c.coerce(msg, "m") is msg
    assert (c.coerce("hello", "m").role, c.coerce("hello", "m").content) == ("user", "hello")
    d = c.coerce({"role": "human", "content": "x", "id": "abc", "metadata": {"k": 1}, "vendor": 2}, "m")
    assert (d.role, d.id, d.metadata, d.extra) == ("user", "abc", {"k": 1}, {"vendor": 2})
    dumped = ai("y", metadata={"q": 1}).model_dump()
    assert c.coerce(dumped, "m") == Message(**dumped)
    obj = SimpleNamespace(role="ai", content="from obj", tool_calls=None, name="bot", other="ignored")
    o = c.coerce(obj, "m")
    assert (o.role, o.content, o.name) == ("assistant", "from obj", "bot")
    with pytest.raises(MessageValidationError, match=r"^messages\[4\]: cannot make a Message from int"):
        c.coerce(3, "messages[4]")
    with pytest.raises(MessageValidationError, match=r"^messages\[1\]\.role"):
        c.coerce(SimpleNamespace(role="robot", content="x"), "messages[1]")
    with pytest.raises(MessageValidationError, match=r"^m\.extra: expected a dict"):
        c.coerce({"role": "user", "content": "x", "extra": 5}, "m")


def test_store_with_lenient_coercer_takes_strings(state):
    store = StateMessageStore(state, coercer=LenientMessageCoercer())
    store.extend(["a", {"role": "ai", "content": "b"}])
    assert [(m.role, m.content) for m in store.list()] == [("user", "a"), ("assistant", "b")]


# -- retention ------------------------------------------------------------------------------


def test_max_messages_keeps_the_newest_and_never_leaves_an_orphan_result(state):
    store = StateMessageStore(state, key="h", max_messages=3)
    store.extend([human("q"), ai(None, tool_calls=[call("c1"), call("c2")]),
                  tool("1", tool_call_id="c1"), tool("2", tool_call_id="c2"), ai("done")])
    # the newest 3 would start with the result of c2, whose call is gone: it is evicted too
    assert [m.content for m in store.list()] == ["done"]
    store.extend([human("a"), human("b"), human("c")])
    assert [m.content for m in store.list()] == ["a", "b", "c"]


def test_newest_transaction_longer_than_the_limit_is_kept_whole(state):
    store = StateMessageStore(state, retention=MaxCountRetention(2))
    store.append(human("q"))
    store.append(ai(None, tool_calls=[call("c1"), call("c2"), call("c3")]))
    for i in (1, 2, 3):
        store.append(tool(str(i), tool_call_id=f"c{i}"))
    assert [m.role for m in store.list()] == ["assistant", "tool", "tool", "tool"]
    store.append(ai("ok"))
    store.append(human("next"))
    assert [m.content for m in store.list()] == ["ok", "next"]


def test_retention_arguments_are_checked():
    with pytest.raises(ValueError, match="not both"):
        StateMessageStore(retention=MaxCountRetention(2), max_messages=2)
    with pytest.raises(ValueError, match="positive int"):
        MaxCountRetention(0)
    with pytest.raises(TypeError, match="evict_count"):
        StateMessageStore(retention=5)


# -- events ---------------------------------------------------------------------------------


def test_events_after_each_write_and_failing_subscriber_is_logged(state, caplog):
    store = StateMessageStore(state, key="k", max_messages=2)
    got, other = [], []

    def boom(ev):
        raise RuntimeError("subscriber bug")

    store.subscribe(got.append)
    store.subscribe(boom)
    unsub = store.subscribe(other.append)
    a = store.append(human("a"))
    bc = store.extend([human("b"), human("c")])
    store.clear()
    unsub()
    store.append(human("d"))
    assert got == [
        MessageEvent("append", (a,), "k", 1, 0),
        MessageEvent("extend", tuple(bc), "k", 2, 1),
        MessageEvent("clear", (), "k", 3, 2),
        MessageEvent("append", (store.list()[0],), "k", 4, 0),
    ]
    assert [e.seq for e in other] == [1, 2, 3]
    fails = [r for r in caplog.records if "subscriber" in r.getMessage()]
    assert len(fails) == 4 and fails[0].levelno == logging.ERROR and "the write is kept" in fails[0].getMessage()


def test_subscriber_may_read_the_store_from_its_callback(state):
    store = StateMessageStore(state)
    seen = []
    store.subscribe(lambda ev: seen.append(len(store.list())))
    store.append(human("a"))
    store.append(human("b"))
    assert seen == [1, 2]


# -- reliability ----------------------------------------------------------------------------

THREADS, PER_THREAD = 8, 2000


def test_threads_lose_nothing_keep_order_and_get_one_event_per_append(state):
    store = StateMessageStore(state, key="t")
    events = []
    store.subscribe(events.append)
    start = threading.Barrier(THREADS)

    def writer(t):
        start.wait()
        for i in range(PER_THREAD):
            store.append(Message(role="user", content=f"{t}:{i}"))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stored = store.list()
    assert len(stored) == THREADS * PER_THREAD
    for t in range(THREADS):
        mine = [m.content for m in stored if m.content.startswith(f"{t}:")]
        assert mine == [f"{t}:{i}" for i in range(PER_THREAD)]
    assert len(events) == THREADS * PER_THREAD
    by_seq = sorted(events, key=lambda e: e.seq)
    assert [e.seq for e in by_seq] == list(range(1, THREADS * PER_THREAD + 1))
    assert [e.messages[0].id for e in by_seq] == [m.id for m in stored]  # seq order is write order


_CHILD = textwrap.dedent(
    """
    import sys
    from jianmu_fast.message import StateMessageStore, human
    from jianmu_fast.state import StateManager
    store = StateMessageStore(StateManager.sqlite(sys.argv[1]), key="log")
    i = 0
    while True:
        store.append(human(f"m{i}"))
        sys.stdout.write(f"ack {i}\\n")
        sys.stdout.flush()
        i += 1
    """
)


@pytest.mark.parametrize("acks", [1, 37])
def test_sigkilled_writer_keeps_every_acknowledged_append(tmp_path, acks):
    path = str(tmp_path / "crash.db")
    StateMessageStore(StateManager.sqlite(path), key="log").extend([human("before")])
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, text=True)
    try:
        for i in range(acks):
            assert proc.stdout.readline() == f"ack {i}\n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with StateManager.sqlite(path) as sm:
        got = [m.content for m in StateMessageStore(sm, key="log").list()]
    assert got[: acks + 1] == ["before"] + [f"m{i}" for i in range(acks)]
    assert got == ["before"] + [f"m{i}" for i in range(len(got) - 1)]  # nothing after a gap
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


# -- retention, fuzzed ----------------------------------------------------------------------


def _units(k_calls: int, tag: int) -> list[Message]:
    if k_calls == 0:
        return [human(f"u{tag}")]
    a = ai(None, tool_calls=[call(f"c{tag}_{i}") for i in range(k_calls)])
    return [a] + [tool(str(i), tool_call_id=f"c{tag}_{i}") for i in range(k_calls)]


@given(
    n=st.integers(1, 6),
    plan=st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=14),
    backend=st.sampled_from(["memory", "memory", "sqlite"]),
)
@settings(deadline=None, max_examples=max(10, MAX_EXAMPLES // 3))
def test_max_count_retention_invariants(tmp_path_factory, n, plan, backend):
    sm = StateManager() if backend == "memory" else StateManager.sqlite(
        tmp_path_factory.mktemp("r") / "s.db", synchronous="NORMAL")
    store = StateMessageStore(sm, max_messages=n)
    appended: list[Message] = []
    try:
        for tag, (k_calls, one_by_one) in enumerate(plan):
            unit = _units(k_calls, tag)
            if one_by_one:
                for m in unit:
                    store.append(m)
                    appended.append(m)
                    _check_retention(store.list(), appended, n)
            else:
                store.extend(unit)
                appended.extend(unit)
                _check_retention(store.list(), appended, n)
    finally:
        sm.close()


def _check_retention(stored, appended, n):
    ids = [m.id for m in stored]
    assert ids == [m.id for m in appended[len(appended) - len(stored):]]  # a suffix, order kept
    if not stored:
        return
    assert stored[0].role != "tool"  # never an orphan result at the head
    if len(stored) > n:  # only the newest transaction, kept whole
        assert stored[0].tool_calls and all(m.role == "tool" for m in stored[1:])
    evicted = appended[: len(appended) - len(stored)]
    if evicted and len(stored) < n:  # the unit just before would not have fit
        i = len(evicted) - 1
        while i > 0 and evicted[i].role == "tool":
            i -= 1
        assert len(stored) + len(evicted) - i > n
