"""The Agents SDK's ``Runner`` with our ``call_model_input_filter`` and the SDK's scripted model."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing may go to the network

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from jianmu_fast.integrations.openai_agents import call_model_input_filter, trim_items  # noqa: E402
from jianmu_fast.integrations.openai_responses import from_responses  # noqa: E402
from jianmu_fast.memory.context import (ContextBuilder, StaticPromptProvider, StateHistoryProvider,  # noqa: E402
                                        TiktokenTokenCounter, TokenBudgetFilter)

set_tracing_disabled(True)
COUNTER = TiktokenTokenCounter("o200k_base")
BUDGET = 600


@function_tool
def lookup(q: str) -> str:
    """Look something up."""
    return ("result for " + q + ". ") * 40


def script(rounds: int) -> list:
    steps = [[function_call("lookup", {"q": f"q{i}"}, call_id=f"c{i}"),
              function_call("lookup", {"q": f"r{i}"}, call_id=f"d{i}")] for i in range(rounds)]
    return steps + [[assistant_message("done")]]


def pairs_whole(items) -> bool:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    return sorted(calls) == sorted(outs) and len(set(calls)) == len(calls)


def run(builder, rounds):
    model = ScriptedModel(script(rounds))
    agent = Agent(name="researcher", instructions="You research.", model=model, tools=[lookup])
    # asyncio.run, not Runner.run_sync: run_sync leaves the thread's default event loop open on
    # purpose, and a later asyncio.run elsewhere in the suite then warns (ResourceWarning) about it
    result = asyncio.run(Runner.run(agent, "research this", max_turns=rounds + 2,
                                    run_config=RunConfig(call_model_input_filter=call_model_input_filter(builder),
                                                         tracing_disabled=True)))
    return model, result


@pytest.mark.parametrize("with_providers", [False, True])
def test_runner_sends_trimmed_valid_input(with_providers):
    rounds = 4
    filters = [TokenBudgetFilter(BUDGET, COUNTER)]
    builder = (ContextBuilder(providers=[StaticPromptProvider("Cite sources."), StateHistoryProvider()],
                              filters=filters) if with_providers else ContextBuilder(filters=filters))
    model, result = run(builder, rounds)
    assert result.final_output == "done"
    assert len(model.calls) == rounds + 1
    history = result.to_input_list()  # the run's own history is whole
    assert sum(1 for i in history if i.get("type") == "function_call_output") == 2 * rounds
    for call in model.calls:
        assert call.system_instructions == "You research."  # instructions untouched
        items = call.input
        assert pairs_whole(items)
        assert COUNTER.count_messages(from_responses(items)) <= BUDGET
        if with_providers:
            assert items[0] == {"type": "message", "role": "system", "content": "Cite sources."}
    assert len(model.calls[-1].input) < len(history)  # it did trim
    assert [i for i in model.calls[-1].input if i.get("type") == "function_call_output"] == [
        i for i in history if i.get("type") == "function_call_output"][-len(
            [i for i in model.calls[-1].input if i.get("type") == "function_call_output"]):]


def test_without_filter_the_input_grows_unbounded():
    model = ScriptedModel(script(4))
    agent = Agent(name="researcher", instructions="You research.", model=model, tools=[lookup])
    asyncio.run(Runner.run(agent, "research this", run_config=RunConfig(tracing_disabled=True)))
    assert COUNTER.count_messages(from_responses(model.calls[-1].input)) > BUDGET  # the test is not vacuous


def test_trim_items_accepts_a_bare_string_and_rejects_non_builders():
    assert trim_items(ContextBuilder(), "hi") == [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError, match="builder: expected a ContextBuilder"):
        call_model_input_filter(None)
