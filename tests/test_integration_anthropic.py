"""Anthropic Messages format <-> Message, validated against the installed ``anthropic`` types."""

from __future__ import annotations

import json
from typing import Iterable, Union

import pytest
from anthropic.types import MessageParam, TextBlockParam
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from strategies import conversations

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.integrations.anthropic import ApproxClaudeTokenCounter, build_anthropic, from_anthropic, to_anthropic
from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, TokenBudgetFilter
from jianmu_fast.message import human

MESSAGES = TypeAdapter(list[MessageParam])
SYSTEM = TypeAdapter(Union[str, Iterable[TextBlockParam]])
_text = st.text(alphabet=st.sampled_from(list("ab c{}\":é中\n")), min_size=1, max_size=30)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
DOC = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a report"},
       "title": "report"}


def validate(req: dict) -> None:
    MESSAGES.validate_python(req["messages"])
    if "system" in req:
        SYSTEM.validate_python(req["system"])


@st.composite
def anthropic_requests(draw) -> tuple[list[dict], object]:
    """Real-shaped requests: text, images, documents, thinking, parallel tool_use answered (or
    not) in the next user turn with is_error / cache_control / list or absent content."""
    system = draw(st.one_of(st.none(), _text, st.just([{"type": "text", "text": "Be terse.",
                                                       "cache_control": {"type": "ephemeral"}}])))
    turns: list[dict] = []
    pending: list[str] = []
    n = 0
    for _ in range(draw(st.integers(1, 8))):
        if not turns or turns[-1]["role"] == "assistant":
            blocks = []
            for cid in pending:
                if draw(st.integers(0, 9)):
                    r = {"type": "tool_result", "tool_use_id": cid}
                    body = draw(st.sampled_from(["str", "list", "none"]))
                    if body == "str":
                        r["content"] = draw(_text)
                    elif body == "list":
                        r["content"] = [{"type": "text", "text": draw(_text)}, IMAGE]
                    if draw(st.booleans()):
                        r["is_error"] = True
                    blocks.append(r)
            pending = []
            extra = draw(st.lists(st.sampled_from(["text", "image", "doc"]), max_size=2))
            for e in extra:
                blocks.append({"type": "text", "text": draw(_text)} if e == "text" else IMAGE if e == "image" else DOC)
            if not blocks or (not any(b["type"] == "tool_result" for b in blocks) and draw(st.booleans())):
                turns.append({"role": "user", "content": draw(_text)})
            else:
                turns.append({"role": "user", "content": blocks})
        else:
            if draw(st.booleans()):
                turns.append({"role": "assistant", "content": draw(_text)})
                continue
            blocks = []
            if draw(st.booleans()):
                blocks.append({"type": "thinking", "thinking": draw(_text), "signature": "sig"})
            if draw(st.booleans()):
                blocks.append({"type": "text", "text": draw(_text)})
            for _ in range(draw(st.integers(0 if blocks else 1, 3))):
                n += 1
                pending.append(f"toolu_{n}")
                use = {"type": "tool_use", "id": pending[-1], "name": "search", "input": {"q": draw(_text)}}
                if draw(st.integers(0, 4)) == 0:
                    use["cache_control"] = {"type": "ephemeral"}
                blocks.insert(draw(st.integers(0, len(blocks))), use)
            turns.append({"role": "assistant", "content": blocks})
    return turns, system


@settings(max_examples=300, deadline=None)
@given(anthropic_requests())
def test_anthropic_round_trip_is_lossless(req):
    turns, system = req
    want = {"messages": turns} if system is None else {"system": system, "messages": turns}
    validate(want)  # the strategy writes what the anthropic package accepts
    assert to_anthropic(from_anthropic(turns, system)) == want


def _answered(req: dict) -> bool:
    """Anthropic's rule: each tool_use is answered by a tool_result in the next (user) turn,
    and each tool_result answers a tool_use of the turn before."""
    turns = req["messages"]
    for k, t in enumerate(turns):
        blocks = t["content"] if isinstance(t["content"], list) else []
        uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
        results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if results:
            prev = turns[k - 1]["content"] if k else []
            prev_uses = {b["id"] for b in prev if isinstance(prev, list) and b["type"] == "tool_use"}
            if not results <= prev_uses:
                return False
        if uses:
            nxt = turns[k + 1]["content"] if k + 1 < len(turns) else []
            if uses != {b["tool_use_id"] for b in nxt if isinstance(nxt, list) and b["type"] == "tool_result"}:
                return False
    return True


@settings(max_examples=200, deadline=None)
@given(anthropic_requests(), st.integers(50, 3000))
def test_trimming_keeps_tool_use_with_its_results(req, budget):
    turns, system = req
    msgs = from_anthropic(turns, system)
    # the request itself may hold unanswered calls; trimming must never make one
    builder = ContextBuilder(filters=[TokenBudgetFilter(budget, ApproxClaudeTokenCounter())])
    try:
        out = to_anthropic(builder.transform(msgs))
    except ValueError:  # ContextBudgetError / ToolCallHistoryError: nothing valid to send
        return
    validate(out)
    assert _answered(out)
    assert ApproxClaudeTokenCounter().count_messages(from_anthropic(out["messages"], out.get("system"))) <= budget


