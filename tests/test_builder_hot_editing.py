"""The builder's hot path with the context-editing stages (issue 19).

``ToolResultCapFilter``, ``ClearToolResultsFilter`` and ``SummarizingBudgetFilter`` (exact
classes), alone or chained as ``for_react`` builds them (cap → clear → budget/summarizer) or in
any other order, keep the builder on its hot path (``ContextBuilder._provide_hot`` /
``_filter_hot``). Every output and every error is compared with the general path of an
identical builder (a call that finds the builder's prompt lock taken runs the general path, as
a second thread's call does) along randomly growing histories, and with a fresh builder's at
the end; run on both backends (``JIANMU_FAST_PURE_PYTHON=1`` for the pure-Python twins).
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import threading
import warnings
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import JianmuError
from jianmu_fast.memory.context import (
    ClearToolResultsFilter,
    ContextBuilder,
    MaxMessagesFilter,
    SimpleTokenCounter,
    StateHistoryProvider,
    StaticPromptProvider,
    SummarizingBudgetFilter,
    TiktokenTokenCounter,
    TokenBudgetFilter,
    ToolResultCapFilter,
)
from jianmu_fast.memory.context.editing import SummaryFailedWarning
from jianmu_fast.message import Message, ai, human, system, tool

TIKTOKEN = TiktokenTokenCounter("o200k_base")
SIMPLE = SimpleTokenCounter()
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 15,
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
         for i in range(3)]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = ["alpha", "beta", "gamma", "delta", "中文", "é", "🙂", "{\"k\": 1}", "\n", "42"]


def summarize(messages: list[Message]) -> str:
    """Deterministic: the first words of each user message."""
    return "asked: " + " / ".join(str(m.content)[:20] for m in messages if m.role == "user")


def history(seed: int, n_units: int, broken: bool) -> list[Message]:
    """A seeded agent history: a system prompt (mostly), users, answers and tool rounds
    (parallel calls too) whose results are small or thousands of tokens, text or blocks; with
    ``broken``, now and then a result that answers no call."""
    rnd = random.Random(seed)
    msgs: list[Message] = [system("You are an agent. " * rnd.randint(1, 30))] if rnd.random() < 0.8 else []
    n = 0

    def text(lo: int, hi: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(lo, hi)))

    for _ in range(n_units):
        kind = rnd.choice(["user", "assistant", "tools", "tools", "tools"])
        if kind == "user":
            msgs.append(human(text(1, 30)))
        elif kind == "assistant":
            msgs.append(ai(text(1, 40)))
        else:
            calls = []
            for _ in range(rnd.choice([1, 1, 2])):
                n += 1
                calls.append({"id": f"c{n}", "type": "function",
                              "function": {"name": rnd.choice(["search", "read_file", "memory"]),
                                           "arguments": json.dumps({"q": text(1, 5)})}})
            msgs.append(ai(None, tool_calls=calls))
            for c in calls:
                size = rnd.choice([(1, 20), (1, 60), (100, 400), (600, 2500)])
                if rnd.random() < 0.15:
                    content: Any = [{"type": "text", "text": text(*size)}, {"type": "text", "text": text(1, 50)}]
                else:
                    content = text(*size)
                msgs.append(tool(content, tool_call_id=c["id"]))
        if broken and rnd.random() < 0.05:
            msgs.append(tool("orphan " + text(1, 5), tool_call_id=f"nobody{n}"))
    return msgs


#: the stage lists under test: (name, factory(counter, budget, keep, clear_at_least, chunked))
def _summ(counter: Any, budget: int, chunked: bool) -> SummarizingBudgetFilter:
    return SummarizingBudgetFilter(budget, counter, summarize=summarize, summary_max_tokens=max(1, budget // 8),
                                   eviction="chunked" if chunked else "exact", chunk=max(1, budget // 4) if chunked else None)


def _budget(counter: Any, budget: int, chunked: bool) -> TokenBudgetFilter:
    return TokenBudgetFilter(budget, counter, eviction="chunked" if chunked else "exact",
                             chunk=max(1, budget // 4) if chunked else None)


COMBOS: dict[str, Callable[..., list[Any]]] = {
    "cap": lambda c, b, k, a, ch: [ToolResultCapFilter(b // 4, c)],
    "clear": lambda c, b, k, a, ch: [ClearToolResultsFilter(b, c, keep=k, clear_at_least=a)],
    "summarizer": lambda c, b, k, a, ch: [_summ(c, b, ch)],
    "cap+budget": lambda c, b, k, a, ch: [ToolResultCapFilter(b // 4, c), _budget(c, b, ch)],
    "clear+budget": lambda c, b, k, a, ch: [ClearToolResultsFilter(b, c, keep=k, clear_at_least=a), _budget(c, b, ch)],
    "cap+clear+budget": lambda c, b, k, a, ch: [ToolResultCapFilter(b // 4, c),
                                                ClearToolResultsFilter(b, c, keep=k, clear_at_least=a), _budget(c, b, ch)],
    "cap+clear+summarizer": lambda c, b, k, a, ch: [ToolResultCapFilter(b // 4, c),
                                                    ClearToolResultsFilter(b - b // 8, c, keep=k, clear_at_least=a),
                                                    _summ(c, b, ch)],
    "max+cap+clear+budget": lambda c, b, k, a, ch: [MaxMessagesFilter(30), ToolResultCapFilter(b // 4, c),
                                                    ClearToolResultsFilter(b, c, keep=k, clear_at_least=a,
                                                                           clear_tool_inputs=True), _budget(c, b, ch)],
    "budget+cap": lambda c, b, k, a, ch: [_budget(c, b, ch), ToolResultCapFilter(b // 8, c)],
    "summarizer+max": lambda c, b, k, a, ch: [_summ(c, b, ch), MaxMessagesFilter(12)],
    "clear+cap+clear": lambda c, b, k, a, ch: [ClearToolResultsFilter(b, c, keep=k), ToolResultCapFilter(b // 4, c),
                                               ClearToolResultsFilter(b // 2, c, keep=1, exclude_tools=("memory",))],
}


def make(combo: str, counter: Any, budget: int, keep: int, at_least: int, chunked: bool, sanitize: bool) -> ContextBuilder:
    return ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                          filters=COMBOS[combo](counter, budget, keep, at_least, chunked), sanitize=sanitize)


def dump(msgs: list[Message]) -> list:
    """What is sent, plus metadata and ids (a fixed prompt's id is per builder)."""
    return [(m.role, m.content, m.tool_calls, m.tool_call_id, m.name, m.metadata, None if m.role == "system" else m.id)
            for m in msgs]


def outcome(b: ContextBuilder, state: Any, tools: Any) -> tuple:
    """``("ok", dump)`` or ``("error", type, message)``."""
    try:
        return ("ok", dump(b.build(state, tools_schema=tools)))
    except JianmuError as exc:
        return ("error", type(exc).__name__, str(exc))


def general(b: ContextBuilder) -> ContextBuilder:
    """``b`` with its prompt lock held: each ``build`` runs the general path."""
    assert b._turn_lock.acquire(False)
    return b


@given(seed=st.integers(0, 10**6), combo=st.sampled_from(sorted(COMBOS)), budget=st.sampled_from([300, 1200, 4000]),
       keep=st.integers(0, 4), at_least=st.sampled_from([0, 100, 1000]), chunked=st.booleans(),
       sanitize=st.booleans(), tools=st.booleans(), simple=st.booleans(), broken=st.booleans())
@SETTINGS
def test_hot_path_equals_the_general_path_along_growing_histories(seed, combo, budget, keep, at_least, chunked,
                                                                   sanitize, tools, simple, broken):
    counter = SIMPLE if simple else TIKTOKEN
    hist = history(seed, 40, broken)
    rnd = random.Random(seed + 1)
    hot = make(combo, counter, budget, keep, at_least, chunked, sanitize)
    ref = general(make(combo, counter, budget, keep, at_least, chunked, sanitize))
    assert hot._hot is not None and ref._hot is not None  # every combination is admitted
    schema = TOOLS if tools else None
    state: dict[str, Any] = {"messages": []}
    end = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        while end < len(hist):
            step = rnd.choice([1, 1, 2, 3, 7])
            state["messages"].extend(hist[end:end + step])  # the agent loop: one list, grown in place
            end += step
            got = outcome(hot, state, schema)
            assert got == outcome(ref, state, schema)
            assert hot._turn is not None  # the hot path ran (and kept its prompt)
            if rnd.random() < 0.05:  # now and then an edit that is not appending: the prompt is made anew
                i = rnd.randrange(len(state["messages"]))
                state["messages"] = state["messages"][:i] + [human(f"edited {i}")] + state["messages"][i + 1:]
                assert outcome(hot, state, schema) == outcome(ref, state, schema)
    assert ref._turn is None
    fresh = make(combo, counter, budget, keep, at_least, chunked, sanitize)
    assert outcome(fresh, {"messages": list(state["messages"])}, schema) == outcome(hot, state, schema)


@pytest.mark.parametrize("editing", [
    {"tool_result_max_tokens": 300},
    {"clear_tool_results": 2},
    {"summarize": summarize},
    {"tool_result_max_tokens": 300, "clear_tool_results": {"keep": 1, "clear_tool_inputs": True}, "summarize": summarize},
])
def test_presets_with_editing_stages_take_the_hot_path(editing):
    hist = history(7, 120, False)
    b = ContextBuilder.for_react("You are an agent.", max_tokens=2000, token_counter=TIKTOKEN, **editing)
    ref = general(ContextBuilder.for_react("You are an agent.", max_tokens=2000, token_counter=TIKTOKEN, **editing))
    state: dict[str, Any] = {"messages": []}
    kept = None
    for m in hist:
        state["messages"].append(m)
        assert outcome(b, state, None) == outcome(ref, state, None)
        if kept is not None and b._turn.note is not None:
            assert b._turn.prompt is kept  # grown in place, not rebuilt (once the semantics note is there)
        kept = b._turn.prompt if b._turn.note is not None else None
    assert b._hot is not None and b._hot.last is (b.filters[-1])


class Boom(SimpleTokenCounter):
    """A counter whose ``count_text`` fails on one word (not a library error)."""

    def count_text(self, text: str) -> int:
        if "BOOM" in text:
            raise RuntimeError("cannot count BOOM")
        return super().count_text(text)


@pytest.mark.parametrize("sanitize", [True, False])
def test_a_failing_editing_stage_is_skipped_as_on_the_general_path(sanitize, caplog):
    def builder() -> ContextBuilder:
        return ContextBuilder(providers=[StaticPromptProvider("x"), StateHistoryProvider()],
                              filters=[ToolResultCapFilter(5, Boom())], sanitize=sanitize)

    b, ref = builder(), general(builder())
    state = {"messages": [human("q"), ai(None, tool_calls=[{"id": "c1", "type": "function",
                                                            "function": {"name": "f", "arguments": "{}"}}])]}
    state["messages"].append(tool("word " * 20, tool_call_id="c1"))
    assert outcome(b, state, None) == outcome(ref, state, None)
    state["messages"] += [ai(None, tool_calls=[{"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                          tool("BOOM " * 20, tool_call_id="c2")]  # the cap raises: skipped, logged
    with caplog.at_level(logging.ERROR, logger="jianmu_fast.context"):
        out = b.build(state)
    assert "filters[0] (ToolResultCapFilter) failed" in caplog.text
    assert dump(out) == outcome(ref, state, None)[1]
    assert out is not b._turn.prompt  # the kept prompt never reaches the caller
    out.clear()
    assert dump(b.build(state)) == outcome(ref, state, None)[1]


def test_clearing_then_trimming_filter_runs_unrolled():
    """[clearing, trimming filter last] is ``_filter_hot``'s loop unrolled (``_Hot.pair``): the same
    outputs and errors as the general path (a counter that fails: the clearing's TrimmingError)."""
    def builder(counter: Any, filters: Callable[[Any], list[Any]], sanitize: bool = True) -> ContextBuilder:
        return ContextBuilder(providers=[StaticPromptProvider("x"), StateHistoryProvider()],
                              filters=filters(counter), sanitize=sanitize)

    pair = lambda c: [ClearToolResultsFilter(60, c, keep=1), TokenBudgetFilter(400, c)]  # noqa: E731
    b, ref = builder(Boom(), pair), general(builder(Boom(), pair))
    b._hot_plan()
    assert b._hot.pair is not None and b._hot.pair[2] is b.filters[1]
    for filters in (lambda c: [ClearToolResultsFilter(60, c), MaxMessagesFilter(9), TokenBudgetFilter(400, c)],
                    lambda c: [TokenBudgetFilter(400, c), ClearToolResultsFilter(60, c)],
                    lambda c: [ToolResultCapFilter(60, c), TokenBudgetFilter(400, c)]):
        other = builder(SIMPLE, filters)
        other._hot_plan()
        assert other._hot is not None and other._hot.pair is None
    unsanitized = builder(SIMPLE, pair, sanitize=False)
    unsanitized._hot_plan()
    assert unsanitized._hot.pair is not None  # (not taken: the loop runs when nothing is sanitized)
    call = lambda i: [ai(None, tool_calls=[{"id": f"c{i}", "type": "function",  # noqa: E731
                                            "function": {"name": "f", "arguments": "{}"}}])]
    state: dict[str, Any] = {"messages": [human("q")]}
    for i in range(6):
        state["messages"] += call(i) + [tool(f"result {i} " + "word " * 15, tool_call_id=f"c{i}"), ai(f"done {i}")]
        assert outcome(b, state, None) == outcome(ref, state, None)
    assert b._turn is not None and ref._turn is None  # (the hot path ran, unrolled)
    state["messages"] += call(9) + [tool("BOOM " * 20, tool_call_id="c9")]  # the clearing's count raises
    got = outcome(b, state, None)
    assert got == outcome(ref, state, None)
    assert got[:2] == ("error", "TrimmingError") and got[2].startswith("ClearToolResultsFilter: could not clear")


def test_a_failing_summarizer_falls_back_as_on_the_general_path():
    def bad(messages: list[Message]) -> str:
        raise RuntimeError("model down")

    def builder() -> ContextBuilder:
        return ContextBuilder(providers=[StaticPromptProvider("x"), StateHistoryProvider()],
                              filters=[ClearToolResultsFilter(700, TIKTOKEN, keep=1),
                                       SummarizingBudgetFilter(800, TIKTOKEN, summarize=bad, summary_max_tokens=100)])

    b, ref = builder(), general(builder())
    state: dict[str, Any] = {"messages": []}
    seen = []
    for m in history(3, 60, False):
        state["messages"].append(m)
        with warnings.catch_warnings(record=True) as hot_w:
            warnings.simplefilter("always")
            got = outcome(b, state, None)
        with warnings.catch_warnings(record=True) as ref_w:
            warnings.simplefilter("always")
            want = outcome(ref, state, None)
        assert got == want
        assert [type(w.message) for w in hot_w] == [type(w.message) for w in ref_w]
        seen += [type(w.message) for w in hot_w]
    assert b.filters[-1].calls > 0 and SummaryFailedWarning in seen


def test_subclasses_and_replaced_methods_leave_the_hot_path():
    class MyClear(ClearToolResultsFilter):
        pass

    def builder(*filters: Any) -> ContextBuilder:
        return ContextBuilder(providers=[StaticPromptProvider("x"), StateHistoryProvider()], filters=list(filters))

    assert builder(MyClear(100))._hot is None
    assert builder(ToolResultCapFilter(10), TokenBudgetFilter(100))._hot is not None
    state = {"messages": history(5, 30, False)}
    b = builder(ToolResultCapFilter(50, TIKTOKEN), ClearToolResultsFilter(300, TIKTOKEN, keep=1),
                SummarizingBudgetFilter(400, TIKTOKEN, summarize=summarize, summary_max_tokens=50))
    want = dump(b.build(state))
    for flt, name in [(b.filters[0], "apply"), (b.filters[1], "apply"), (b.filters[2], "apply"), (b.filters[2], "_trim")]:
        original = getattr(flt, name)
        calls: list[int] = []

        def spy(*a: Any, _orig: Any = original, _calls: list = calls, **k: Any) -> Any:
            _calls.append(1)
            return _orig(*a, **k)

        setattr(flt, name, spy)
        assert b._hot_plan() is None
        assert dump(b.build(state)) == want and calls  # the instance's method ran
        delattr(flt, name)
        assert b._hot_plan() is not None
    b.filters.append(MyClear(100))  # a changed filter list: derived again
    assert b._hot_plan() is None
    b.filters.pop()
    assert b._hot_plan() is not None and dump(b.build(state)) == want


def test_pickled_and_threaded_builders_with_editing_stages():
    b = ContextBuilder.for_react("You are an agent.", max_tokens=1500, token_counter=TIKTOKEN,
                                 tool_result_max_tokens=300, clear_tool_results=2, summarize=summarize)
    hist = history(11, 80, False)
    state = {"messages": hist[:150]}
    first = dump(b.build(state))
    other = pickle.loads(pickle.dumps(b))
    assert other._turn is None and dump(other.build(state)) == first and other._turn is not None
    states = [{"messages": history(20 + t, 50, False)} for t in range(4)]
    want = [outcome(ContextBuilder.for_react("You are an agent.", max_tokens=1500, token_counter=TIKTOKEN,
                                             tool_result_max_tokens=300, clear_tool_results=2, summarize=summarize),
                    s, None) for s in states]
    errors: list[Any] = []

    def run(t: int) -> None:
        try:
            for _ in range(25):
                if outcome(b, {"messages": list(states[t]["messages"])}, None) != want[t]:
                    errors.append(t)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# -- the hot hand-off (``_hot_apply``): stages hand on their own lists -----------------------------


def _handoff_builder(filters: list[Any]) -> ContextBuilder:
    return ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                          filters=filters)


@given(seed=st.integers(0, 10**6), last=st.sampled_from(["cap", "clear", "cap+clear", "clear+cap"]),
       keep=st.integers(0, 3), at_least=st.sampled_from([0, 100, 1000]))
@SETTINGS
def test_hand_off_with_the_stage_last_shared_and_called_directly(seed, last, keep, at_least):
    """An editing stage last (its own list is copied before it leaves the builder), the same
    stages shared by two builders over two histories, and a stage's ``apply`` called directly
    between hot builds: every output equals the general path's of a builder with its own stages."""
    def stages() -> list[Any]:
        cap, clear = ToolResultCapFilter(150, TIKTOKEN), ClearToolResultsFilter(900, TIKTOKEN, keep=keep,
                                                                              clear_at_least=at_least)
        return {"cap": [cap], "clear": [clear], "cap+clear": [cap, clear], "clear+cap": [clear, cap]}[last]

    shared = stages()
    a, b = _handoff_builder(shared), _handoff_builder(list(shared))
    ref_a, ref_b = general(_handoff_builder(stages())), general(_handoff_builder(stages()))
    ha, hb = history(seed, 30, False), history(seed + 7, 30, False)
    rnd = random.Random(seed)
    sa: dict[str, Any] = {"messages": []}
    sb: dict[str, Any] = {"messages": []}
    outs: list[list[Message]] = []
    for end in range(1, max(len(ha), len(hb)) + 1, 2):
        sa["messages"].extend(ha[len(sa["messages"]):end])
        got = outcome(a, sa, None)
        assert got == outcome(ref_a, sa, None)
        if got[0] == "ok":
            out = a.build(sa)
            assert out is not a._turn.prompt and all(out is not f._rec.out for f in shared if hasattr(f, "_rec"))
            assert all(out is not f._last[1] for f in shared if hasattr(f, "_last") and f._last is not None)
            outs.append(out)
        if rnd.random() < 0.5:  # the second builder, same stage objects, another history
            sb["messages"].extend(hb[len(sb["messages"]):end])
            assert outcome(b, sb, None) == outcome(ref_b, sb, None)
        if rnd.random() < 0.2:  # the stage's public apply between hot builds: a new list, the input untouched
            flt = rnd.choice(shared)
            given = list(hb[:end])
            applied = flt.apply(given)
            assert given == hb[:end] and applied is not given
            assert dump(applied) == dump(stages_like(flt).apply(list(hb[:end])))
    snapshot = [dump(o) for o in outs]
    assert outcome(a, sa, None) == outcome(ref_a, sa, None)
    assert [dump(o) for o in outs] == snapshot  # nothing handed out was changed afterwards


def stages_like(flt: Any) -> Any:
    """A fresh stage with ``flt``'s settings."""
    if isinstance(flt, ToolResultCapFilter):
        return ToolResultCapFilter(flt.max_tokens, flt.counter)
    return ClearToolResultsFilter(flt.trigger_tokens, flt.counter, keep=flt.keep, clear_at_least=flt.clear_at_least)


class FlakyCounter(TiktokenTokenCounter):
    """A tiktoken counter whose message count fails (not a library error) while ``fail`` is set."""

    fail = False

    def count_message(self, message: Message) -> int:
        if self.fail:
            raise RuntimeError("counter down")
        return super().count_message(message)


def test_hand_off_after_a_failing_counter_and_a_non_append_edit():
    counter = FlakyCounter("o200k_base")
    hist = history(5, 60, False)

    def builder() -> ContextBuilder:
        return _handoff_builder([ToolResultCapFilter(200, counter), ClearToolResultsFilter(1500, counter, keep=1,
                                                                                            clear_at_least=300),
                                 TokenBudgetFilter(1500, counter, eviction="chunked", chunk=300)])

    hot, ref = builder(), general(builder())
    state: dict[str, Any] = {"messages": []}
    for i, m in enumerate(hist):
        state["messages"].append(m)
        if i % 17 == 5:  # the clearing's count fails: a library error on both paths, same message
            counter.fail = True
            try:
                assert outcome(hot, state, None) == outcome(ref, state, None)
            finally:
                counter.fail = False
        if i % 23 == 11:  # an edit that is not appending: a new history list
            state["messages"] = state["messages"][:-2] + [human(f"edited {i}")] + state["messages"][-1:]
        assert outcome(hot, state, None) == outcome(ref, state, None)
    assert hot._turn is not None


def test_a_setting_changed_between_hot_builds_applies_as_to_a_new_filter():
    """The clearing's records (made by the compiled turn too) start anew when a setting changes:
    the hot path, the general path and a fresh builder with the new settings agree."""
    hist = history(9, 120, False)
    assert len(hist) > 200

    def builder(**kw: Any) -> ContextBuilder:
        return _handoff_builder([ClearToolResultsFilter(1200, TIKTOKEN, **kw),
                                 TokenBudgetFilter(1500, TIKTOKEN, eviction="chunked", chunk=300)])

    hot, ref = builder(keep=2, clear_at_least=300), general(builder(keep=2, clear_at_least=300))
    state: dict[str, Any] = {"messages": []}
    changes = {40: ("keep", 0), 80: ("exclude_tools", frozenset({"search"})), 120: ("clear_tool_inputs", True),
               160: ("placeholder", "[gone]"), 200: ("clear_at_least", 0)}
    now = {"keep": 2, "clear_at_least": 300}
    for i, m in enumerate(hist):
        state["messages"].append(m)
        if i in changes:
            name, value = changes[i]
            setattr(hot.filters[0], name, value)
            setattr(ref.filters[0], name, value)
            now[name] = value
        got = outcome(hot, state, None)
        assert got == outcome(ref, state, None)
        if i in changes or i == len(hist) - 1:
            assert got == outcome(builder(**now), {"messages": list(state["messages"])}, None), i


def test_stages_shared_by_builders_in_threads():
    """Builders that share their cap and clearing stages, each in its own thread over its own
    growing history (the cap's hot call appends without the stage's lock): every output equals
    a lone builder's."""
    cap, clear = ToolResultCapFilter(120, TIKTOKEN), ClearToolResultsFilter(900, TIKTOKEN, keep=1, clear_at_least=200)

    def builder(*stages: Any) -> ContextBuilder:
        return _handoff_builder([*stages, TokenBudgetFilter(1000, TIKTOKEN, eviction="chunked", chunk=200)])

    hists = [history(30 + t, 60, False) for t in range(4)]
    want = []
    for h in hists:
        lone = builder(ToolResultCapFilter(120, TIKTOKEN), ClearToolResultsFilter(900, TIKTOKEN, keep=1, clear_at_least=200))
        state: dict[str, Any] = {"messages": []}
        got = []
        for m in h:
            state["messages"].append(m)
            got.append(outcome(lone, state, None))
        want.append(got)
    errors: list[Any] = []

    def run(t: int) -> None:
        b = builder(cap, clear)
        state: dict[str, Any] = {"messages": []}
        try:
            for _ in range(3):
                state["messages"] = []
                for j, m in enumerate(hists[t]):
                    state["messages"].append(m)
                    if outcome(b, state, None) != want[t][j]:
                        errors.append((t, j))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter allows
    try:
        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_the_builder_calls_the_clearing_through_its_compiled_turn(monkeypatch):
    """On the agent loop's turns the builder calls the clearing's ``_hot_turn`` and no Python
    ``_hot_apply`` runs but on the first turn: a turn that takes a step gets its cleared copies
    from the turn too (``ClearingTurn._step``: a new list, made the filter's); every prompt
    equals the general path's."""
    calls = []
    real = ClearToolResultsFilter._hot_apply

    def counted(self, src, tools_schema=None):
        calls.append(len(src))
        return real(self, src, tools_schema)

    monkeypatch.setattr(ClearToolResultsFilter, "_hot_apply", counted)
    clear = ClearToolResultsFilter(1200, TIKTOKEN, keep=2, clear_at_least=200)
    b = ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                       filters=[clear, TokenBudgetFilter(1200, TIKTOKEN, eviction="chunked", chunk=200)])
    ref = general(ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                                 filters=[ClearToolResultsFilter(1200, TIKTOKEN, keep=2, clear_at_least=200),
                                          TokenBudgetFilter(1200, TIKTOKEN, eviction="chunked", chunk=200)]))
    hist: list[Message] = [human("start")]
    steps = 0
    for i in range(40):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool(f"result {i} " + "data " * (30 + 7 * (i % 5)), tool_call_id=f"c{i}")]
        before = clear._rec.cleared
        assert dump(b.build({"messages": hist})) == dump(ref.build({"messages": hist}))
        steps += clear._rec.cleared > before
    assert steps >= 2 and len(calls) <= 2  # the first turn (and the counts' first turn): no step's
    outs = set()
    for i in range(40, 60):  # a step turn's list is new, made the filter's, and armed: the next turn extends it
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool(f"result {i} " + "data " * (30 + 7 * (i % 5)), tool_call_id=f"c{i}")]
        before, prev_out = clear._rec.cleared, clear._rec.out
        assert dump(b.build({"messages": hist})) == dump(ref.build({"messages": hist}))
        assert clear._hot_turn.armed and clear._turn_args[2] is clear._rec.out
        budget_rec = b.filters[1]._rec
        if clear._rec.cleared > before:
            assert clear._rec.out is not prev_out and clear._rec.out[:len(prev_out)] != prev_out
            outs.add(id(clear._rec.out))
            # what the turn hands the budget's records (Records.hint): the positions it replaced
            out, positions, originals, counts = clear._hot_turn.changed
            assert out is clear._rec.out and positions == sorted(positions) and positions
            # and the copies' counts, from the counter's cache: the budget's records take them as they are
            assert counts == [TIKTOKEN.count_message(out[p]) for p in positions]
            for p, orig in zip(positions, originals):
                assert orig is prev_out[p] and out[p] is not orig and out[p].content == "[cleared]"
                assert (out[p].role, out[p].tool_call_id, out[p].id) == (orig.role, orig.tool_call_id, orig.id)
            assert all(p in positions for p in range(len(prev_out)) if out[p] is not prev_out[p])
        else:
            assert clear._rec.out is prev_out and clear._hot_turn.changed is None
        assert all(x is y for x, y in zip(budget_rec.msgs, clear._rec.out)) and budget_rec.n == len(clear._rec.out)
        assert budget_rec.counts.tolist() == [TIKTOKEN.count_message(m) for m in clear._rec.out]
        # the clearing's records, which the budget reads for the turn's new messages (Records.window's known)
        ref_, counts_, counter_ = clear._hot_turn.counted
        assert ref_ is clear._rec.messages and counts_ is clear._rec.counts and counter_ is TIKTOKEN
    assert outs and len(calls) <= 2


