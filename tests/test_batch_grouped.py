"""``build_batch``'s grouped provider stage: states whose histories are prefixes of one
conversation share one history-provider call, and every prompt, error and sanitize outcome
still equals ``build()`` per state (random and real-shaped states, on both backends)."""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.batch import build_batch, build_batch_report
from jianmu_fast.errors import JianmuError
from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    SimpleTokenCounter,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.memory.context.providers.state_history import StateHistoryProvider
from jianmu_fast.memory.context.providers.tools_desc import ToolsDescProvider
from jianmu_fast.message import Message, ai, human, system, tool

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "150"))


def _outcome(fn):
    try:
        return [m.to_openai() for m in fn()]
    except JianmuError as exc:
        return (type(exc), str(exc))


def _batch_outcomes(builder, states):
    report = build_batch_report(builder, states)
    failed = {f.index: (type(f.error), str(f.error)) for f in report.failures}
    return [failed[i] if i in failed else [m.to_openai() for m in report.prompts[i]] for i in range(len(states))]


def conversation(rng: random.Random, n_units: int, tag: str) -> list[Message]:
    """Users, answers and tool rounds; results with and without ``metadata["tool_result"]``
    (receipts are annotated), now and then a broken unit (an orphan result, a call without
    its result)."""
    msgs: list[Message] = [human(f"{tag} opens")]
    for u in range(n_units):
        kind = rng.choice(["user", "answer", "tools", "tools", "orphan", "unanswered"])
        if kind == "user":
            msgs.append(human(f"{tag} asks {u} " + "x" * rng.randint(0, 60)))
        elif kind == "answer":
            msgs.append(ai(f"{tag} answers {u} " + "y" * rng.randint(0, 60)))
        elif kind == "orphan":
            msgs.append(tool("stray", tool_call_id=f"{tag}-nobody-{u}"))
        else:
            calls = [{"id": f"{tag}-c{u}-{k}", "type": "function",
                      "function": {"name": rng.choice(["search", "calc"]), "arguments": json.dumps({"q": u})}}
                     for k in range(rng.randint(1, 2))]
            msgs.append(ai(rng.choice([None, "let me check"]), tool_calls=calls))
            if kind == "unanswered":
                continue
            for c in calls:
                meta = {"tool_result": {"ok": u}} if rng.random() < 0.5 else {}
                msgs.append(tool("r" * rng.randint(1, 80), tool_call_id=c["id"], metadata=meta))
    return msgs


def states_of(rng: random.Random, n_convs: int) -> list:
    convs = [conversation(rng, rng.randint(0, 12), f"t{k}") for k in range(n_convs)]
    states: list = []
    for c in convs:
        for _ in range(rng.randint(1, 6)):
            states.append({"messages": c[:rng.randint(1, len(c))]})
        if len(c) > 2 and rng.random() < 0.3:  # the same first message, then another path
            other = c[:2] + [human("a different turn")]
            states.append({"messages": other})
        if rng.random() < 0.2:  # an equal copy (not the same objects)
            states.append({"messages": [m.model_copy() for m in c]})
    extras = [
        {"messages": []},
        {"messages": [{"role": "user", "content": "a dict item"}]},
        {"messages": [human("bare"), {"role": "assistant", "content": "mixed"}]},
        [human("a bare list state")],
        {"messages": None},
        {"msgs": [human("no history key")]},
        {"messages": "not a list"},
        None,
    ]
    states.extend(rng.sample(extras, rng.randint(0, len(extras))))
    rng.shuffle(states)
    return states


class DropLastAnswer:
    """A user's filter: leaves out the last plain assistant answer."""

    def apply(self, messages, local_state=None, global_state=None, ctx=None):
        for j in range(len(messages) - 1, -1, -1):
            if messages[j].role == "assistant" and not messages[j].tool_calls:
                return messages[:j] + messages[j + 1:]
        return list(messages)


BUILDER_KINDS = ["react", "tail", "plain", "nosanitize", "editing", "nofilter", "custom"]


