"""Responses API items <-> Message: round trips, call_id pairing kept whole by the trimming."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter
from strategies import conversations

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.integrations.openai_responses import from_responses, to_responses
from jianmu_fast.memory.context import ContextBuilder, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.message.sanitize import sanitize_tool_call_history_report

ITEMS = TypeAdapter(list[ResponseInputItemParam])
_text = st.text(alphabet=st.sampled_from(list("ab c{}\":é中\n")), max_size=30)


def _parts(draw, kind):
    if draw(st.booleans()):
        return draw(_text)
    parts = []
    for _ in range(draw(st.integers(0, 2))):
        if kind == "output_text":
            parts.append({"type": "output_text", "text": draw(_text), "annotations": []})
        elif draw(st.booleans()):
            parts.append({"type": "input_text", "text": draw(_text)})
        else:
            parts.append({"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"})
    return parts


@st.composite
def responses_items(draw) -> list[dict]:
    """Real-shaped Responses input: user turns, model turns (reasoning, text, parallel calls)
    and the calls' outputs, sometimes missing or orphaned."""
    items: list[dict] = []
    n = 0
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "developer", "model", "model", "orphan"]))
        if kind in ("user", "developer"):
            item = {"role": kind, "content": _parts(draw, "input_text")}
            if draw(st.booleans()):
                item["type"] = "message"
            items.append(item)
        elif kind == "orphan":
            items.append({"type": "function_call_output", "call_id": "gone", "output": draw(_text)})
        else:
            if draw(st.booleans()):
                items.append({"type": "reasoning", "id": f"rs_{n}", "summary": [
                    {"type": "summary_text", "text": draw(_text)}], "encrypted_content": "xyz"})
            if draw(st.booleans()):
                items.append({"type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed",
                              "content": [{"type": "output_text", "text": draw(_text), "annotations": []}]})
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                n += 1
                calls.append(f"call_{n}")
                items.append({"type": "function_call", "call_id": calls[-1], "name": "search",
                              "arguments": json.dumps({"q": draw(_text)}), "id": f"fc_{n}", "status": "completed"})
            for c in calls:
                if draw(st.integers(0, 9)):  # now and then a call stays unanswered
                    out = draw(_text) if draw(st.booleans()) else [{"type": "input_text", "text": draw(_text)}]
                    items.append({"type": "function_call_output", "call_id": c, "output": out})
        n += 1
    return items


@settings(max_examples=300, deadline=None)
@given(responses_items())
def test_items_round_trip_is_lossless(items):
    ITEMS.validate_python(items)  # the strategy writes what the openai package accepts
    ms = from_responses(items)
    assert to_responses(ms) == items


@settings(max_examples=300, deadline=None)
@given(conversations(max_units=10))
def test_messages_round_trip_through_items(ms):
    # The one thing items cannot say: a text-only assistant message followed by one that only
    # calls tools reads as a single model turn (tested below), so such pairs are left out here.
    def merges(a, b):
        return a.role == "assistant" and not a.tool_calls and b.role == "assistant" and b.tool_calls and b.content is None

    while any(merges(a, b) for a, b in zip(ms, ms[1:])):
        ms = [m for k, m in enumerate(ms) if not (k + 1 < len(ms) and merges(m, ms[k + 1]))]
    items = to_responses(ms)
    ITEMS.validate_python(items)
    back = from_responses(items)
    assert [m.to_openai() for m in back] == [m.to_openai() for m in ms]


def test_text_then_calls_reads_as_one_model_turn():
    ms = from_responses(to_responses([
        {"role": "assistant", "content": "let me check"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]))
    assert [(m.role, m.content) for m in ms] == [("assistant", "let me check"), ("tool", "ok")]
    assert ms[0].tool_calls[0]["id"] == "c1"


def test_reasoning_stays_with_its_call_and_pairs_trim_whole():
    items = [
        {"role": "user", "content": "find a and b"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{"q":"a"}'},
        {"type": "function_call", "call_id": "c2", "name": "search", "arguments": '{"q":"b"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "A " * 300},
        {"type": "function_call_output", "call_id": "c2", "output": "B"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a is A",
                                                              "annotations": []}]},
        {"role": "user", "content": "and c?"},
    ]
    ms = from_responses(items)
    assert [m.role for m in ms] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert [i["type"] for i in ms[1].metadata["responses"]["items"]] == ["reasoning", "function_call",
                                                                          "function_call"]
    counter = TiktokenTokenCounter("o200k_base")
    sizes = []
    for budget in range(20, 500, 10):
        out = to_responses(ContextBuilder(filters=[TokenBudgetFilter(budget, counter)]).transform(ms))
        calls = [i["call_id"] for i in out if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in out if i.get("type") == "function_call_output"]
        assert calls == outputs  # every call with its output, never one without the other
        if calls:
            assert out[out.index(next(i for i in out if i.get("type") == "function_call")) - 1]["type"] == "reasoning"
        sizes.append(len(out))
    assert sizes[0] == 2 and sizes[-1] == len(items)


def test_orphan_output_is_dropped_by_sanitize():
    ms = from_responses([{"role": "user", "content": "q"},
                         {"type": "function_call_output", "call_id": "zz", "output": "stray"},
                         {"role": "user", "content": "r"}])
    assert to_responses(sanitize_tool_call_history_report(ms).messages) == [
        {"role": "user", "content": "q"}, {"role": "user", "content": "r"}]


def test_edited_message_gets_fresh_items():
    ms = from_responses([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    edited = ms[0].model_copy(update={"content": "hello"})
    assert to_responses([edited]) == [{"type": "message", "role": "user", "content": "hello"}]


@pytest.mark.parametrize("bad, where", [
    ([{"role": "robot", "content": "x"}], r"items\[0\]\.role"),
    ([{"role": "user", "content": "x"}, {"type": "function_call", "name": "f"}], r"items\[1\]\.call_id"),
    ([{"role": "user", "content": "x"}, "oops"], r"items\[1\]: expected a dict"),
    ([{"type": 3}], r"items\[0\]: an item needs a string 'type'"),
])
def test_bad_items_are_named(bad, where):
    with pytest.raises(MessageValidationError, match=where):
        from_responses(bad)


@settings(max_examples=300, deadline=None)
@given(responses_items(), st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=6))
def test_incremental_converter_equals_from_responses(items, calls):
    """A converter reused across calls (growing, shrinking and edited histories) gives what a
    fresh conversion gives, and writes the same items back."""
    from jianmu_fast.integrations.openai_responses import ResponsesConverter

    conv = ResponsesConverter()
    for cut, edit in calls:
        x = [dict(i) for i in items[:cut]]
        if edit and x:
            x[len(x) // 2] = {"role": "user", "content": "edited"}
        got = conv.from_responses(x)
        want = from_responses(x)
        assert [m.model_dump(exclude={"id"}) for m in got] == [m.model_dump(exclude={"id"}) for m in want]
        assert conv.to_responses(got) == x
        assert conv.to_responses(got[1:]) == to_responses(want[1:])
