"""Repeated calls reuse the last plan and the history provider's lists; outputs stay equal.

Structural (nothing is timed): a repeated ``build()`` on an unchanged history equals a fresh
builder's output, holds the caller's current message objects, follows a changed limit, and
the builder's path through ``StateHistoryProvider`` equals ``get_messages()``.
"""

from __future__ import annotations

import json

import pytest

from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    StateHistoryProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.message import ai, human, system, tool


def call(cid: str, k: int) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "calc", "arguments": json.dumps({"k": k})}}


def history(n_turns: int, start: int = 0) -> list:
    out = []
    for k in range(start, start + n_turns):
        cid = f"c{k % 3}"
        out += [human(f"question {k} " + "word " * (k % 7)),
                ai(None, tool_calls=[call(cid, k)]),
                tool(f"result {k}", tool_call_id=cid, metadata={"tool_result": {"k": k}}),
                ai(f"answer {k}")]
    return out


def same(m) -> tuple:
    return m.role, m.content, m.tool_calls, m.tool_call_id, m.metadata


@pytest.mark.parametrize("flt", ["tokens", "messages"])
def test_repeated_trim_equals_fresh_and_follows_the_limit(flt):
    make = (lambda n: TokenBudgetFilter(n, counter=TiktokenTokenCounter("o200k_base"))) if flt == "tokens" \
        else (lambda n: MaxMessagesFilter(n // 10))
    msgs = [system("Be brief.")] + history(30)
    f = make(300)
    first = f.apply(msgs)
    again = f.apply(msgs)
    assert again == first and again is not first and all(a is b for a, b in zip(again, first))
    assert again == make(300).apply(msgs)
    # equal but distinct message objects: the output holds the ones of this call
    copies = [m.model_copy() for m in msgs]
    out = f.apply(copies)
    assert out == first and all(any(o is c for c in copies) for o in out)
    # a changed limit is a new plan
    if flt == "tokens":
        f.max_tokens = 150
    else:
        f.max_messages = 15
    assert f.apply(msgs) == make(150).apply(msgs) != first
    # the output is the caller's: changing it changes nothing inside
    out = f.apply(msgs)
    out.clear()
    assert f.apply(msgs) == make(150).apply(msgs)


def test_repeated_build_and_growth_equal_fresh_builders():
    b = ContextBuilder.for_react("Sys.", max_tokens=400, token_counter=TiktokenTokenCounter("o200k_base"))
    state = {"messages": history(3)}
    for k in range(3, 25):
        for _ in range(2):  # a turn, then the same call again
            got = b.build(state)
            fresh = ContextBuilder.for_react("Sys.", max_tokens=400,
                                             token_counter=TiktokenTokenCounter("o200k_base")).build(state)
            assert [same(m) for m in got] == [same(m) for m in fresh]  # a builder's static prompts have their own ids
            assert got[0].content == "Sys." and sum(m.role == "system" for m in got) == 3
        state["messages"].extend(history(1, start=k))


def test_builder_history_path_equals_get_messages():
    p = StateHistoryProvider()
    b = ContextBuilder(providers=[p])
    state = {"messages": history(4)}
    assert b.build(state) == p.get_messages(state)
    out = p.get_messages(state)
    out.append(human("not part of the history"))  # the caller's list: the provider's is untouched
    assert b.build(state) == p.get_messages(state) == out[:-1]
    plain = {"messages": [human("hi")]}  # no annotation: no semantics note
    assert b.build(plain) == p.get_messages(plain) == plain["messages"]