def builders(kind: str, budget: int):
    counter = SimpleTokenCounter()
    if kind == "react":
        return ContextBuilder.for_react("You are terse.", max_tokens=budget, token_counter=counter)
    if kind == "tail":  # fixed providers after the history, a tools description before it
        return ContextBuilder([StaticPromptProvider("head"), ToolsDescProvider("- calc"), StateHistoryProvider(),
                               StaticPromptProvider("tail note")], [TokenBudgetFilter(budget, counter)])
    if kind == "plain":
        return ContextBuilder([StaticPromptProvider("p"), StateHistoryProvider(annotate=False)],
                              [MaxMessagesFilter(max(1, budget // 40))])
    if kind == "editing":  # a context-editing stage first: the grouped prompts are built as lists
        return ContextBuilder.for_react("You are terse.", max_tokens=budget, token_counter=counter,
                                        tool_result_max_tokens=12, clear_tool_results=1)
    if kind == "nofilter":
        return ContextBuilder([StaticPromptProvider("p"), StateHistoryProvider()], [])
    if kind == "custom":  # a filter of the user's first, then a trimming one
        return ContextBuilder([StaticPromptProvider("p"), StateHistoryProvider()],
                              [DropLastAnswer(), TokenBudgetFilter(budget, counter)])
    return ContextBuilder([StateHistoryProvider()], [TokenBudgetFilter(budget, counter)], sanitize=False)


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from(BUILDER_KINDS),
       st.sampled_from([60, 200, 800, 5000]))
def test_grouped_states_equal_build_per_state(seed, n_convs, kind, budget):
    rng = random.Random(seed)
    states = states_of(rng, n_convs)
    got = _batch_outcomes(builders(kind, budget), states)
    for i, s in enumerate(states):
        assert got[i] == _outcome(lambda: builders(kind, budget).build(s)), (seed, i)


@pytest.mark.parametrize("kind", BUILDER_KINDS)
@pytest.mark.parametrize("failing", [False, True])
def test_states_sharing_prefixes_with_and_without_failing_states(kind, failing):
    """Every grouped prompt as rows only (no state failed, a trimming filter first) or as
    lists (a state failed in its provider, or another first stage): the same outcomes."""
    rng = random.Random(7)
    convs = [conversation(rng, 10, f"c{k}") for k in range(3)]
    states: list = [{"messages": c[:k]} for c in convs for k in range(1, len(c) + 1)]
    bad = [{"msgs": [human("no history key")]}, {"messages": "not a list"}] if failing else []
    states[3:3] = bad
    rng.shuffle(states)
    got = _batch_outcomes(builders(kind, 2000), states)
    assert [type(got[i]) for i, s in enumerate(states) if any(s is b for b in bad)] == [tuple] * len(bad)
    assert sum(type(o) is list for o in got) >= 10
    for i, s in enumerate(states):
        assert got[i] == _outcome(lambda: builders(kind, 2000).build(s)), i


def test_an_earlier_groups_output_grown_in_place_by_a_later_call():
    """The history provider extends its previous output list in place when the next history
    extends the previous one by value: a later group (an equal copy of a conversation, one
    message longer) grows the list an earlier group was given; the earlier states still get
    their own prefix."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]
    conv = [human("q"), ai(None, tool_calls=calls), tool("4", tool_call_id="c1"), ai("four")]
    copy = [m.model_copy() for m in conv] + [human("and 5?")]
    states = [{"messages": conv[:k]} for k in (4, 3, 1)] + [{"messages": copy[:k]} for k in (5, 3)]

    def builder():
        return ContextBuilder.for_react("sys", max_tokens=4000, token_counter=SimpleTokenCounter())

    want = [[m.to_openai() for m in builder().build(s)] for s in states]
    seen = []
    original = StateHistoryProvider._blocks

    def spy(self, local_state, global_state=None, ctx=None):
        note, hist = original(self, local_state, global_state, ctx)
        seen.append(hist)
        return note, hist

    import unittest.mock

    with unittest.mock.patch.object(StateHistoryProvider, "_blocks", spy):
        got = [[m.to_openai() for m in p] for p in build_batch(builder(), states)]
    assert len(seen) == 2 and seen[0] is seen[1] and len(seen[0]) == 5  # grown in place
    assert got == want


def test_a_fixed_message_of_a_subclass_is_trimmed_per_prompt():
    """A fixed provider's message that is not exactly a Message gives the grouped prompts no
    rows: they are built as lists and trimmed one by one, with build()'s outcome."""
    class Note(Message):
        pass

    def builder():
        head = StaticPromptProvider("head")
        head._message = Note(role="system", content="head")
        return ContextBuilder([head, StateHistoryProvider()], [TokenBudgetFilter(60, SimpleTokenCounter())])

    conv = conversation(random.Random(3), 8, "s")
    states = [{"messages": conv[:k]} for k in range(1, len(conv) + 1)]
    got = _batch_outcomes(builder(), states)
    assert got == [_outcome(lambda: builder().build(s)) for s in states]
    assert any(type(o) is list and len(o) > 1 for o in got)


def test_a_shorter_state_has_no_semantics_note_until_an_annotated_message():
    calls = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]
    conv = [human("q"), ai("thinking"), ai(None, tool_calls=calls), tool("4", tool_call_id="c1", metadata={"tool_result": 4})]
    b = ContextBuilder.for_react("sys", max_tokens=4000)
    states = [{"messages": conv[:k]} for k in (4, 1, 2)]  # [:3] ends in an unanswered call
    out = build_batch(b, states)
    assert [sum(m.metadata.get("semantic_kind") == "history_semantics" for m in p) for p in out] == [1, 0, 0]
    assert [[m.to_openai() for m in p] for p in out] == [
        [m.to_openai() for m in ContextBuilder.for_react("sys", max_tokens=4000).build(s)] for s in states]


def test_one_history_provider_call_per_conversation(monkeypatch):
    conv = [human(f"m{i}") for i in range(30)]
    other = [human(f"n{i}") for i in range(5)]
    states = [{"messages": conv[:k]} for k in range(1, 31)] + [{"messages": other[:k]} for k in (5, 2)]

    def builder():
        return ContextBuilder([StaticPromptProvider("s"), StateHistoryProvider()], [MaxMessagesFilter(5)])

    want = [[m.to_openai() for m in builder().build(s)] for s in states]
    seen = []
    original = StateHistoryProvider._blocks

    def spy(self, local_state, global_state=None, ctx=None):
        seen.append(len(local_state["messages"]))
        return original(self, local_state, global_state, ctx)

    monkeypatch.setattr(StateHistoryProvider, "_blocks", spy)
    assert [[m.to_openai() for m in p] for p in build_batch(builder(), states)] == want
    assert sorted(seen) == [5, 30]  # the longest history of each conversation only


def test_an_overridden_provider_runs_per_state():
    seen = []

    class Mine(StateHistoryProvider):
        def get_messages(self, local_state, global_state=None, ctx=None):
            seen.append(1)
            return super().get_messages(local_state, global_state, ctx)

    conv = [human(f"m{i}") for i in range(6)]
    b = ContextBuilder([Mine()], [MaxMessagesFilter(3)])
    states = [{"messages": conv[:k]} for k in range(1, 7)]
    assert [[m.content for m in p] for p in build_batch(b, states)] == [
        [m.content for m in conv[:k][-3:]] for k in range(1, 7)]
    assert len(seen) == 6


@pytest.mark.parametrize("budget", [800, 3000])
def test_real_shaped_prefix_states_equal_build(budget):
    bench = pytest.importorskip("benchmarks.traces")
    from jianmu_fast.message import coerce_messages

    counter = TiktokenTokenCounter("o200k_base")
    convs = [coerce_messages(c) for c in bench.make_cs_conversations(8, seed=budget)]
    rng = random.Random(budget)
    states = [{"messages": c[:rng.randint(1, len(c))]} for c in convs for _ in range(12)]
    rng.shuffle(states)
    b = ContextBuilder.for_react("You are a support agent.", max_tokens=budget, token_counter=counter)
    got = _batch_outcomes(b, states)
    fresh = ContextBuilder.for_react("You are a support agent.", max_tokens=budget, token_counter=counter)
    for i, s in enumerate(states):
        assert got[i] == _outcome(lambda: fresh.build(s)), i


@pytest.mark.parametrize("idle", [True, False])
def test_counts_many_threads_or_not_give_the_same_counts(monkeypatch, idle):
    import jianmu_fast.memory.context._batch_plan as plan

    calls = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}]
    msgs = [human(f"question {i} " + "é中" * (i % 7)) for i in range(40)] + [
        ai(None, tool_calls=calls), tool("4", tool_call_id="c1"), system("s"), human("question 1 ")]
    want = [TiktokenTokenCounter("o200k_base", engine="tiktoken").count_message(m) for m in msgs]
    monkeypatch.setattr(plan, "PARALLEL_MIN", 4)
    monkeypatch.setattr(plan, "PARALLEL_CPUS", 1)
    monkeypatch.setattr(plan, "_idle_core", lambda: idle)
    spawned = []
    flt = TokenBudgetFilter(1000, TiktokenTokenCounter("o200k_base", engine="tiktoken"))
    import threading

    original = flt._counts

    def spy(ms, lo, hi):
        spawned.append(threading.current_thread() is not threading.main_thread())
        return original(ms, lo, hi)

    flt._counts = spy  # type: ignore[method-assign]
    assert plan.counts_many(flt, msgs).tolist() == want
    assert any(spawned) is idle  # two worker threads only when a core is idle
    fast = TokenBudgetFilter(1000, SimpleTokenCounter())
    assert plan.counts_many(fast, msgs).tolist() == [SimpleTokenCounter().count_message(m) for m in msgs]


