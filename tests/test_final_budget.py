"""Issue 12 items 4-7: the budget is a property of the prompt ``build()`` returns, as the
counter counts it (fresh counter, no cache), whatever the user does with the objects they own."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.memory.context import (
    ContextBuilder,
    SimpleTokenCounter,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.memory.context.providers.state_history import StateHistoryProvider
from jianmu_fast.message import ai, human, tool

from invariants import assert_valid_transactions
from strategies import conversations


def _history(n_pairs: int = 20) -> list:
    hist = [human([{"type": "text", "text": "x" * 40}])]
    for i in range(n_pairs):
        call = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
        hist += [ai("a" * 40), ai(None, tool_calls=call), tool("r" * 20, tool_call_id=f"c{i}"),
                 human([{"type": "text", "text": "y" * 40}])]
    return hist


@pytest.mark.parametrize("counter", [SimpleTokenCounter(), TiktokenTokenCounter("o200k_base")], ids=repr)
def test_in_place_edits_between_builds_cannot_break_the_budget(counter):
    """Issue 12 item 4: 495 tokens were sent against 300 after editing blocks in place."""
    blocks = [{"type": "text", "text": "x" * 40}]
    calls = [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    hist = [human(blocks), ai(None, tool_calls=calls), tool("r", tool_call_id="c0")] + _history()
    b = ContextBuilder([StaticPromptProvider("sys"), StateHistoryProvider()], [TokenBudgetFilter(300, counter)])
    state = {"messages": hist}
    first = b.build(state)
    # the caller's own lists: editing them does not reach the messages made from them
    blocks[0]["text"] = "z" * 4000
    calls[0]["function"]["arguments"] = "q" * 4000
    assert hist[0].content[0]["text"] == "x" * 40 and hist[1].tool_calls[0]["function"]["arguments"] == "{}"
    # the message's own parts: an edit is refused, naming the fix
    for m in hist:
        if isinstance(m.content, list):
            with pytest.raises(TypeError, match="immutable"):
                m.content[0]["text"] = "z" * 400
        if m.tool_calls:
            with pytest.raises(TypeError, match="immutable"):
                m.tool_calls[0]["function"]["arguments"] = "z" * 400
            with pytest.raises(TypeError, match="immutable"):
                m.tool_calls.append(dict(m.tool_calls[0]))
        m.metadata["note"] = "metadata is never counted " * 50  # allowed, and free
    second = b.build(state)
    fresh = type(counter)() if isinstance(counter, SimpleTokenCounter) else TiktokenTokenCounter("o200k_base")
    assert fresh.count_messages(second) <= 300
    assert [m.id for m in second] == [m.id for m in first]
    assert fresh.count_messages(second) == fresh.count_messages(first)


def test_to_openai_returns_fresh_mutable_dicts():
    calls = [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    m = ai([{"type": "text", "text": "t"}], tool_calls=calls, extra={"extra_key": {"k": [1]}})
    d = m.to_openai()
    d["tool_calls"][0]["function"]["arguments"] = "changed"
    d["content"][0]["text"] = "changed"
    d["extra_key"]["k"].append(2)
    assert m.tool_calls[0]["function"]["arguments"] == "{}" and m.text() == "t"
    assert m.extra == {"extra_key": {"k": [1]}}
    assert type(d["tool_calls"]) is list and type(d["tool_calls"][0]["function"]) is dict


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_units=12), st.integers(60, 400), st.data())
def test_edits_of_metadata_between_builds_keep_the_budget(msgs, budget, data):
    counter = SimpleTokenCounter()
    b = ContextBuilder(filters=[TokenBudgetFilter(budget, counter)])
    try:
        b.transform(msgs)
    except Exception:
        pass
    for m in msgs:
        if data.draw(st.booleans()):
            m.metadata["x"] = "y" * 100
    try:
        out = b.transform(msgs)
    except Exception as exc:
        assert type(exc).__name__ in ("ContextBudgetError", "ToolCallHistoryError")
        return
    assert SimpleTokenCounter().count_messages(out) <= budget
    assert_valid_transactions(out)
