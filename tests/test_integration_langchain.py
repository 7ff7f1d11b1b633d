"""LangChain <-> Message conversion (lossless both ways) and the LangGraph hook in real graphs."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import (AIMessage, BaseMessage, ChatMessage, FunctionMessage, HumanMessage,
                                     SystemMessage, ToolMessage)
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic import Field
from strategies import conversations

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.integrations.langchain import (MessageConverter, from_langchain, message_from_langchain,
                                                pre_model_hook, to_langchain)
from jianmu_fast.memory.context import (ContextBuilder, StateHistoryProvider, StaticPromptProvider,
                                        TiktokenTokenCounter, TokenBudgetFilter)
from jianmu_fast.message import Message, ai, human, tool as tool_msg
from jianmu_fast.message.sanitize import sanitize_tool_call_history_report

# -- strategies ---------------------------------------------------------------------------------

_text = st.text(alphabet=st.sampled_from(list("ab c{}\":é中\n")), max_size=20)
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _text),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(_text, inner, max_size=3)), max_leaves=6)
_kwargs = st.dictionaries(st.sampled_from(["refusal", "reasoning_content", "tool_calls", "name", "x"]), _json,
                          max_size=3)
_blocks = st.lists(st.one_of(_text, st.builds(lambda t: {"type": "text", "text": t}, _text),
                             st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, _text)),
                   max_size=3)
_content = st.one_of(_text, _blocks)
_ids = st.one_of(st.none(), st.text(alphabet="abc123", min_size=1, max_size=6))


@st.composite
def lc_message(draw) -> BaseMessage:
    kind = draw(st.sampled_from(["system", "human", "ai", "tool"]))
    kw: dict = {"content": draw(_content), "id": draw(_ids)}
    if draw(st.booleans()):
        kw["name"] = draw(_text)
    if draw(st.booleans()):
        kw["additional_kwargs"] = draw(_kwargs)
    if draw(st.booleans()):
        kw["response_metadata"] = draw(st.dictionaries(_text, _json, max_size=2))
    if kind == "ai":
        kw["tool_calls"] = draw(st.lists(st.builds(
            lambda n, a, i: {"name": n, "args": a, "id": i, "type": "tool_call"},
            st.sampled_from(["search", "calc"]), st.dictionaries(_text, _json, max_size=2), _ids), max_size=2))
        kw["invalid_tool_calls"] = draw(st.lists(st.builds(
            lambda a, i: {"name": None, "args": a, "id": i, "error": "bad json", "type": "invalid_tool_call"},
            _text, _ids), max_size=1))
        if draw(st.booleans()):
            kw["usage_metadata"] = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
        return AIMessage(**kw)
    if kind == "tool":
        return ToolMessage(tool_call_id=draw(st.text(alphabet="abc", max_size=4)), status=draw(
            st.sampled_from(["success", "error"])), artifact=draw(st.one_of(st.none(), _json)), **kw)
    return (SystemMessage if kind == "system" else HumanMessage)(**kw)


@st.composite
def decorated_conversation(draw) -> list[Message]:
    """A valid conversation whose messages also carry metadata, extra keys and None fields."""
    out = []
    for m in draw(conversations(max_units=8)):
        upd = {}
        if draw(st.booleans()):
            upd["metadata"] = {"semantic_kind": draw(_text), "n": draw(st.integers(0, 3))}
        if draw(st.booleans()):
            upd["extra"] = {"refusal": draw(_text)}
        if draw(st.booleans()) and m.role == "user":
            upd["name"] = "alice"
        out.append(Message(**{**m.model_dump(exclude_unset=True), **upd}) if upd else m)
    return out


# -- round trips ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(lc_message(), max_size=6))
def test_langchain_round_trip_is_lossless(lcs):
    ms = from_langchain(lcs)
    back = to_langchain(ms)
    assert back == lcs
    assert [type(m) for m in back] == [type(m) for m in lcs]
    again = from_langchain(back)  # a LangChain id None gets a fresh uuid each time; all else is equal
    assert [m.model_dump(exclude={"id"}) for m in again] == [m.model_dump(exclude={"id"}) for m in ms]
    assert [m.id for m, lc in zip(again, lcs) if lc.id is not None] == [lc.id for lc in lcs if lc.id is not None]


@settings(max_examples=300, deadline=None)
@given(decorated_conversation())
def test_message_round_trip_is_lossless(ms):
    back = from_langchain(to_langchain(ms))
    assert back == ms
    assert [m.to_openai() for m in back] == [m.to_openai() for m in ms]


def test_edge_fields_survive_both_ways():
    odd = [
        Message(role="assistant", content=None, tool_calls=[
            {"type": "function", "function": {"name": "f", "arguments": "not json"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"a":1}'}}]),
        Message(role="user", content=[{"type": "input_audio", "input_audio": {"data": "..."}}], name=None),
        tool_msg("r", tool_call_id="c2", metadata={"tool_result": {"ok": True}}),
    ]
    lcs = to_langchain(odd)
    assert lcs[0].invalid_tool_calls[0]["args"] == "not json"  # LangChain's own representation
    assert lcs[0].tool_calls == [{"name": "g", "args": {"a": 1}, "id": "c2", "type": "tool_call"}]
    assert from_langchain(lcs) == odd
    assert [m.to_openai() for m in from_langchain(lcs)] == [m.to_openai() for m in odd]


def test_real_shaped_langchain_messages():
    lcs = [
        SystemMessage("You are terse.", id="s"),
        HumanMessage(["look at", {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], id="h"),
        AIMessage([{"type": "text", "text": "calling"}], id="run-1", tool_calls=[
            {"name": "search", "args": {"q": "x"}, "id": "call_1"}], additional_kwargs={"refusal": None},
            response_metadata={"model_name": "gpt-4o", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}),
        ToolMessage("found", tool_call_id="call_1", name="search", artifact={"rows": 3}, id="t"),
    ]
    ms = from_langchain(lcs)
    assert [m.role for m in ms] == ["system", "user", "assistant", "tool"]
    assert ms[1].content[0] == {"type": "text", "text": "look at"}
    assert ms[2].extra == {"refusal": None}
    assert ms[2].metadata["langchain"]["usage_metadata"]["total_tokens"] == 15
    assert ms[3].metadata == {"langchain": {"artifact": {"rows": 3}}}
    assert sanitize_tool_call_history_report(ms).changed is False
    assert to_langchain(ms) == lcs


@pytest.mark.parametrize("bad", [ChatMessage("x", role="critic"), FunctionMessage("x", name="f")])
def test_unsupported_message_types_are_named(bad):
    with pytest.raises(MessageValidationError, match=r"messages\[1\]: LangChain message type"):
        from_langchain([HumanMessage("ok"), bad])


def test_converter_reuses_unchanged_messages_only():
    conv, h = MessageConverter(), HumanMessage("a", id="1")
    first = conv(h)
    assert conv(h) is first
    h.content = "b"
    assert conv(h).content == "b"


def test_import_is_lazy_and_missing_package_names_the_extra():
    code = ("import sys, jianmu_fast.integrations.langchain as m; "
            "assert 'langchain_core' not in sys.modules, 'eager import'; "
            "sys.modules['langchain_core.messages'] = None\n"
            "try:\n    m.to_langchain([{'role': 'user', 'content': 'x'}])\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'jianmu_fast[langchain]'" in out


# -- the LangGraph hook ---------------------------------------------------------------------------


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's scripted fake chat model, recording what it receives; tools bind to itself."""

    received: list = Field(default_factory=list)

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.received.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return ("result for " + q + ". ") * 40


