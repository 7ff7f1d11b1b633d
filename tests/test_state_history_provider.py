"""StateHistoryProvider: the design document's annotations, sources, caching and the hot loop."""

from __future__ import annotations

import json
import logging
import random
from types import SimpleNamespace

import pytest

from jianmu_fast.config.prompts import history_semantics_prompt
from jianmu_fast.errors import MessageValidationError
from jianmu_fast.memory.context import ContextBuilder, StateHistoryProvider, StaticPromptProvider
from jianmu_fast.memory.context.providers import state_history
from jianmu_fast.message import Message, StateMessageStore, ai, human, tool
from jianmu_fast.state import StateManager


def call(cid, name="calc", args='{"x": 1}'):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def turn(k):
    """One user turn with a tool call: 4 messages, 2 of them annotatable."""
    cid = f"call_{k % 3}"  # ids are reused across turns, as real traces do
    return [
        human(f"question {k}"),
        ai(f"thinking {k}", tool_calls=[call(cid, args=json.dumps({"k": k}))]),
        tool(f"result {k}", tool_call_id=cid, metadata={"tool_result": {"k": k, "ok": True}}),
        ai(f"answer {k}"),
    ]


def dump(ms):
    return [m.model_dump() for m in ms]


# -- the design document ----------------------------------------------------------------------


def test_annotations_follow_the_design_document():
    h = turn(0)
    before = dump(h)
    out = StateHistoryProvider().get_messages({"messages": h})
    assert dump(h) == before  # stored messages are never mutated
    sem, user, plan, obs, answer = out
    assert (sem.role, sem.content) == ("system", history_semantics_prompt())
    assert user is h[0] and answer is h[3]
    assert plan.content == (
        "This assistant message records your own previous tool-call decision (self_tool_plan); it is not a new "
        "request. Its calls are attached; their results follow as tool messages.\nOriginal message: thinking 0"
    )
    assert plan.metadata == {"semantic_kind": "self_tool_plan"} and plan.tool_calls == h[1].tool_calls
    assert plan.id == h[1].id
    receipt = json.loads(obs.content)
    assert receipt == {
        "note": state_history.RECEIPT_NOTE,
        "tool": "calc",
        "tool_call_id": "call_0",
        "result": {"k": 0, "ok": True},
        "content": "result 0",
    }
    assert "execution receipt" in receipt["note"]
    assert obs.content == json.dumps(receipt, sort_keys=True, ensure_ascii=False)
    assert obs.metadata == {"tool_result": {"k": 0, "ok": True}, "semantic_kind": "tool_observation"}
    assert obs.tool_call_id == "call_0"


def test_receipt_omits_content_equal_to_the_result_and_prefers_the_tool_name():
    h = [ai(None, tool_calls=[call("c1", name="calc")]),
         tool('{"v": 4}', name="calculator", tool_call_id="c1", metadata={"tool_result": {"v": 4}})]
    plan, obs = StateHistoryProvider().get_messages({"messages": h})[1:]
    assert "Original message" not in plan.content
    assert json.loads(obs.content) == {"note": state_history.RECEIPT_NOTE, "tool": "calculator",
                                       "tool_call_id": "c1", "result": {"v": 4}}


def test_no_annotation_no_semantics_message():
    h = [human("hi"), ai("hello"), tool("r", tool_call_id="c9")]  # tool without tool_result: unchanged
    out = StateHistoryProvider().get_messages({"messages": h})
    assert out == h and all(a is b for a, b in zip(out, h))


def test_annotate_false_passes_the_history_through():
    h = turn(1)
    out = StateHistoryProvider(annotate=False).get_messages({"messages": h})
    assert all(a is b for a, b in zip(out, h)) and len(out) == 4


def test_semantics_text_follows_the_prompt_config(monkeypatch):
    p = StateHistoryProvider()
    first = p.get_messages({"messages": turn(0)})[0]
    assert p.get_messages({"messages": turn(0)})[0] is first  # one message object while the text holds
    import jianmu_fast.config.prompts as prompts

    monkeypatch.setattr(prompts, "history_semantics_prompt", lambda: "History semantics: custom")
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics: custom"


def test_semantics_text_is_resolved_again_after_clear_or_recheck_interval(config_sandbox, monkeypatch):
    from jianmu_fast.config import clear_config_cache

    yaml_file = config_sandbox / "jianmu.yaml"
    yaml_file.write_text("prompt:\n  history_semantics_prompt: History semantics one.\n")
    monkeypatch.setattr(state_history, "_RECHECK_NS", 10**15)  # within the interval: no system calls
    p = StateHistoryProvider()
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics one."
    yaml_file.write_text("prompt:\n  history_semantics_prompt: History semantics, two.\n")
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics one."
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics one."
    clear_config_cache()  # looked at again at once
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics, two."
    yaml_file.write_text("prompt:\n  history_semantics_prompt: History semantics, three!\n")
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics, two."
    p._sem_until = 0  # the interval is over: the edited file is seen (mtime/size cache key)
    assert p.get_messages({"messages": turn(0)})[0].content == "History semantics, three!"
    yaml_file.write_text("prompt:\n  history_semantics_prompt: [broken\n")
    clear_config_cache()
    for _ in range(2):  # a malformed file raises at every call, never a stale text
        with pytest.raises(Exception, match="malformed YAML"):
            p.get_messages({"messages": turn(0)})