@settings(max_examples=200, deadline=None)
@given(conversations(max_units=10))
def test_messages_round_trip_through_anthropic(ms):
    # Anthropic has one system field and no system turn: keep the first system message only
    # when it leads (several become one field, tested below)
    ms = ms[:1] + [m for m in ms[1:] if m.role != "system"]
    req = to_anthropic(ms)
    validate(req)

    def norm(m):  # Anthropic has no empty text block beside tool calls: "" and None say the same
        d = m.to_openai()
        if d.get("tool_calls") and d.get("content") == "":
            d["content"] = None
        for c in d.get("tool_calls") or ():  # input is an object: equal as JSON, re-serialized
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
        return d

    assert [norm(m) for m in from_anthropic(req["messages"], req.get("system"))] == [norm(m) for m in ms]


def test_builder_with_a_system_provider_and_parallel_results():
    turns = [
        {"role": "user", "content": "look up a and b"},
        {"role": "assistant", "content": [{"type": "text", "text": "Both at once."},
                                          {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "a"}},
                                          {"type": "tool_use", "id": "t2", "name": "search", "input": {"q": "b"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A " * 400},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "B", "is_error": True},
                                     {"type": "text", "text": "and summarise"}]},
    ]
    b = ContextBuilder(providers=[StaticPromptProvider("Cite sources.")])
    out = build_anthropic(b, [], system="Be terse.")  # providers only: no history provider
    assert out == {"system": "Cite sources.", "messages": []}
    whole = to_anthropic(from_anthropic(turns, "Be terse."))
    assert whole["messages"][2]["content"][1]["is_error"] is True
    trimmed = build_anthropic(ContextBuilder(filters=[TokenBudgetFilter(60, ApproxClaudeTokenCounter())]),
                              turns, system="Be terse.")
    # the results' turn is split from its text by the trim: the text alone stays, never a lone result
    assert trimmed == {"system": "Be terse.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "and summarise"}]}]}
    assert _answered(whole) and _answered(trimmed)


def test_several_system_messages_become_system_blocks():
    req = to_anthropic([{"role": "system", "content": "A"}, {"role": "system", "content": [
        {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}]}, human("hi")])
    assert req["system"] == [{"type": "text", "text": "A"},
                             {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}]
    validate(req)


def test_tool_use_input_must_be_json():
    bad = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}
    with pytest.raises(MessageValidationError, match=r"messages\[0\]\.tool_calls\[0\]: arguments are not JSON"):
        to_anthropic([bad])


@pytest.mark.parametrize("turns, where", [
    ([{"role": "system", "content": "x"}], r"messages\[0\]\.role"),
    ([{"role": "user"}], r"messages\[0\]\.content: field required"),
    ([{"role": "user", "content": [{"type": "tool_result"}]}], r"messages\[0\]\.content\[0\]\.tool_use_id"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}], r"messages\[0\]\.content\[0\]"),
    ([{"role": "user", "content": [{"text": "no type"}]}], r"messages\[0\]\.content\[0\]"),
])
def test_bad_requests_are_named(turns, where):
    with pytest.raises(MessageValidationError, match=where):
        from_anthropic(turns)


def test_approx_claude_counter_is_labelled_and_counts_blocks():
    c = ApproxClaudeTokenCounter()
    assert c.is_exact is False and "approximation" in type(c).__doc__.lower()
    assert repr(c) == "ApproxClaudeTokenCounter(chars_per_token=3.5)"
    img = from_anthropic([{"role": "user", "content": [IMAGE]}])[0]
    think = from_anthropic([{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "x" * 35, "signature": "s"}, {"type": "text", "text": "ok"}]}])[0]
    assert c.count_message(img) == 4 + 1600
    assert c.count_message(think) == 4 + 10 + 1
    assert c.count_text("a" * 7) == 2 and c != ApproxClaudeTokenCounter(4) and c == ApproxClaudeTokenCounter()
    assert json.loads(from_anthropic([{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"é": 1}}]}])[0].tool_calls[0]["function"]["arguments"]) == {"é": 1}


@settings(max_examples=200, deadline=None)
@given(anthropic_requests(), st.lists(st.tuples(st.integers(0, 10), st.booleans(), st.booleans()),
                                      min_size=1, max_size=6))
def test_incremental_converter_equals_from_anthropic(req, calls):
    from jianmu_fast.integrations.anthropic import AnthropicConverter

    turns, system = req
    conv = AnthropicConverter()
    for cut, edit, drop_system in calls:
        x = [dict(t) for t in turns[:cut]]
        if edit and x:
            x[len(x) // 2] = {"role": x[len(x) // 2]["role"], "content": "edited"}
        s = None if drop_system else system
        got, want = conv.from_anthropic(x, s), from_anthropic(x, s)
        assert [m.model_dump(exclude={"id"}) for m in got] == [m.model_dump(exclude={"id"}) for m in want]


def test_output_is_plain_and_mutable():
    req = to_anthropic(from_anthropic([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]))
    req["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # a common edit
    assert type(req["messages"][-1]["content"][-1]) is dict