def script(rounds: int) -> list[AIMessage]:
    calls = [AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": f"q{i}"}, "id": f"c{i}"},
                                       {"name": "lookup", "args": {"q": f"r{i}"}, "id": f"d{i}"}])
             for i in range(rounds)]
    return calls + [AIMessage("done")]


def valid(out) -> bool:
    return sanitize_tool_call_history_report(from_langchain(out), on_broken_tail="drop").changed is False


BUDGET = 700
COUNTER = TiktokenTokenCounter("o200k_base")


def check_run(model, state, rounds, system_prompt=None, exact=True):
    msgs = state["messages"]
    assert [m.type for m in msgs] == ["human"] + ["ai", "tool", "tool"] * rounds + ["ai"]
    assert msgs[-1].content == "done"
    assert set(state) == {"messages"}  # llm_input_messages never reaches the state
    assert len(model.received) == rounds + 1
    for k, got in enumerate(model.received):
        assert valid(got)
        assert COUNTER.count_messages(from_langchain(got)) <= BUDGET
        if system_prompt:
            assert got[0].type == "system" and got[0].content == system_prompt
        history = [m for m in got if m.type != "system"]
        state_prefix = msgs[:1 + 3 * k]
        suffix = state_prefix[len(state_prefix) - len(history):]
        if exact:  # a suffix of the state, the very objects
            assert history == suffix and all(a is b for a, b in zip(history, suffix))
        else:  # StateHistoryProvider annotates copies: same ids, roles and calls
            assert [(m.id, m.type, getattr(m, "tool_calls", None)) for m in history] == [
                (m.id, m.type, getattr(m, "tool_calls", None)) for m in suffix]
    assert len(model.received[-1]) < len(msgs)  # it did trim