# -- sources ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dict", "memory", "sqlite", "store", "object"])
def test_sources(kind, tmp_path):
    h = turn(2)
    if kind == "dict":
        state = {"hist": h}
    elif kind in ("memory", "sqlite"):
        state = StateManager() if kind == "memory" else StateManager.sqlite(tmp_path / "s.db", synchronous="NORMAL")
        state.append_messages("hist", h)
    elif kind == "store":
        store = StateMessageStore(key="other")
        store.extend(h)
        state = {"hist": store}
    else:
        state = SimpleNamespace(hist=h)
    out = StateHistoryProvider("hist").get_messages(state)
    assert [m.id for m in out[1:]] == [m.id for m in h]
    assert [m.metadata.get("semantic_kind") for m in out] == [
        "history_semantics", None, "self_tool_plan", "tool_observation", None]
    if kind in ("memory", "sqlite"):
        state.close()


def test_missing_history_is_empty_and_a_bad_one_is_a_clear_error():
    p = StateHistoryProvider()
    assert p.get_messages({}) == [] and p.get_messages(None) == []
    with pytest.raises(MessageValidationError, match=r"local_state\['messages'\]: expected a list of messages"):
        p.get_messages({"messages": "hello"})
    with pytest.raises(MessageValidationError, match=r"local_state\['messages'\]\[1\]\.role"):
        p.get_messages({"messages": [human("a"), {"role": "robot"}]})


def test_dicts_are_coerced_once_and_recoerced_when_edited_in_place():
    d0 = {"role": "user", "content": "q"}
    d1 = {"role": "assistant", "content": None, "tool_calls": [call("c1")]}
    d2 = {"role": "tool", "content": "r", "tool_call_id": "c1"}
    state = {"messages": [d0, d1, d2]}
    p = StateHistoryProvider()
    first = p.get_messages(state)
    second = p.get_messages(state)
    assert all(a is b for a, b in zip(first, second)) and p.cache_info().annotated == 1
    d0["content"] = "edited"
    third = p.get_messages(state)
    assert third[1].content == "edited" and third[2] is first[2]
    assert d0 == {"role": "user", "content": "edited"}  # the stored dict is not touched


# -- working memory ---------------------------------------------------------------------------


class _LastTwo:
    def __init__(self):
        self.calls = []

    def build_view(self, messages, local_state, global_state, ctx):
        self.calls.append((len(messages), local_state, global_state, ctx))
        return messages[-2:]


def test_working_memory_view_replaces_the_history():
    wm = _LastTwo()
    state = {"messages": turn(3)}
    out = StateHistoryProvider(working_memory=wm).get_messages(state, "g", "c")
    assert wm.calls == [(4, state, "g", "c")]
    assert out[0].content == history_semantics_prompt()  # the receipt is still in the view
    assert [m.role for m in out[1:]] == ["tool", "assistant"]
    wm2 = SimpleNamespace(build_view=lambda m, *a: [human("summary")])
    assert [m.content for m in StateHistoryProvider(working_memory=wm2).get_messages(state)] == ["summary"]
    with pytest.raises(TypeError, match="build_view"):
        StateHistoryProvider(working_memory=object())


def test_working_memory_error_is_isolated_by_the_builder(caplog):
    bad = SimpleNamespace(build_view=lambda *a: 1 / 0)
    b = ContextBuilder(providers=[StaticPromptProvider("sys"), StateHistoryProvider(working_memory=bad)])
    with caplog.at_level(logging.ERROR, logger="jianmu_fast.context"):
        assert [m.content for m in b.build({"messages": turn(0)})] == ["sys"]
    assert any("StateHistoryProvider" in r.getMessage() for r in caplog.records)


# -- the hot loop -----------------------------------------------------------------------------


