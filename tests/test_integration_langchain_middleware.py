"""``ContextBuilderMiddleware`` in real LangChain v1 ``create_agent`` agents, with a scripted chat model."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from jianmu_fast.integrations.langchain import ContextBuilderMiddleware, _tools_schema, from_langchain
from jianmu_fast.memory.context import (ContextBuilder, StateHistoryProvider, StaticPromptProvider,
                                        TiktokenTokenCounter, TokenBudgetFilter)
from jianmu_fast.message.sanitize import sanitize_tool_call_history_report

COUNTER = TiktokenTokenCounter("o200k_base")
SYSTEM = "You research."
TASK = "research this"


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's scripted fake chat model, recording what it receives; tools bind to itself."""

    received: list = Field(default_factory=list)
    bound: list = Field(default_factory=list)

    def bind_tools(self, tools, **kwargs):
        self.bound.append(list(tools))
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.received.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)


@tool
def lookup(q: str) -> str:
    """Look something up in the archive and return every passage that mentions it."""
    return ("result for " + q + ". ") * 40


TOOLS_TOKENS = COUNTER.count_tools([convert_to_openai_tool(lookup)])


def script(rounds: int) -> list[AIMessage]:
    calls = [AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": f"q{i}"}, "id": f"c{i}"},
                                       {"name": "lookup", "args": {"q": f"r{i}"}, "id": f"d{i}"}])
             for i in range(rounds)]
    return calls + [AIMessage("done")]


def cost(lc_msgs) -> int:
    return COUNTER.count_messages(from_langchain(lc_msgs))


def valid(lc_msgs) -> bool:
    return sanitize_tool_call_history_report(from_langchain(lc_msgs), on_broken_tail="drop").changed is False


def untrimmed_round_one_cost() -> int:
    """What the second model call costs (system, task, first call unit) with no middleware."""
    model = ScriptedModel(responses=script(1))
    create_agent(model, [lookup], system_prompt=SYSTEM).invoke({"messages": [HumanMessage(TASK)]})
    assert [m.type for m in model.received[1]] == ["system", "human", "ai", "tool", "tool"]
    return cost(model.received[1])


# The budget fits the second call's messages but not them plus the tools: counting the tools
# must drop the task message there.
BUDGET = untrimmed_round_one_cost() + TOOLS_TOKENS - 1


def check_run(model, state, rounds, system, budget=None, exact=True):
    budget = BUDGET if budget is None else budget
    msgs = state["messages"]
    assert [m.type for m in msgs] == ["human"] + ["ai", "tool", "tool"] * rounds + ["ai"]  # all kept
    assert msgs[0].content == TASK and msgs[-1].content == "done"
    assert "llm_input_messages" not in state
    assert len(model.received) == rounds + 1
    for k, got in enumerate(model.received):
        assert valid(got)
        assert cost(got) + TOOLS_TOKENS <= budget  # the whole request, tools included
        assert got[0].type == "system" and got[0].content == system
        history = [m for m in got if m.type != "system"]
        prefix = msgs[:1 + 3 * k]  # the state when call k was made
        suffix = prefix[len(prefix) - len(history):]
        if exact:  # a suffix of the state, the very objects
            assert history == suffix and all(a is b for a, b in zip(history, suffix))
        else:  # StateHistoryProvider annotates copies: same ids, types and calls
            assert [(m.id, m.type, getattr(m, "tool_calls", None)) for m in history] == [
                (m.id, m.type, getattr(m, "tool_calls", None)) for m in suffix]
            continue
        if len(history) < len(prefix):  # maximal: the next older unit (or the task) did not fit
            start = len(prefix) - len(history)
            older = prefix[start - 3:start] if start >= 3 else prefix[:start]
            assert cost([got[0], *older, *history]) + TOOLS_TOKENS > BUDGET
    assert len(model.received[-1]) < len(msgs)
    if not exact:
        return
    # round one: without the tools' tokens the task message would have fit
    assert [m.type for m in model.received[1]] == ["system", "ai", "tool", "tool"]
    assert cost([model.received[1][0], msgs[0], *model.received[1][1:]]) <= BUDGET


def test_create_agent_with_middleware_trims_input_and_keeps_state():
    rounds = 4
    model = ScriptedModel(responses=script(rounds))
    mw = ContextBuilderMiddleware(ContextBuilder(filters=[TokenBudgetFilter(BUDGET, COUNTER)]))
    agent = create_agent(model, [lookup], system_prompt=SYSTEM, middleware=[mw])
    state = agent.invoke({"messages": [HumanMessage(TASK, id="u0")]})
    check_run(model, state, rounds, SYSTEM)
    assert state["messages"][0].id == "u0"
    assert all(len(b) == 1 and b[0].name == "lookup" for b in model.bound)  # the tools reached the model


def test_async_agent_with_providers_builder():
    rounds = 3
    model = ScriptedModel(responses=script(rounds))
    builder = ContextBuilder(providers=[StaticPromptProvider(SYSTEM), StateHistoryProvider()],
                             filters=[TokenBudgetFilter(BUDGET + 150, COUNTER)])  # + the history note
    agent = create_agent(model, [lookup], middleware=[ContextBuilderMiddleware(builder)])
    # in a thread of its own: ainvoke makes its loop the thread's default, and the main thread's
    # default loop may be the one the Agents SDK's Runner.run_sync keeps open on purpose
    with ThreadPoolExecutor(1) as pool:
        state = pool.submit(asyncio.run, agent.ainvoke({"messages": [HumanMessage(TASK)]})).result()
    check_run(model, state, rounds, SYSTEM, BUDGET + 150, exact=False)
    assert "semantic_kind" not in str(state["messages"])  # the builder's annotations stayed in the prompt


def test_without_middleware_the_input_exceeds_the_budget():
    model = ScriptedModel(responses=script(3))
    create_agent(model, [lookup], system_prompt=SYSTEM).invoke({"messages": [HumanMessage(TASK)]})
    assert cost(model.received[-1]) + TOOLS_TOKENS > BUDGET  # the test above is not vacuous


def test_tools_schema_and_bad_builder():
    schema = _tools_schema([lookup, {"type": "web_search_preview"},
                            {"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert schema == [convert_to_openai_tool(lookup), {"type": "function", "function": {"name": "f", "parameters": {}}}]
    with pytest.raises(TypeError, match="builder: expected a ContextBuilder"):
        ContextBuilderMiddleware(object())


def test_import_is_lazy_and_missing_langchain_names_the_extra():
    code = ("import sys, jianmu_fast.integrations.langchain as m; "
            "assert 'langchain' not in sys.modules and 'langchain_core' not in sys.modules, 'eager import'; "
            "sys.modules['langchain.agents.middleware'] = None\n"
            "try:\n    from jianmu_fast.integrations.langchain import ContextBuilderMiddleware\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "langchain>=1.0" in out and "pip install 'jianmu_fast[langchain]'" in out
