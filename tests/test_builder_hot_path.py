"""The builder's own prompt along a growing history (``ContextBuilder._provide_hot``).

A preset whose providers are fixed ones followed by ``StateHistoryProvider`` and whose
filters are the library's trimming filters keeps its prompt (before the filters) between
calls and extends it by the new history. These tests pin what invalidates that prompt: any
edit of the history other than appending, a changed fixed provider, a changed semantics
note, changed ``providers``/``filters`` lists, a method replaced on an instance; and that the
kept list never leaks to a caller, pickles away, and survives threads. Every output is
compared with a fresh builder's (no state) on the same input. The context-editing stages on
the same path: ``tests/test_builder_hot_editing.py``.
"""

from __future__ import annotations

import copy
import json
import pickle
import threading

import pytest

from jianmu_fast.config import prompts
from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    StateHistoryProvider,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
    ToolsDescProvider,
)
from jianmu_fast.message import Message, ai, human, tool

COUNTER = TiktokenTokenCounter("o200k_base")


def call(cid: str, k: int) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "calc", "arguments": json.dumps({"k": k})}}


def turns(n: int, start: int = 0) -> list[list[Message]]:
    out = []
    for k in range(start, start + n):
        cid = f"c{k % 3}"
        out += [[human(f"question {k} " + "word " * (k % 7))],
                [ai(None, tool_calls=[call(cid, k)]), tool(f"result {k}", tool_call_id=cid,
                                                          metadata={"tool_result": {"k": k}})],
                [ai(f"answer {k} " + "more " * (k % 5))]]
    return out


def preset(budget: int = 400, **kw) -> ContextBuilder:
    return ContextBuilder.for_react("You are a calculator.", max_tokens=budget, token_counter=COUNTER, **kw)


def big(**kw) -> ContextBuilder:
    return preset(budget=10_000, **kw)


def dump(msgs: list[Message]) -> list:
    """What is sent, plus metadata and ids (a fixed prompt's id is per builder)."""
    return [(m.role, m.content, m.tool_calls, m.tool_call_id, m.metadata, None if m.role == "system" else m.id)
            for m in msgs]


def fresh(state: dict, make=preset, **kw) -> list:
    return dump(make().build({"messages": list(state["messages"])}, **kw))


def test_hot_path_is_taken_and_equals_fresh_builders_along_growth():
    b = preset()
    state: dict = {"messages": []}
    kept = None
    for u in turns(25):
        state["messages"].extend(u)
        out = b.build(state)
        assert dump(out) == fresh(state)
        assert b._turn is not None and out is not b._turn.prompt
        if kept is not None and b._turn.note is not None:
            assert b._turn.prompt is kept  # grown in place, not rebuilt
        kept = b._turn.prompt if b._turn.note is not None else None
    assert dump(b.build(state)) == fresh(state) and b._turn.prompt is kept  # repeated call


@pytest.mark.parametrize("edit", ["replace", "delete", "insert", "shrink", "new_list", "replace_and_grow"])
def test_any_edit_but_appending_rebuilds_the_prompt(edit):
    b = big()
    hist = [m for u in turns(12) for m in u]
    state = {"messages": hist}
    b.build(state)
    if edit == "replace":
        hist[3] = human("an edited question")
    elif edit == "delete":
        del hist[0]
    elif edit == "insert":
        hist.insert(1, human("inserted"))
    elif edit == "shrink":
        del hist[-3:]
    elif edit == "new_list":
        state["messages"] = hist = hist[:5] + [human("other")] + hist[6:]
    else:
        hist[0] = human("edited first")
        hist.append(human("and a new one"))
    out = b.build(state)
    assert dump(out) == fresh(state, make=big)
    hist.append(human("then growth again"))
    assert dump(b.build(state)) == fresh(state, make=big)


def test_a_changed_fixed_provider_or_note_rebuilds_the_prompt(monkeypatch):
    b = big()
    state = {"messages": [m for u in turns(6) for m in u]}
    b.build(state)
    persona = b.providers[0]
    persona.text = ""  # an empty text contributes nothing
    assert dump(b.build(state))[0][1] != "You are a calculator."
    assert [m.content for m in b.build(state)][:1] == [b.providers[1].text]
    persona.text = "You are a calculator."
    assert dump(b.build(state)) == fresh(state, make=big)
    # a new semantics text (the note is another message): seen at once after the replacement
    monkeypatch.setattr(prompts, "history_semantics_prompt", lambda: "History semantics: custom")
    state["messages"].append(human("one more"))
    out = b.build(state)
    assert "History semantics: custom" in [m.content for m in out]
    assert dump(out) == fresh(state, make=big)


def test_the_annotate_switch_takes_effect_on_the_next_call():
    b = big()
    state = {"messages": [m for u in turns(6) for m in u]}
    on = b.build(state)
    assert any(m.metadata.get("semantic_kind") for m in on)
    b.providers[-1].annotate = False
    off = b.build(state)
    assert not any(m.metadata.get("semantic_kind") for m in off)
    plain = ContextBuilder(providers=[StaticPromptProvider("You are a calculator."), StaticPromptProvider(b.providers[1].text),
                                      StateHistoryProvider(annotate=False)],
                           filters=[TokenBudgetFilter(10_000, counter=COUNTER)])
    assert dump(off) == dump(plain.build(state))
    b.providers[-1].annotate = True
    assert dump(b.build(state)) == dump(on)


