"""ContextBuilder: order, argument checks, error isolation, tools_schema plumbing."""

from __future__ import annotations

import logging

import pytest

from jianmu_fast.errors import ContextBudgetError, MessageValidationError
from jianmu_fast.memory.context import (
    ContextBuilder,
    ContextBuilderProtocol,
    ContextFilter,
    MaxMessagesFilter,
    MessageProvider,
    StaticPromptProvider,
    TokenBudgetFilter,
    TokenCounterProtocol,
    ToolsDescProvider,
    SimpleTokenCounter,
)
from jianmu_fast.message import Message, human, system


class History:
    def get_messages(self, local_state, global_state=None, ctx=None):
        return local_state["messages"]


class Boom:
    def get_messages(self, local_state, global_state=None, ctx=None):
        raise RuntimeError("provider exploded")


class BoomFilter:
    def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
        raise KeyError("filter exploded")


class ToolsAware:
    def __init__(self):
        self.seen = []

    def get_messages(self, local_state, global_state=None, ctx=None, tools_schema=None):
        self.seen.append(tools_schema)
        return []


def test_providers_run_in_order_then_filters_in_order():
    order = []

    class Tag:
        def __init__(self, name):
            self.name = name

        def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
            order.append(self.name)
            return list(messages) + [system(self.name)]

    b = ContextBuilder(
        providers=[StaticPromptProvider("p1"), ToolsDescProvider("- t"), History()],
        filters=[Tag("f1"), Tag("f2")],
    )
    out = b.build({"messages": [human("hi")]})
    assert [m.content for m in out] == ["p1", "Available tools:\n- t", "hi", "f1", "f2"]
    assert order == ["f1", "f2"]
    assert all(isinstance(m, Message) for m in out)


def test_provider_dicts_are_coerced_and_malformed_output_propagates():
    class Dicts:
        def get_messages(self, local_state, global_state=None, ctx=None):
            return [{"role": "user", "content": "from a dict"}]

    class Bad:
        def get_messages(self, local_state, global_state=None, ctx=None):
            return [{"role": "user", "content": "ok"}, {"role": "robot"}]

    out = ContextBuilder(providers=[Dicts()]).build({})
    assert [m.content for m in out] == ["from a dict"]
    # skipping a provider whose messages are malformed would silently send a prompt without
    # them (e.g. without the history): the MessageValidationError names the stage and index
    with pytest.raises(MessageValidationError, match=r"^providers\[1\] \(Bad\) output\[1\]\.role: Input should be"):
        ContextBuilder(providers=[Dicts(), Bad()]).build({})


def test_a_failing_provider_or_filter_is_logged_and_skipped(caplog):
    b = ContextBuilder(providers=[StaticPromptProvider("sys"), Boom(), History()], filters=[BoomFilter(), MaxMessagesFilter(1)])
    with caplog.at_level(logging.ERROR, logger="jianmu_fast.context"):
        out = b.build({"messages": [human("a"), human("b")]})
    assert [m.content for m in out] == ["sys", "b"]
    text = caplog.text
    assert "providers[1] (Boom) failed" in text and "provider exploded" in text
    assert "filters[0] (BoomFilter) failed" in text


def test_invariant_errors_propagate():
    b = ContextBuilder(providers=[StaticPromptProvider("x" * 400), History()], filters=[TokenBudgetFilter(50)])
    with pytest.raises(ContextBudgetError):
        b.build({"messages": [human("hi")]})


def test_tools_schema_reaches_providers_and_filters_that_take_it():
    aware = ToolsAware()
    seen = []

    class KwFilter:
        def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
            seen.append(kwargs.get("tools_schema"))
            return messages

    tools = [{"type": "function", "function": {"name": "read_file"}}]
    ContextBuilder(providers=[aware, StaticPromptProvider("s")], filters=[KwFilter()]).build({}, tools_schema=tools)
    assert aware.seen == [tools] and seen == [tools]


def test_transform_runs_filters_only_and_accepts_dicts():
    b = ContextBuilder(providers=[Boom()], filters=[MaxMessagesFilter(1)])
    out = b.transform([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert [m.content for m in out] == ["b"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"providers": [StaticPromptProvider("a"), {"x": 1}]},
         "providers[1]: expected a MessageProvider (get_messages(local_state, global_state=None, ctx=None)), got dict"),
        ({"filters": [MaxMessagesFilter(3), "trim"]}, "filters[1]: expected a ContextFilter (apply(messages"),
        ({"providers": StaticPromptProvider("a")}, "providers: expected a list of MessageProvider, got StaticPromptProvider"),
    ],
)
def test_construction_checks_arguments(kwargs, message):
    with pytest.raises(TypeError) as info:
        ContextBuilder(**kwargs)
    assert message in str(info.value)


def test_protocols_are_runtime_checkable():
    assert isinstance(StaticPromptProvider("a"), MessageProvider)
    assert isinstance(MaxMessagesFilter(2), ContextFilter)
    assert isinstance(SimpleTokenCounter(), TokenCounterProtocol)
    assert isinstance(ContextBuilder(), ContextBuilderProtocol)
    assert not isinstance(object(), MessageProvider)


def test_static_and_tools_providers_are_stable_and_validate():
    p = StaticPromptProvider("You are a helpful assistant.")
    first, second = p.get_messages({}), p.get_messages({})
    assert first == second and first[0] is second[0]
    assert ToolsDescProvider("").get_messages({}) == []
    with pytest.raises(TypeError, match="text: expected a str, got int"):
        StaticPromptProvider(3)
    with pytest.raises(ValueError, match="must contain '{tools_desc}'"):
        ToolsDescProvider("- t", template="Tools:").get_messages({})
    assert ToolsDescProvider("- t", template="Tools ->\n{tools_desc}").get_messages({})[0].content == "Tools ->\n- t"
