"""Issue 13: one implementation. A trimming filter's ``apply()`` (incremental along a growing
history), a fresh filter, ``build()`` and ``build_batch`` give the same prompts, on both
backends: random conversations and real-shaped customer-service traces, histories grown in
place (the agent loop), every eviction mode."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import conversations

from jianmu_fast.batch import build_batch_report
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


def _sent(prompt):
    return [m.to_openai() for m in prompt]


def _outcome(fn):
    """What is sent (builders differ in the ids of their persona messages), or the error."""
    try:
        return _sent(fn())
    except JianmuError as exc:
        return (type(exc), str(exc))


def _filters(kind, budget, from_start, counter):
    if kind == "max":
        return [MaxMessagesFilter(max(1, budget // 20), trim_from_start=from_start)]
    if kind == "chunked":
        return [TokenBudgetFilter(budget, counter, eviction="chunked", chunk=max(1, budget // 4))]
    if kind == "both":
        return [MaxMessagesFilter(max(1, budget // 15)), TokenBudgetFilter(budget, counter, trim_from_start=from_start)]
    return [TokenBudgetFilter(budget, counter, trim_from_start=from_start)]


def _builder(kind, budget, from_start, counter):
    return ContextBuilder([StaticPromptProvider("Be brief."), StateHistoryProvider()],
                          _filters(kind, budget, from_start, counter))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(max_units=16), st.integers(20, 500), st.booleans(),
       st.sampled_from(["tokens", "max", "chunked", "both"]), st.data())
def test_in_place_growth_equals_fresh_builds_and_the_batch(msgs, budget, from_start, kind, data):
    counter = SimpleTokenCounter()
    hot = _builder(kind, budget, from_start, counter)
    history: list = []
    state = {"messages": history}
    snapshots = []
    k = 0
    while k < len(msgs):  # grow by whole units, in place, as an agent loop does
        step = data.draw(st.integers(1, 4))
        j = min(len(msgs), k + step)
        while j < len(msgs) and msgs[j].role == "tool":
            j += 1
        history.extend(msgs[k:j])
        k = j
        got = _outcome(lambda: hot.build(state))
        fresh = _outcome(lambda: _builder(kind, budget, from_start, counter).build({"messages": list(history)}))
        assert got == fresh
        snapshots.append(({"messages": list(history)}, fresh))
        if data.draw(st.booleans()):  # a repeated call on the unchanged history
            assert _outcome(lambda: hot.build(state)) == fresh
    if len(snapshots) > 1:
        report = build_batch_report(_builder(kind, budget, from_start, counter), [s for s, _ in snapshots])
        failed = {f.index: (type(f.error), str(f.error)) for f in report.failures}
        for i, (_, want) in enumerate(snapshots):
            assert (failed[i] if i in failed else _sent(report.prompts[i])) == want


@pytest.mark.parametrize("budget", [2000, 5000, 8000])
def test_real_shaped_traces_batch_equals_build_and_the_hot_loop(budget):
    bench = pytest.importorskip("benchmarks.traces")
    from jianmu_fast.message import coerce_messages

    counter = TiktokenTokenCounter("o200k_base")
    convs = [coerce_messages(c) for c in bench.make_cs_conversations(12, seed=budget)]
    states = [{"messages": c[:k]} for c in convs for k in range(2, len(c) + 1, 3)]
    b = ContextBuilder.for_react("You are a support agent.", max_tokens=budget, token_counter=counter)
    report = build_batch_report(b, states)
    failed = {f.index: (type(f.error), str(f.error)) for f in report.failures}
    fresh = ContextBuilder.for_react("You are a support agent.", max_tokens=budget, token_counter=counter)
    for i, s in enumerate(states):
        want = _outcome(lambda: fresh.build(s))
        assert (failed[i] if i in failed else _sent(report.prompts[i])) == want
    # the agent loop over a stitched 300-message history, grown in place
    hist = coerce_messages(bench.make_cs_history(300, seed=budget))
    hot = ContextBuilder.for_react("You are a support agent.", max_tokens=budget, token_counter=counter)
    grown: list = []
    for m in hist:
        grown.append(m)
        if m.tool_calls:
            continue
        assert _outcome(lambda: hot.build({"messages": grown})) == _outcome(
            lambda: ContextBuilder.for_react("You are a support agent.", max_tokens=budget,
                                             token_counter=counter).build({"messages": list(grown)}))


def test_an_overridden_apply_is_honoured_by_build_and_the_batch():
    """The builder and the batch call a trimming filter's routine directly only when its
    apply() is the library's own: a subclass's (or an instance's) apply still runs."""
    from jianmu_fast.batch import build_batch
    from jianmu_fast.message import human

    seen = []

    class Logged(TokenBudgetFilter):
        def apply(self, messages, *args, **kwargs):
            seen.append(len(messages))
            return super().apply(messages, *args, **kwargs)

    b = ContextBuilder([StateHistoryProvider()], [Logged(100)])
    states = [{"messages": [human("x" * 40) for _ in range(k)]} for k in (1, 3, 30)]
    outs = [b.build(s) for s in states]
    assert seen == [1, 3, 30]
    assert build_batch(b, states) == outs and seen[3:] == [1, 3, 30]
    plain = TokenBudgetFilter(100)
    plain.apply = lambda messages, *a, **k: (seen.append("instance"), messages[-1:])[1]  # type: ignore[method-assign]
    b2 = ContextBuilder([StateHistoryProvider()], [plain])
    assert [len(p) for p in build_batch(b2, states)] == [1, 1, 1] and seen.count("instance") == 3
    assert len(b2.build(states[2])) == 1 and seen.count("instance") == 4