def test_create_react_agent_with_pre_model_hook():
    from langgraph.prebuilt import create_react_agent
    from langgraph.warnings import LangGraphDeprecatedSinceV10

    rounds = 4
    model = ScriptedModel(responses=script(rounds))
    builder = ContextBuilder(filters=[TokenBudgetFilter(BUDGET, COUNTER)])
    with pytest.warns(LangGraphDeprecatedSinceV10):  # moved to langchain.agents: ContextBuilderMiddleware
        graph = create_react_agent(model, [lookup], pre_model_hook=pre_model_hook(builder))
    state = graph.invoke({"messages": [HumanMessage("research this", id="u0")]})
    check_run(model, state, rounds)
    assert state["messages"][0].id == "u0"


def test_hand_built_state_graph_with_providers():
    rounds = 3
    model = ScriptedModel(responses=script(rounds))
    builder = ContextBuilder(providers=[StaticPromptProvider("You research."), StateHistoryProvider()],
                             filters=[TokenBudgetFilter(BUDGET, COUNTER)])
    hook = pre_model_hook(builder)

    def agent(state: MessagesState):
        return {"messages": [model.invoke(hook(state)["llm_input_messages"])]}

    def route(state: MessagesState):
        return "tools" if state["messages"][-1].tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    state = g.compile().invoke({"messages": [HumanMessage("research this")]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_run(model, state, rounds, exact=False)
    assert "semantic_kind" not in str(state["messages"])  # annotations stayed in the prompt
    for got in model.received:
        assert got[0].type == "system" and "You research." in got[0].content


def test_hook_returns_the_state_objects_for_kept_messages():
    h = [HumanMessage("a", id="1"), AIMessage("b", id="2"), HumanMessage("c", id="3")]
    hook = pre_model_hook(ContextBuilder(filters=[TokenBudgetFilter(10_000, COUNTER)]))
    out = hook({"messages": h})["llm_input_messages"]
    assert all(x is y for x, y in zip(out, h)) and len(out) == 3
    with pytest.raises(TypeError, match="builder: expected a ContextBuilder"):
        pre_model_hook(object())


def test_arguments_are_json_of_the_args():
    m = from_langchain([AIMessage("", tool_calls=[{"name": "f", "args": {"é": 1}, "id": "c"}])])[0]
    assert m.tool_calls[0]["function"]["arguments"] == '{"é": 1}'
    assert json.loads(m.tool_calls[0]["function"]["arguments"]) == {"é": 1}
    assert from_langchain(to_langchain([ai(None, tool_calls=m.tool_calls), human("x")]))[0].content is None