def test_replaying_1000_messages_annotates_each_message_once():
    conversation = [m for k in range(250) for m in turn(k)]
    p = StateHistoryProvider()
    builder = ContextBuilder(providers=[StaticPromptProvider("sys"), p])
    history: list[Message] = []
    previous: list[Message] = []
    for k in range(250):
        history.extend(conversation[4 * k : 4 * k + 4])  # the agent appends in place, as loops do
        out = builder.build({"messages": history})
        assert len(out) == 2 + len(history)
        assert all(a is b for a, b in zip(out, previous))  # older messages: the very same objects
        previous = out
    info = p.cache_info()
    assert info.annotated == 500  # 250 plans + 250 receipts, each once
    assert info.reused == 0  # append-only growth reuses the previous output outright
    fresh = StateHistoryProvider().get_messages({"messages": history})
    assert [m.model_dump_json() for m in fresh] == [m.model_dump_json() for m in previous[1:]]


def test_retention_sliding_window_reuses_annotations_by_identity():
    store = StateMessageStore(max_messages=40)
    p = StateHistoryProvider()
    for k in range(60):
        store.extend(turn(k))
        out = p.get_messages({"messages": store})
        assert [m.model_dump_json() for m in out] == [
            m.model_dump_json() for m in StateHistoryProvider().get_messages({"messages": store})]
    info = p.cache_info()
    assert info.annotated == 120 and info.reused > 0 and info.size <= 2 * 40 + 256


def test_the_same_message_object_twice_and_random_edits_match_a_fresh_provider():
    rng = random.Random(1234)
    pool = [m for k in range(30) for m in turn(k)] + [tool("x", tool_call_id="call_1", metadata={"tool_result": 1})]
    p = StateHistoryProvider()
    history = pool[:8]
    for _ in range(200):
        op = rng.random()
        if op < 0.5:
            history = history + [rng.choice(pool)]  # may repeat an object already in the history
        elif op < 0.7 and history:
            del history[rng.randrange(len(history))]
        elif op < 0.85:
            history = history[rng.randrange(len(history) + 1):] + history[:0]
        else:
            history = rng.sample(history, len(history))
        got = p.get_messages({"messages": history})
        want = StateHistoryProvider().get_messages({"messages": history})
        assert [m.model_dump_json() for m in got] == [m.model_dump_json() for m in want]


def test_tool_name_comes_from_the_adjacent_call():
    obs = tool("r", tool_call_id="c1", metadata={"tool_result": 1})
    a = [ai(None, tool_calls=[call("c1", name="alpha")]), obs]
    b = [ai(None, tool_calls=[call("c1", name="beta")]), obs]
    p = StateHistoryProvider()
    assert json.loads(p.get_messages({"messages": a})[2].content)["tool"] == "alpha"
    assert json.loads(p.get_messages({"messages": b})[2].content)["tool"] == "beta"


def test_in_place_edits_of_one_growing_list_match_a_fresh_provider():
    """The agent loop's list, edited in place (the snapshot grows first, then is compared)."""
    rng = random.Random(99)
    pool = [m for k in range(30) for m in turn(k)]
    p = StateHistoryProvider()
    history = list(pool[:6])
    state = {"messages": history}
    for _ in range(300):
        op = rng.random()
        if op < 0.55:
            history.extend(rng.sample(pool, rng.randint(1, 3)))
        elif op < 0.7 and history:
            history[rng.randrange(len(history))] = rng.choice(pool)
        elif op < 0.8 and history:
            del history[rng.randrange(len(history))]
        elif op < 0.9:
            history.insert(rng.randrange(len(history) + 1), rng.choice(pool))
            history.append(rng.choice(pool))
        else:
            history[0:0] = []  # no change: the repeated call
        got = p.get_messages(state)
        want = StateHistoryProvider().get_messages({"messages": list(history)})
        assert [m.model_dump_json() for m in got] == [m.model_dump_json() for m in want]


def test_a_failing_comparison_leaves_the_provider_consistent():
    class Boom:
        def __eq__(self, other):
            raise RuntimeError("no comparison")

        __hash__ = object.__hash__

    first = human("q", metadata={"x": Boom()})
    twin = first.model_copy(update={"metadata": {"x": Boom()}})  # another object: compared field by field
    history = [first, ai("a")]
    p = StateHistoryProvider()
    p.get_messages({"messages": history})
    more = human("more")
    with pytest.raises(RuntimeError, match="no comparison"):
        p.get_messages({"messages": [twin, history[1], more]})
    history.append(more)  # the original list grown the same way: must not reuse a half-done state
    assert [m.content for m in p.get_messages({"messages": history})] == ["q", "a", "more"]
    assert [m.content for m in p.get_messages({"messages": history})] == ["q", "a", "more"]


def test_switching_annotate_takes_effect_at_once():
    hist = [m for k in range(3) for m in turn(k)]
    p = StateHistoryProvider()
    on = dump(p.get_messages({"messages": hist}))
    p.annotate = False
    assert dump(p.get_messages({"messages": hist})) == dump(StateHistoryProvider(annotate=False).get_messages(
        {"messages": hist}))
    p.annotate = True
    assert dump(p.get_messages({"messages": hist})) == on
