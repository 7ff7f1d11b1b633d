"""Builders, providers and stores pickle (issue 12 item 12): locks are recreated, an SQLite
connection is reopened by path, and ``build_batch(..., workers=2)`` works under ``spawn`` and
``forkserver`` (the default start method from Python 3.14)."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

import jianmu_fast.batch as batch
from jianmu_fast.batch import build_batch
from jianmu_fast.memory.context import PromptRuntimeContext, StateHistoryProvider, TiktokenTokenCounter
from jianmu_fast.memory.context.presets import for_chat, for_react, for_skill
from jianmu_fast.message import MaxCountRetention, StateMessageStore, ai, human, tool
from jianmu_fast.skills import Skill
from jianmu_fast.state import StateManager

pytestmark = pytest.mark.usefixtures("config_sandbox")

CALL = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 2}'}}]


def _history(i: int) -> list:
    return [human(f"question {i} " + "word " * (i % 40)), ai("Let me compute.", tool_calls=CALL),
            tool(f"{i}", tool_call_id="c1"), ai(f"answer {i}"), human(f"follow-up {i}")]


def _states(n: int) -> list[dict]:
    return [{"messages": _history(i)} for i in range(n)]


def _dump(prompts) -> list:
    return [[m.to_openai() for m in p] for p in prompts]


def _builders(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("Be brief.")
    rp = PromptRuntimeContext(workspace_dir=str(ws), include_bootstrap_files=True)
    counter = TiktokenTokenCounter("cl100k_base")
    skills = [Skill("greet", "Say hello.", "Be warm.", always=True)]
    return {
        "chat": for_chat("You help.", max_tokens=120, token_counter=counter),
        "react": for_react("You act.", max_messages=4, tools_desc="- calc: adds", runtime_prompt=rp),
        "skill": for_skill("You skill.", max_tokens=900, token_counter=counter, skill_set=skills, runtime_prompt=rp),
    }


@pytest.mark.parametrize("name", ["chat", "react", "skill"])
def test_presets_pickle_and_build_the_same(tmp_path, name):
    builder = _builders(tmp_path)[name]
    states = _states(5)
    before = _dump(builder.build(s) for s in states)  # warm caches travel (or not) without harm
    copy = pickle.loads(pickle.dumps(builder))
    assert _dump(copy.build(s) for s in states) == before
    assert _dump(pickle.loads(pickle.dumps(copy)).build(s) for s in states) == before


def test_state_history_provider_pickles_without_its_caches():
    p = StateHistoryProvider("messages")
    state = {"messages": _history(3)}
    out = p.get_messages(state)
    assert p.cache_info().size > 0
    q = pickle.loads(pickle.dumps(p))
    assert q.cache_info().size == 0 and q.messages_key == "messages"
    assert [m.to_openai() for m in q.get_messages(state)] == [m.to_openai() for m in out]
    assert q.cache_info().annotated > 0  # the copy filled its own, new caches
    assert [m.to_openai() for m in q.get_messages(state)] == [m.to_openai() for m in out]  # lock reusable


def test_memory_store_pickles_as_a_copy():
    store = StateMessageStore(max_messages=3)
    store.extend([human("a"), ai("b")])
    copy = pickle.loads(pickle.dumps(store))
    assert [m.content for m in copy.list()] == ["a", "b"] and isinstance(copy.retention, MaxCountRetention)
    copy.append(human("c"))  # the recreated lock works; a memory store is a copy
    assert len(store) == 2 and len(copy) == 3


def test_sqlite_store_reopens_by_path_and_shares_the_file(tmp_path):
    path = tmp_path / "state.db"
    sm = StateManager.sqlite(path, synchronous="NORMAL")
    store = StateMessageStore(sm, key="h")
    store.append(human("one"))
    copy = pickle.loads(pickle.dumps(store))
    assert copy.state_manager.path == str(path) and copy.state_manager.backend == "sqlite"
    copy.append(human("two"))  # through its own connection
    assert [m.content for m in store.list()] == ["one", "two"]
    copy.state_manager.close()
    sm.close()
    closed = pickle.loads(pickle.dumps(sm))
    with pytest.raises(ValueError, match="is closed"):
        closed.get("h")


def test_builder_with_a_store_in_its_state_pickles(tmp_path):
    sm = StateManager.sqlite(tmp_path / "s.db")
    store = StateMessageStore(sm)
    store.extend(_history(1))
    builder = for_chat("You help.", max_messages=3)
    state = {"messages": store}
    before = _dump([builder.build(state)])
    b2, s2 = pickle.loads(pickle.dumps((builder, state)))
    assert _dump([b2.build(s2)]) == before
    s2["messages"].state_manager.close()
    sm.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_build_batch_with_workers_under_spawn_and_forkserver(tmp_path, monkeypatch, method):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"start method {method!r} is not available on this platform")
    used: list[str] = []

    def ctx():
        used.append(method)
        return multiprocessing.get_context(method)

    monkeypatch.setattr(batch, "_mp_context", ctx)
    builders = _builders(tmp_path)
    states = _states(12)
    for name in ("chat", "skill"):
        builder = builders[name]
        expected = _dump(builder.build(s) for s in states)
        assert _dump(build_batch(builder, states, workers=2)) == expected
    assert used == [method, method]  # the pool really ran with this start method
