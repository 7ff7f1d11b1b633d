"""Message: fields, factories, errors, and the lossless chat-completions round trip."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.message import Message, ai, coerce_messages, human, system, tool

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))

_text = st.text(max_size=30)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _text)
_ids = st.text(alphabet="abcdefghij_0123456789", min_size=1, max_size=12)


@st.composite
def tool_calls(draw):
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        call = {"type": "function", "function": {"name": draw(_ids), "arguments": draw(_text)}}
        if draw(st.booleans()):
            call["id"] = draw(_ids)
        calls.append(call)
    return calls


@st.composite
def openai_dicts(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    d = {"role": role}
    blocks = st.lists(
        st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, _text),
            st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, _text),
        ),
        max_size=3,
    )
    content = draw(st.one_of(_text, blocks, st.none()) if role == "assistant" else st.one_of(_text, blocks))
    if draw(st.booleans()) or content is not None:
        d["content"] = content
    if draw(st.booleans()):
        d["name"] = draw(st.one_of(_ids, st.none()))
    if role == "assistant" and draw(st.booleans()):
        d["tool_calls"] = draw(tool_calls())
    if role == "tool":
        d["tool_call_id"] = draw(_ids)
    for key in draw(st.sets(st.sampled_from(["refusal", "reasoning_content", "audio"]), max_size=2)):
        d[key] = draw(_json_scalar)
    return d


@given(d=openai_dicts())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_round_trip_is_lossless(d):
    m = Message.from_openai(d)
    assert m.to_openai() == d
    again = Message.from_openai(m.to_openai())
    assert again.to_openai() == d
    assert again.model_dump(exclude={"id"}) == m.model_dump(exclude={"id"})


def test_factories_match_the_design_document():
    assert system("You are a helpful assistant.").role == "system"
    assert human("What is 2+2?").role == "user"
    assert ai("The answer is 4.").role == "assistant"
    t = tool('{"result": 4}', name="calculator")
    assert (t.role, t.content, t.name, t.tool_call_id) == ("tool", '{"result": 4}', "calculator", None)
    assert tool("4", tool_call_id="c1").tool_call_id == "c1"


def test_ids_are_stable_uuid4_hex_and_kept_by_copies():
    m = human("hi")
    assert len(m.id) == 32 and int(m.id, 16) >= 0
    assert human("hi").id != m.id
    copy = m.model_copy(update={"content": "changed"})
    assert copy.id == m.id and m.content == "hi"


def test_messages_are_immutable():
    m = human("hi")
    with pytest.raises(Exception):
        m.content = "changed"  # type: ignore[misc]


def test_assistant_with_only_tool_calls_has_none_content():
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{\"x\": 1}"}}
    m = ai(None, tool_calls=[call])
    assert m.to_openai() == {"role": "assistant", "content": None, "tool_calls": [call]}


def test_call_without_id_is_accepted():
    m = ai(None, tool_calls=[{"type": "function", "function": {"name": "calc", "arguments": "{}"}}])
    assert "id" not in m.tool_calls[0]


@pytest.mark.parametrize(
    "d,message",
    [
        ({"role": "robot", "content": "x"}, "message.role: Input should be 'system', 'user', 'assistant' or 'tool'"),
        ({"content": "x"}, "message.role: field required"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": ""}}]},
         "message.tool_calls: tool_calls[0].function.name must be a non-empty string"),
        ({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"x": 1}}}]},
         "message.tool_calls: tool_calls[0].function.arguments must be a JSON string, got dict"),
        ({"role": "user", "content": [{"type": "text"}]},
         "message.content: content block [0] of type 'text' needs a string 'text'"),
        ({"role": "user", "content": [{"text": "no type"}]}, "content block [0] needs a string 'type'"),
    ],
)
def test_bad_dicts_name_the_field(d, message):
    with pytest.raises(MessageValidationError) as info:
        Message.from_openai(d)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_item_in_a_list_names_its_index():
    with pytest.raises(MessageValidationError, match=r"^messages\[2\]: expected a Message or a chat-completions dict, got int$"):
        coerce_messages([human("a"), {"role": "user", "content": "b"}, 7])
    with pytest.raises(MessageValidationError, match=r"messages\[1\]\.tool_calls"):
        coerce_messages([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": "nope"}])
    with pytest.raises(MessageValidationError, match="expected a list of messages, got str"):
        coerce_messages("hello")


def test_direct_construction_errors_are_value_errors():
    with pytest.raises(ValueError, match="content"):
        Message(role="user", content=5)
    with pytest.raises(ValueError, match="extra must not hold message fields"):
        Message(role="user", content="x", extra={"role": "system"})


def test_text_joins_text_blocks():
    m = human([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "b"}])
    assert m.text() == "a\nb"
    assert ai(None, tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]).text() == ""


_CALLS = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


@pytest.mark.parametrize("update", [
    None,
    {},
    {"content": "note", "metadata": {"semantic_kind": "self_tool_plan"}},
    {"content": [{"type": "text", "text": "b", "extra": [1, {"x": 2}]}]},
    {"tool_calls": [{"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
    {"tool_call_id": "c9", "name": "calc"},
    {"content": None},
])
@pytest.mark.parametrize("make", [
    lambda: ai(None, tool_calls=_CALLS, metadata={"k": 1}),
    lambda: human("a", name="n"),
    lambda: Message.from_openai({"role": "assistant", "content": "x", "refusal": None}),
])
def test_model_copy_is_pydantics_shallow_copy_with_frozen_lists(update, make):
    """The shallow ``model_copy`` (the hot loop's annotated copies) builds exactly what
    pydantic's does, with new content blocks and tool calls frozen, and leaves the original alone."""
    from pydantic import BaseModel

    from jianmu_fast.message.model import FrozenDict, FrozenList, freeze

    m = make()
    before = m.model_dump()
    ours = m.model_copy(update=update)
    frozen = {k: freeze(v) if k in ("content", "tool_calls") else v for k, v in (update or {}).items()}
    theirs = BaseModel.model_copy(m, update=frozen)
    assert type(ours) is Message and ours is not m
    assert ours.__dict__ == theirs.__dict__ and ours.model_fields_set == theirs.model_fields_set
    assert ours.__pydantic_extra__ is None and ours.__pydantic_private__ is None
    assert ours == theirs and ours.to_openai() == theirs.to_openai() and ours.id == m.id
    assert m.model_dump() == before and ours.__dict__ is not m.__dict__
    for key in ("content", "tool_calls"):
        v = getattr(ours, key)
        if isinstance(v, list):
            assert type(v) is FrozenList and all(type(x) is FrozenDict for x in v)
            with pytest.raises(TypeError):
                v.append({})
    with pytest.raises(Exception):
        ours.content = "changed"  # frozen model
    # unknown keys, deep copies and subclasses keep pydantic's own path
    assert m.model_copy(update={"bogus": 1}).__dict__["bogus"] == 1
    deep = m.model_copy(update=update, deep=True)
    assert deep == ours


@pytest.mark.parametrize("make", [
    lambda: ai(None, tool_calls=_CALLS, metadata={"k": 1}),
    lambda: tool("r", tool_call_id="c1", name="f", metadata={"tool_result": 4}),
    lambda: Message.from_openai({"role": "assistant", "content": [{"type": "text", "text": "x"}], "refusal": None}),
])
def test_with_text_equals_model_copy(make):
    """The annotations' copy helper builds what ``model_copy`` builds for a text content."""
    from jianmu_fast.message.model import _with_text

    m = make()
    before = m.model_dump()
    ours = _with_text(m, "note", {"semantic_kind": "x"})
    theirs = m.model_copy(update={"content": "note", "metadata": {"semantic_kind": "x"}})
    assert ours.__dict__ == theirs.__dict__ and ours.model_fields_set == theirs.model_fields_set
    assert ours.__pydantic_extra__ is None and ours.__pydantic_private__ is None and ours is not m
    assert ours.to_openai() == theirs.to_openai() and m.model_dump() == before
