"""build_report: identical messages to build(), per-provider tokens, per-filter drops."""

from __future__ import annotations

import json
import logging

import pytest

from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import (
    BuildReport,
    ContextBuilder,
    MaxMessagesFilter,
    SimpleTokenCounter,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.message import ai, human, tool


pytestmark = pytest.mark.usefixtures("config_sandbox")


@pytest.fixture(scope="module")
def counter():
    return TiktokenTokenCounter("cl100k_base")


def history(n):
    out = []
    for i in range(n):
        call = [{"id": f"c{i}", "type": "function", "function": {"name": "calc", "arguments": f'{{"x": {i}}}'}}]
        out += [human(f"question {i} " * 5), ai(None, tool_calls=call), tool(f"result {i}", tool_call_id=f"c{i}"),
                ai(f"answer {i} " * 8)]
    return out


def dumps(messages):
    return json.dumps([m.to_openai() for m in messages])


def test_messages_identical_to_build(counter):
    b = ContextBuilder.for_react(system_prompt="Persona.", tools_desc="- calc: arithmetic", max_messages=12,
                                 max_tokens=300, token_counter=counter)
    state = {"messages": history(10)}
    r = b.build_report(state)
    assert isinstance(r, BuildReport)
    assert dumps(r.messages) == dumps(b.build(state))
    assert r.total_tokens == counter.count_messages(r.messages) <= 300


def test_provider_tokens_by_index_and_name(counter):
    b = ContextBuilder.for_react(system_prompt="Persona.", tools_desc="- calc: arithmetic", max_tokens=100000,
                                 token_counter=counter)
    state = {"messages": history(3)}
    r = b.build_report(state)
    assert [(p.index, p.name) for p in r.providers] == [
        (0, "StaticPromptProvider"), (1, "StaticPromptProvider"), (2, "ToolsDescProvider"), (3, "StateHistoryProvider"),
    ]
    for p, provider in zip(r.providers, b.providers):
        block = provider.get_messages(state)
        assert (p.messages, p.tokens) == (len(block), sum(counter.count_message(m) for m in block))
    assert r.provided_tokens == counter.count_messages([])  + sum(p.tokens for p in r.providers)
    assert r.counter is counter  # the TokenBudgetFilter's counter is the default


def test_filter_drops_add_up(counter):
    b = ContextBuilder.for_react(system_prompt="Persona.", max_messages=9, max_tokens=380, token_counter=counter)
    r = b.build_report({"messages": history(6)})
    mm, tb = r.filters
    assert (mm.name, tb.name) == ("MaxMessagesFilter", "TokenBudgetFilter")
    assert mm.messages_in == 3 + 24 and mm.messages_out <= 3 + 9  # persona, protocol, history note
    assert mm.dropped_messages == mm.messages_in - mm.messages_out
    assert tb.messages_in == mm.messages_out and tb.dropped_messages > 0
    for s in r.filters:
        assert s.dropped_tokens == s.tokens_in - s.tokens_out
    assert r.provided_tokens - sum(s.dropped_tokens for s in r.stages) == r.total_tokens
    assert r.stages[-1].name == "sanitize_tool_call_history" and r.stages[-1].dropped_messages == 0


def test_exact_dropped_tokens_simple_counter():
    c = SimpleTokenCounter()
    msgs = [human("a" * 40), ai("b" * 40), human("c" * 4)]
    b = ContextBuilder(providers=[StaticPromptProvider("S")], filters=[MaxMessagesFilter(1)], sanitize=False)

    class P:
        def get_messages(self, local_state, global_state=None, ctx=None):
            return msgs

    b = ContextBuilder(providers=[StaticPromptProvider("S"), P()], filters=[MaxMessagesFilter(1)], sanitize=False)
    r = b.build_report({}, counter=c)
    assert [m.content for m in r.messages] == ["S", "c" * 4]
    (stage,) = r.stages
    assert (stage.dropped_messages, stage.dropped_tokens) == (2, 2 * (4 + 10))
    assert r.providers[1].tokens == 14 + 14 + 5


def test_sanitize_stage_reports_dropped_broken_units(caplog):
    class P:
        def get_messages(self, local_state, global_state=None, ctx=None):
            return [human("a"), tool("orphan", tool_call_id="x"), ai("b"), human("q")]

    b = ContextBuilder(providers=[P()])
    with caplog.at_level(logging.WARNING):
        r = b.build_report({})
        assert dumps(r.messages) == dumps(b.build({}))
    (stage,) = r.stages
    assert (stage.index, stage.name, stage.dropped_messages) == (-1, "sanitize_tool_call_history", 1)
    assert r.filters == []


def test_failing_provider_and_filter_are_marked(caplog):
    class Boom:
        def get_messages(self, local_state, global_state=None, ctx=None):
            raise RuntimeError("boom")

    class BadFilter:
        def apply(self, messages, local_state=None, global_state=None, ctx=None, **kw):
            raise RuntimeError("bad")

    b = ContextBuilder(providers=[StaticPromptProvider("S"), Boom()], filters=[BadFilter()])
    with caplog.at_level(logging.ERROR, logger="jianmu_fast.context"):
        r = b.build_report({})
    assert [(p.name, p.failed) for p in r.providers] == [("StaticPromptProvider", False), ("Boom", True)]
    assert r.filters[0].failed and r.filters[0].dropped_messages == 0
    assert [m.content for m in r.messages] == ["S"]


def test_budget_error_strict_and_lenient():
    b = ContextBuilder(providers=[StaticPromptProvider("x" * 400)], filters=[TokenBudgetFilter(20)])
    with pytest.raises(ContextBudgetError):
        b.build_report({})
    r = b.build_report({}, strict=False)
    assert isinstance(r.error, ContextBudgetError)
    assert r.providers[0].tokens == 104 and r.filters[0].failed
    assert "error:" in str(r) and "StaticPromptProvider" in str(r)


def test_str_table():
    b = ContextBuilder(providers=[StaticPromptProvider("Be brief.")], filters=[MaxMessagesFilter(1)])
    lines = str(b.build_report({})).splitlines()
    assert lines[0].split() == ["stage", "msgs", "tokens"]
    assert lines[1].split() == ["providers[0]", "StaticPromptProvider", "+1", "+7"]
    assert lines[-1].split() == ["sent", "1", "10"]
