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