def test_counts_many_raises_what_the_second_thread_raised(monkeypatch):
    import threading

    import jianmu_fast.memory.context._batch_plan as plan

    monkeypatch.setattr(plan, "PARALLEL_MIN", 4)
    monkeypatch.setattr(plan, "PARALLEL_CPUS", 1)
    monkeypatch.setattr(plan, "_idle_core", lambda: True)
    msgs = [human(f"question {i}") for i in range(40)]
    flt = TokenBudgetFilter(1000, TiktokenTokenCounter("o200k_base", engine="tiktoken"))
    original = flt._counts

    def failing(ms, lo, hi):
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("the counter failed")
        return original(ms, lo, hi)

    flt._counts = failing  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="the counter failed"):
        plan.counts_many(flt, msgs)
    flt._counts = original  # type: ignore[method-assign]
    assert plan.counts_many(flt, msgs).tolist() == [flt.counter.count_message(m) for m in msgs]


@pytest.mark.parametrize("error", [ValueError, "library"])
@pytest.mark.parametrize("kind", ["react", "editing"])
def test_a_failing_history_provider_fails_its_conversation_as_build_does(monkeypatch, error, kind):
    """The history provider raises on the histories that hold a poisoned message: those
    states take build()'s way (a library error fails the state, another error is logged and
    the history skipped); the other conversations keep their shared provider call."""
    from jianmu_fast.errors import MessageValidationError

    rng = random.Random(11)
    convs = [conversation(rng, 8, f"p{k}") for k in range(3)]
    poison = convs[1][2]
    states: list = [{"messages": c[:k]} for c in convs for k in range(1, len(c) + 1)]
    rng.shuffle(states)
    original = StateHistoryProvider._blocks

    def blocks(self, local_state, global_state=None, ctx=None):
        if any(m is poison for m in local_state["messages"]):
            raise ValueError("provider broke") if error is ValueError else MessageValidationError("bad history")
        return original(self, local_state, global_state, ctx)

    monkeypatch.setattr(StateHistoryProvider, "_blocks", blocks)
    got = _batch_outcomes(builders(kind, 2000), states)
    want = [_outcome(lambda: builders(kind, 2000).build(s)) for s in states]
    assert got == want
    poisoned = [i for i, s in enumerate(states) if any(m is poison for m in s["messages"])]
    assert poisoned and all((type(got[i]) is tuple) == (error != ValueError) for i in poisoned)
