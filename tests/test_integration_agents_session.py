"""``TrimmedSession`` over a real ``SQLiteSession``, driven by the Agents SDK's ``Runner`` and ``ScriptedModel``."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing may go to the network

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory import Session  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from jianmu_fast.integrations.openai_agents import TrimmedSession  # noqa: E402
from jianmu_fast.integrations.openai_responses import from_responses  # noqa: E402
from jianmu_fast.memory.context import (ContextBuilder, MaxMessagesFilter, StateHistoryProvider,  # noqa: E402
                                        StaticPromptProvider, TiktokenTokenCounter, TokenBudgetFilter)

set_tracing_disabled(True)


def run(coro):
    """Run ``coro`` on a loop of its own, leaving the thread's default loop alone (``Runner.run_sync``
    keeps that one open on purpose; ``asyncio.run`` would replace it and leak it)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()

COUNTER = TiktokenTokenCounter("o200k_base")
BUDGET = 800


@function_tool
def lookup(q: str) -> str:
    """Look something up in the archive and return every passage that mentions it."""
    return ("result for " + q + ". ") * 40


TOOLS = [{"type": "function", "function": {"name": lookup.name, "description": lookup.description,
                                           "parameters": lookup.params_json_schema}}]


def pairs_whole(items) -> bool:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    return sorted(calls) == sorted(outs) and len(set(calls)) == len(calls)


def from_store(history) -> list:
    """The items of ``history`` that came from the store (not a provider's system item or note)."""
    return [i for i in history if i.get("role") != "system"
            and not (i.get("role") == "assistant" and "self_tool_plan" in str(i.get("content")))]


async def run_turn(session, k: int) -> ScriptedModel:
    model = ScriptedModel([[function_call("lookup", {"q": f"q{k}"}, call_id=f"c{k}"),
                            function_call("lookup", {"q": f"r{k}"}, call_id=f"d{k}")],
                           [assistant_message(f"answer {k}")]])
    agent = Agent(name="researcher", instructions="You research.", model=model, tools=[lookup])
    result = await Runner.run(agent, f"question {k}", session=session, run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == f"answer {k}"
    return model


@pytest.mark.parametrize("kind", ["filters", "tools", "providers"])
def test_runner_starts_each_run_from_trimmed_history_and_stores_everything(tmp_path, kind):
    db = str(tmp_path / "conv.sqlite")
    tools = TOOLS if kind == "tools" else None
    if kind == "providers":
        builder = ContextBuilder(providers=[StaticPromptProvider("Cite sources."), StateHistoryProvider()],
                                 filters=[TokenBudgetFilter(BUDGET, COUNTER)])
    else:
        builder = ContextBuilder(filters=[TokenBudgetFilter(BUDGET, COUNTER)])
    inner = SQLiteSession("user-1", db)
    session = TrimmedSession(inner, builder, tools_schema=tools)
    assert isinstance(session, Session) and session.session_id == "user-1"
    run(converse(inner, session, kind, tools))
    inner.close()
    reader = SQLiteSession("user-1", db)  # a fresh reader of the same file
    everything = run(reader.get_items())
    reader.close()
    assert len(everything) == 6 * RUNS  # question, 2 calls, 2 outputs, answer: per run
    assert [i.get("content") for i in everything if i.get("role") == "user"] == [f"question {k}" for k in range(RUNS)]
    assert sum(1 for i in everything if i.get("type") == "function_call_output") == 2 * RUNS
    assert not any(i.get("role") == "system" for i in everything)  # provider output never stored
    assert COUNTER.count_messages(from_responses(everything)) > 2 * BUDGET  # the trimming was needed


RUNS = 4


async def converse(inner, session, kind, tools) -> None:
    trimmed = 0
    for k in range(RUNS):
        stored = await inner.get_items()
        model = await run_turn(session, k)
        first = model.calls[0].input
        assert first[-1] == {"role": "user", "content": f"question {k}"}  # the run's new input
        history = first[:-1]
        assert pairs_whole(history)
        assert COUNTER.count_messages(from_responses(history)) + COUNTER.count_tools(tools) <= BUDGET
        if kind == "tools":
            assert COUNTER.count_tools(tools) > 0
        kept = history
        if kind == "providers":  # StateHistoryProvider annotates copies: same roles and call ids
            assert history[0] == {"type": "message", "role": "system", "content": "Cite sources."}
            kept = from_store(history)
            assert [(i.get("role"), i.get("call_id")) for i in kept] == [
                (i.get("role"), i.get("call_id")) for i in stored[len(stored) - len(kept):]]
        else:
            assert kept == stored[len(stored) - len(kept):]  # a suffix of the stored items, unchanged
        if len(kept) < len(stored):
            trimmed += 1
        # within the run, the SDK appends the round's items to what the session gave it
        assert model.calls[1].input[:len(first)] == first
    assert trimmed >= 2


def test_limited_reads_pop_and_clear_reach_the_wrapped_session():
    run(limited_reads_pop_and_clear())


async def limited_reads_pop_and_clear() -> None:
    inner = SQLiteSession("s")
    session = TrimmedSession(inner, ContextBuilder(filters=[MaxMessagesFilter(3)]))
    items = [{"role": "user", "content": "a"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "x"},
             {"role": "user", "content": "b"}]
    await session.add_items(items)
    assert await inner.get_items() == items  # stored untouched
    assert await session.get_items() == items[1:]  # the call and its output are one unit (2 messages)
    assert await session.get_items(limit=2) == items[2:]  # a limited read is the raw tail
    assert await session.pop_item() == items[3]
    assert await session.get_items() == items[:3]
    await session.clear_session()
    assert await inner.get_items() == [] and await session.get_items() == []
    inner.close()


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="builder: expected a ContextBuilder"):
        TrimmedSession(SQLiteSession("s"), None)
    with pytest.raises(TypeError, match="session: expected an Agents SDK Session, list lacks get_items"):
        TrimmedSession([], ContextBuilder())