def test_changed_stage_lists_and_replaced_methods_are_honoured():
    b = big()
    state = {"messages": [m for u in turns(6) for m in u]}
    b.build(state)
    b.providers.insert(2, ToolsDescProvider("- calc: arithmetic"))  # after __init__
    out = b.build(state)
    assert [m.content for m in out][2] == "Available tools:\n- calc: arithmetic"
    assert dump(out) == fresh(state, make=lambda: big(tools_desc="- calc: arithmetic"))
    b.filters.insert(0, MaxMessagesFilter(3))
    assert [m.role for m in b.build(state)][-3:] == ["assistant", "tool", "assistant"]
    assert len([m for m in b.build(state) if m.role != "system"]) == 3
    del b.filters[0]
    flt = b.filters[0]
    flt.apply = lambda messages, *a, **k: list(messages[-1:])  # type: ignore[method-assign]
    out = b.build(state)
    assert [m.role for m in out] == ["assistant"]  # the instance's apply ran (and no sanitize change)
    del flt.apply
    prov = b.providers[-1]
    prov.get_messages = lambda *a, **k: [human("replaced")]  # type: ignore[method-assign]
    assert [m.content for m in b.build(state)][-1] == "replaced"
    del prov.get_messages
    assert dump(b.build(state)) == fresh(state, make=lambda: big(tools_desc="- calc: arithmetic"))


def test_the_kept_prompt_never_reaches_the_caller():
    b = big()  # everything fits: the output is the whole prompt
    state = {"messages": [m for u in turns(4) for m in u]}
    out = b.build(state)
    assert out is not b._turn.prompt and out == b._turn.prompt
    out.clear()  # the caller owns what build() returns
    again = b.build(state)
    assert dump(again) == fresh(state, make=big)
    # a builder without filters (sanitize returns its input) does not keep a prompt
    nb = ContextBuilder(providers=[StaticPromptProvider("x"), StateHistoryProvider()])
    assert nb.build(state) == nb.build(state) and nb._turn is None


def test_a_failing_history_provider_is_skipped_as_before(caplog):
    class Odd:
        messages = property(lambda self: (_ for _ in ()).throw(RuntimeError("boom")))

    b = big()
    state = {"messages": [human("hi")]}
    b.build(state)
    out = b.build(Odd())
    assert [m.role for m in out] == ["system", "system"] and "providers[2]" in caplog.text
    assert dump(b.build(state)) == fresh(state, make=big)


def test_builders_pickle_and_copy_without_the_kept_prompt():
    b = preset()
    state = {"messages": [m for u in turns(10) for m in u]}
    first = b.build(state)
    for other in (pickle.loads(pickle.dumps(b)), copy.deepcopy(b)):
        assert other._turn is None and other._hot is None
        assert dump(other.build(state)) == dump(first)
        state2 = {"messages": list(state["messages"]) + [human("more")]}
        assert dump(other.build(state2)) == fresh(state2)


def test_threads_sharing_a_builder_get_their_own_prompts():
    b = preset()
    states = [{"messages": [m for u in turns(8, start=10 * t) for m in u]} for t in range(4)]
    want = [fresh(s) for s in states]
    errors: list = []

    def run(t: int) -> None:
        try:
            s = {"messages": list(states[t]["messages"])}
            for _ in range(60):
                if dump(b.build(s)) != want[t]:
                    errors.append(t)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_tools_schema_reaches_the_filter_on_the_hot_path():
    tools = [{"type": "function", "function": {"name": "calc", "description": "Arithmetic. " * 40,
                                               "parameters": {"type": "object", "properties": {}}}}]
    b = preset(budget=600)
    state = {"messages": []}
    for u in turns(15):
        state["messages"].extend(u)
        out = b.build(state, tools_schema=copy.deepcopy(tools))
        assert dump(out) == fresh(state, make=lambda: preset(budget=600), tools_schema=tools)
        assert COUNTER.count_messages(out) + COUNTER.count_tools(tools) <= 600


def test_sanitizing_on_the_hot_path_equals_fresh_builders():
    """A broken historical transaction is dropped from the request, a broken newest one raises
    ToolCallHistoryError, and the kept prompt stays right for the calls after either."""
    from jianmu_fast.errors import ToolCallHistoryError

    b = big()
    hist = [m for u in turns(4) for m in u]
    state = {"messages": hist}
    b.build(state)
    hist.append(tool("orphan result", tool_call_id="nobody"))  # answers no call
    with pytest.raises(ToolCallHistoryError):
        b.build(state)
    hist.append(human("next question"))  # now a broken historical unit: dropped from the request
    out = b.build(state)
    assert "orphan result" not in [m.content for m in out] and out[-1].content == "next question"
    assert dump(out) == fresh(state, make=big)
    hist.extend(turns(2, start=50)[0])
    assert dump(b.build(state)) == fresh(state, make=big)


def test_stages_added_after_construction_work_in_build_and_transform():
    """Editing ``providers``/``filters`` after ``__init__`` re-derives what the builder knows
    about each stage (whether it takes ``tools_schema``, whether it is a trimming filter)."""
    seen = []

    class TakesTools:
        def get_messages(self, local_state, global_state=None, ctx=None, tools_schema=None):
            seen.append(tools_schema)
            return [human("from a later provider")]

    class Keep2:
        def apply(self, messages, local_state=None, global_state=None, ctx=None, tools_schema=None):
            seen.append(("filter", tools_schema))
            return list(messages)[-2:]

    b = ContextBuilder(providers=[StaticPromptProvider("x")])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    b.filters.append(Keep2())
    assert [m.content for m in b.transform([human("a"), human("b"), human("c")], tools_schema=tools)] == ["b", "c"]
    b.providers.append(TakesTools())
    assert [m.content for m in b.build({}, tools_schema=tools)] == ["x", "from a later provider"]
    assert seen == [("filter", tools), tools, ("filter", tools)]