def test_a_clearing_step_hands_its_positions_to_the_budgets_records(monkeypatch):
    """A step of the clearing's compiled turn hands the budget's records the positions it
    replaced (``Records.hint``): they patch those records without comparing the others
    (``_match_hinted`` holds, on the twin, where it can be watched); prompts equal the
    general path's. A stage between them, or another next filter, gets no hint."""
    from jianmu_fast import _backend
    from jianmu_fast import _filter_core_py
    from jianmu_fast.memory.context.builder import _hint_to

    clear = ClearToolResultsFilter(1200, TIKTOKEN, keep=2, clear_at_least=200)
    budget = TokenBudgetFilter(1200, TIKTOKEN, eviction="chunked", chunk=200)
    assert _hint_to(clear, budget) == (clear._hot_turn, budget)
    assert _hint_to(clear, ClearToolResultsFilter(1200, TIKTOKEN)) is None and _hint_to(budget, clear) is None
    hinted = []
    if _backend.BACKEND == "python":
        real = _filter_core_py.Records._match_hinted

        def watched(self, msgs, patched, originals, counts=None):
            k = real(self, msgs, patched, originals, counts)
            hinted.append(k)
            return k

        monkeypatch.setattr(_filter_core_py.Records, "_match_hinted", watched)
    b = ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                       filters=[clear, budget])
    ref = general(ContextBuilder(providers=[StaticPromptProvider("You are a careful agent."), StateHistoryProvider()],
                                 filters=[ClearToolResultsFilter(1200, TIKTOKEN, keep=2, clear_at_least=200),
                                          TokenBudgetFilter(1200, TIKTOKEN, eviction="chunked", chunk=200)]))
    hist: list[Message] = [human("start")]
    steps = 0
    for i in range(60):
        hist += [ai(None, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                 tool(f"result {i} " + "data " * (30 + 7 * (i % 5)), tool_call_id=f"c{i}")]
        before = clear._rec.cleared
        assert dump(b.build({"messages": hist})) == dump(ref.build({"messages": hist}))
        steps += clear._rec.cleared > before and clear._hot_turn.changed is not None
    assert steps >= 2
    if _backend.BACKEND == "python":
        assert len(hinted) >= steps - 1 and all(k >= 0 for k in hinted)
