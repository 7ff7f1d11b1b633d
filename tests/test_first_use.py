"""What a first user passes as the state (issue 14 item 7): the history never disappears silently.

``builder.build()`` takes ``{"messages": [...]}`` or the history itself as a bare list; a
state that holds something else but no ``"messages"`` is an error naming what it got.
"""

from __future__ import annotations

import logging

import pytest

from jianmu_fast.batch import build_batch
from jianmu_fast.errors import JianmuError, MessageValidationError
from jianmu_fast.memory.context import ContextBuilder, StateHistoryProvider, StaticPromptProvider
from jianmu_fast.message import StateMessageStore, ai, human, tool
from jianmu_fast.state import StateManager

CALL = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 2}'}}]


def _history():
    return [human("What is 2+2?"), ai(None, tool_calls=CALL), tool("4", tool_call_id="c1"), human("thanks")]


def _dumps(prompt):
    return [m.model_dump_json() for m in prompt]


@pytest.fixture
def builder():
    return ContextBuilder.for_react(system_prompt="You are terse.", tools_desc="- calc: arithmetic",
                                    max_messages=30)


def test_bare_list_is_the_history(builder):
    history = _history()
    want = _dumps(builder.build({"messages": history}))
    assert [m.role for m in builder.build({"messages": history})][-4:] == ["user", "assistant", "tool", "user"]
    assert _dumps(builder.build(history)) == want
    assert _dumps(builder.build(tuple(history))) == want
    # plain chat-completions dicts are accepted too, bare or in a state
    dicts = [m.to_openai() for m in history]
    assert [m.to_openai() for m in builder.build(dicts)] == [m.to_openai() for m in builder.build({"messages": history})]


def test_store_as_the_state(tmp_path):
    store = StateMessageStore(StateManager.sqlite(str(tmp_path / "s.db")))
    store.extend(_history())
    b = ContextBuilder(providers=[StaticPromptProvider("sys"), StateHistoryProvider(annotate=False)])
    assert _dumps(b.build(store)) == _dumps(b.build({"messages": store}))
    assert [m.content for m in b.build(store)][-1] == "thanks"


def test_state_without_messages_is_an_error_naming_the_keys(builder, caplog):
    with caplog.at_level(logging.ERROR, logger="jianmu_fast.context"):
        with pytest.raises(MessageValidationError) as info:
            builder.build({"msgs": _history(), "user_id": 7})
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, JianmuError)
    text = str(err)
    assert "'messages'" in text and "'msgs', 'user_id'" in text and "bare list" in text
    assert not caplog.records  # propagated, not logged and skipped by the error isolation


def test_object_without_the_attribute_is_an_error():
    class State:
        history = _history()

    with pytest.raises(MessageValidationError, match="a State without a 'messages' attribute"):
        ContextBuilder(providers=[StateHistoryProvider()]).build(State())
    with pytest.raises(MessageValidationError, match="a str without a 'messages' attribute"):
        ContextBuilder(providers=[StateHistoryProvider()]).build("hi")


def test_custom_key_is_named():
    with pytest.raises(MessageValidationError, match=r"under 'history'.*keys 'messages'"):
        StateHistoryProvider(messages_key="history").get_messages({"messages": _history()})
    out = StateHistoryProvider(messages_key="history", annotate=False).get_messages({"history": _history()})
    assert [m.content for m in out][-1] == "thanks"


@pytest.mark.parametrize("state", [None, {}, {"messages": None}, {"messages": []}, []])
def test_empty_states_are_an_empty_history(state):
    b = ContextBuilder(providers=[StaticPromptProvider("sys"), StateHistoryProvider()])
    assert [m.content for m in b.build(state)] == ["sys"]


def test_without_a_history_provider_any_state_is_fine():
    b = ContextBuilder(providers=[StaticPromptProvider("sys")])
    assert [m.content for m in b.build({"msgs": [human("hi")]})] == ["sys"]


def test_batch_takes_bare_lists(builder):
    states = [_history(), {"messages": _history()[:1]}]
    assert [_dumps(p) for p in build_batch(builder, states)] == [_dumps(builder.build(s)) for s in states]


def test_history_of_the_wrong_type_is_an_error_not_a_silent_empty_prompt():
    """``{"messages": "hi"}`` must not be logged away by the builder's stage isolation."""
    from jianmu_fast.errors import MessageValidationError
    from jianmu_fast.memory.context import ContextBuilder

    builder = ContextBuilder.for_chat(system_prompt="Be brief.")
    with pytest.raises(MessageValidationError, match=r"local_state\['messages'\]: expected a list of messages.*got str"):
        builder.build({"messages": "hi"})
