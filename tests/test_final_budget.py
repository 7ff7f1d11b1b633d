"""Issue 12 items 4-7: the budget is a property of the prompt ``build()`` returns, as the
counter counts it (fresh counter, no cache), whatever the user does with the objects they own."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.batch import build_batch, transform_batch
from jianmu_fast.errors import BatchError, ContextBudgetError, ToolCallHistoryError, TrimmingError
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


# -- item 5: the budget of the final prompt, after sanitize filled ids ------------------------


def _strip_ids(msgs, data):
    """Drop some call ids or result ids where sanitize can fill them back (single call,
    single result): the filled ids cost tokens with SimpleTokenCounter."""
    out = list(msgs)
    for i, m in enumerate(out):
        if m.role == "assistant" and m.tool_calls and len(m.tool_calls) == 1 and i + 1 < len(out) \
                and out[i + 1].role == "tool" and (i + 2 == len(out) or out[i + 2].role != "tool"):
            which = data.draw(st.sampled_from(["keep", "call", "result", "both"]))
            if which in ("call", "both"):
                call = {k: v for k, v in m.tool_calls[0].items() if k != "id"}
                out[i] = m.model_copy(update={"tool_calls": [call]})
            if which in ("result", "both"):
                out[i + 1] = out[i + 1].model_copy(update={"tool_call_id": None})
    return out


TOOLS = [
    {"type": "function", "function": {"name": f"tool_{k}", "description": "Looks things up. " * 3,
     "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}}}}
    for k in range(3)
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_units=12), st.integers(30, 700), st.booleans(), st.data())
def test_final_prompt_is_within_the_budget_tools_and_filled_ids_included(msgs, budget, with_tools, data):
    """Issue 12 items 5 and 6: what build()/transform() return, plus the tools, as the counter
    counts it, never exceeds max_tokens."""
    counter = SimpleTokenCounter()  # counts call ids and tool_call_id: filling costs tokens
    msgs = _strip_ids(msgs, data)
    tools = [dict(t) for t in TOOLS] if with_tools else None
    b = ContextBuilder(filters=[TokenBudgetFilter(budget, counter)])
    try:
        out = b.transform(msgs, tools_schema=tools)
    except (ContextBudgetError, ToolCallHistoryError):
        return
    billed = SimpleTokenCounter().count_messages(out) + SimpleTokenCounter().count_tools(tools)
    assert billed <= budget
    assert_valid_transactions(out)
    # the batch path returns the same prompts
    assert transform_batch(b, [msgs, msgs[:-1] or msgs], tools_schema=tools, on_error="skip")[0] == out


def test_filled_call_id_is_counted_issue_example():
    """A call without id: sanitize fills it after the filters counted (64 tokens against 47)."""
    counter = SimpleTokenCounter()
    call = [{"type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    rid = "call_" + "r" * 40
    msgs = [human("q" * 40), ai(None, tool_calls=call), tool("result", tool_call_id=rid), ai("done")]
    for budget in range(20, 120):
        try:
            out = ContextBuilder(filters=[TokenBudgetFilter(budget, counter)]).transform(msgs)
        except ContextBudgetError:
            continue
        assert counter.count_messages(out) <= budget, budget


def test_result_without_id_after_a_single_call_is_paired():
    """Issue 15 item 4: the document's tool('{"result": 4}', name="calculator")."""
    from jianmu_fast.message import sanitize_tool_call_history_report

    call = [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"x": "2+2"}'}}]
    msgs = [human("2+2?"), ai(None, tool_calls=call), tool('{"result": 4}', name="calculator"), ai("4")]
    r = sanitize_tool_call_history_report(msgs)
    assert [m.role for m in r.messages] == ["user", "assistant", "tool", "assistant"]
    assert r.messages[2].tool_call_id == "c1" and r.messages[2].id == msgs[2].id
    assert [(f.index, f.tool_call_id) for f in r.filled_results] == [(2, "c1")] and not r.dropped
    assert msgs[2].tool_call_id is None  # the stored message is untouched
    # no id on either side: both get the same deterministic id
    bare = [{"type": "function", "function": {"name": "calculator", "arguments": "{}"}}]
    m = ai(None, tool_calls=bare)
    out = sanitize_tool_call_history_report([human("q"), m, tool("4", name="calculator")]).messages
    assert out[1].tool_calls[0]["id"] == out[2].tool_call_id == f"call_{m.id}"
    # ambiguous or contradicting: still broken (dropped when historical)
    for results in ([tool("4", name="search")], [tool("4"), tool("5")]):
        r = sanitize_tool_call_history_report([human("q"), ai(None, tool_calls=call), *results, human("next")])
        assert r.dropped_indices == list(range(1, 2 + len(results)))
    two = call + [{"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]
    r = sanitize_tool_call_history_report([human("q"), ai(None, tool_calls=two), tool("4"), human("next")])
    assert r.dropped_indices == [1, 2]


# -- item 6: the request's tools are in the budget --------------------------------------------


@pytest.mark.parametrize("counter", [SimpleTokenCounter(), TiktokenTokenCounter("o200k_base")], ids=repr)
def test_tools_are_in_the_budget_of_a_filter_alone_and_of_the_builder(counter):
    tools = TOOLS * 4
    msgs = [human("question " * 30) if k % 2 == 0 else ai("answer " * 30) for k in range(40)]
    t = counter.count_tools(tools)
    flt = TokenBudgetFilter(t + 300, counter)
    out = flt.apply(msgs, tools_schema=tools)
    assert counter.count_messages(out) + t <= t + 300
    assert counter.count_messages(out) + t > t + 300 - counter.count_message(msgs[0]) - 5  # still maximal-ish
    assert len(flt.apply(msgs)) > len(out)  # without tools more fits
    built = ContextBuilder(filters=[flt]).transform(msgs, tools_schema=tools)
    assert built == out
    with pytest.raises(ContextBudgetError, match=r"the request's tools \(tools_schema, 12 tool\(s\)\) alone need"):
        TokenBudgetFilter(t, counter).apply(msgs, tools_schema=tools)
    with pytest.raises(ContextBudgetError, match="tools"):
        ContextBuilder(filters=[TokenBudgetFilter(t, counter)]).transform(msgs, tools_schema=tools)


def test_tools_count_is_cached_by_content():
    class Spy(SimpleTokenCounter):
        calls = 0

        def count_tools(self, tools_schema):
            Spy.calls += 1
            return super().count_tools(tools_schema)

    flt = TokenBudgetFilter(5000, Spy())
    msgs = [human("hi")]
    for _ in range(5):  # a new list of new, equal dicts each turn
        flt.apply(msgs, tools_schema=[{**t, "function": dict(t["function"])} for t in TOOLS])
    assert Spy.calls == 1
    tools = [dict(t) for t in TOOLS]
    tools[0]["function"] = {**tools[0]["function"], "description": "changed " * 50}
    flt.apply(msgs, tools_schema=tools)
    assert Spy.calls == 2
    tools[0]["function"]["description"] = "x"  # an in-place edit of the caller's dict is seen
    flt.apply(msgs, tools_schema=tools)
    assert Spy.calls == 3
    flt.apply(msgs, tools_schema=TOOLS)  # back to an earlier set: found by its canonical JSON
    assert Spy.calls == 3


def test_build_report_and_build_batch_budget_the_tools():
    counter = SimpleTokenCounter()
    t = counter.count_tools(TOOLS)
    b = ContextBuilder([StaticPromptProvider("sys"), StateHistoryProvider()], [TokenBudgetFilter(t + 200, counter)])
    states = [{"messages": [human("m" * 60) for _ in range(k)]} for k in range(1, 30, 4)]
    report = b.build_report(states[-1], tools_schema=TOOLS)
    assert report.tools_tokens == t
    assert report.total_tokens == counter.count_messages(report.messages) + t <= t + 200
    assert "tools (tools_schema)" in str(report)
    batch = build_batch(b, states, tools_schema=TOOLS)
    assert batch == [b.build(s, tools_schema=TOOLS) for s in states]
    assert all(counter.count_messages(p) + t <= t + 200 for p in batch)
    with pytest.raises(BatchError):
        build_batch(ContextBuilder(filters=[TokenBudgetFilter(t, counter)]), states, tools_schema=TOOLS)


# -- item 7: documented ranges; built-in trimming stages fail only with library errors -------


class _BadCounter(SimpleTokenCounter):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def count_message(self, message):
        if message.content == "bad":
            if isinstance(self.value, Exception):
                raise self.value
            return self.value
        return super().count_message(message)

    def count_array(self, messages):
        return [self.count_message(m) for m in messages]


@pytest.mark.parametrize("value", [2**53 + 1, 2**64, -1, 3.5, "7", None, KeyError("boom")], ids=repr)
def test_a_bad_custom_count_is_a_trimming_error_and_never_an_untrimmed_prompt(value, caplog):
    msgs = [human("x" * 400) for _ in range(20)] + [human("bad"), human("last")]
    flt = TokenBudgetFilter(300, _BadCounter(value))
    with pytest.raises(TrimmingError, match=r"TokenBudgetFilter") as info:
        flt.apply(msgs)
    if not isinstance(value, Exception):
        assert "messages[20]" in str(info.value) and "2**53" in str(info.value)
    with pytest.raises(TrimmingError):
        ContextBuilder(filters=[flt]).transform(msgs)


def test_huge_counts_in_range_do_not_overflow():
    class Huge(SimpleTokenCounter):
        def count_message(self, message):
            return 2**53 if message.content == "huge" else super().count_message(message)

    msgs = [human("huge")] * 3000 + [human("a"), human("b")]
    flt = TokenBudgetFilter(2**53, Huge(), eviction="chunked", chunk=2**53)
    out = flt.apply(msgs)
    assert [m.content for m in out] == ["a", "b"] or [m.content for m in out][-2:] == ["a", "b"]
    out = TokenBudgetFilter(2**53, Huge()).apply(msgs)
    assert [m.content for m in out] == ["a", "b"]


def test_user_defined_filters_keep_log_and_continue(caplog):
    class Broken:
        def apply(self, messages, local_state=None, global_state=None, ctx=None):
            raise RuntimeError("user bug")

    msgs = [human("a"), human("b")]
    assert ContextBuilder(filters=[Broken()]).transform(msgs) == msgs
    assert "filters[0] (Broken) failed" in caplog.text
