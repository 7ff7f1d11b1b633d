"""``ContextBuilder(max_messages=N, max_tokens=T, token_counter=...)``: the design document's
"``ContextBuilder(max_messages=N)`` → ``MaxMessagesFilter``", the limits appended after the
given filters in the document's order (messages, then tokens)."""

from __future__ import annotations

import pytest

from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    StateHistoryProvider,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.message import ai, human, system, tool

from invariants import assert_valid_transactions


class DropUser:
    """A user filter: drops user messages whose text is ``"drop"``."""

    def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
        return [m for m in messages if not (m.role == "user" and m.content == "drop")]


def _history():
    call = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 2}'}}]
    return [human("u1"), ai("a1"), human("u2"), ai(None, tool_calls=call), tool("4", tool_call_id="c1"),
            ai("a2"), human("u3"), ai("a3")]


def test_max_messages_alone_is_the_documents_example(core):
    b = ContextBuilder(max_messages=5)
    assert [type(f) for f in b.filters] == [MaxMessagesFilter]
    assert b.filters[0].max_messages == 5
    msgs = [system("sys1"), system("sys2"), human("u1"), ai("a1"), human("u2"), ai("a2"), human("u3"), ai("a3")]
    assert [m.content for m in b.transform(msgs)] == ["sys1", "sys2", "a1", "u2", "a2", "u3", "a3"]


def test_limits_come_after_the_given_filters_messages_then_tokens():
    counter = TiktokenTokenCounter("o200k_base")
    user = DropUser()
    b = ContextBuilder(filters=[user], max_messages=4, max_tokens=500, token_counter=counter)
    assert [type(f) for f in b.filters] == [DropUser, MaxMessagesFilter, TokenBudgetFilter]
    assert b.filters[0] is user
    assert b.filters[2].max_tokens == 500 and b.filters[2].counter is counter


def test_no_limits_no_filters():
    assert ContextBuilder().filters == []
    assert ContextBuilder(providers=[StaticPromptProvider("x")]).filters == []


def test_max_tokens_alone_uses_the_default_counter():
    (f,) = ContextBuilder(max_tokens=100).filters
    assert type(f) is TokenBudgetFilter and f.max_tokens == 100
    assert type(f.counter).__name__ == "SimpleTokenCounter"


def test_same_output_as_explicit_filters(core):
    counter = TiktokenTokenCounter("o200k_base")
    providers = [StaticPromptProvider("You are terse."), StateHistoryProvider()]
    state = {"messages": _history() + [human("drop"), human("u4")]}
    for mm, mt in [(3, 150), (6, 170), (20, 135), (2, 1000)]:
        short = ContextBuilder(providers=providers, filters=[DropUser()], max_messages=mm, max_tokens=mt,
                               token_counter=counter)
        long = ContextBuilder(providers=providers, filters=[DropUser(), MaxMessagesFilter(mm),
                                                            TokenBudgetFilter(mt, counter=counter)])
        out = short.build(state)
        assert out == long.build(state)
        assert counter.count_messages(out) <= mt
        assert sum(m.role != "system" for m in out) <= mm
        assert "drop" not in [m.content for m in out]
        assert_valid_transactions(out)


def test_messages_limit_runs_before_tokens(core):
    # MaxMessagesFilter first: with a budget that would fit 3 messages but max_messages=1,
    # only the newest message survives; the reverse order could not tell.
    b = ContextBuilder(max_messages=1, max_tokens=1000)
    assert [m.content for m in b.transform([human("a"), ai("b"), human("c")])] == ["c"]


def test_bad_limits_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="max_messages must be a positive int.*got 0"):
        ContextBuilder(max_messages=0)
    with pytest.raises(ValueError, match="max_tokens must be a positive int.*got -1"):
        ContextBuilder(max_tokens=-1)
    with pytest.raises(ValueError, match="token_counter=.*pass max_tokens= too"):
        ContextBuilder(token_counter=TiktokenTokenCounter("o200k_base"))


def test_budget_error_still_propagates(core):
    b = ContextBuilder(providers=[StaticPromptProvider("persona " * 50)], max_tokens=20)
    with pytest.raises(ContextBudgetError):
        b.build({})
