"""``jianmu_fast.batch``: batch assembly equals ``builder.build()`` per state, errors included."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import conversations

import jianmu_fast.batch as batch
from jianmu_fast.batch import BatchFailure, BatchReport, build_batch, build_batch_report, transform_batch
from jianmu_fast.errors import BatchError, ContextBudgetError, JianmuError
from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    SimpleTokenCounter,
    StaticPromptProvider,
    TokenBudgetFilter,
)
from jianmu_fast.message import Message, ai, human, system, tool

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))


class History:
    """Returns ``local_state["messages"]``; raises on demand to exercise error isolation."""

    def get_messages(self, local_state, global_state=None, ctx=None):
        if local_state.get("provider_fails") == "runtime":
            raise RuntimeError("history backend down")
        if local_state.get("provider_fails") == "jianmu":
            raise ContextBudgetError("provider refuses this state")
        return local_state["messages"]


class DropLongest:
    """A non-trimming Python filter: drops the longest user message (tests pipeline order)."""

    def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
        users = [m for m in messages if m.role == "user"]
        if not users:
            return list(messages)
        longest = max(users, key=lambda m: len(m.text()))
        return [m for m in messages if m is not longest]


class Flaky:
    """A filter that raises a plain exception for some states: logged and skipped by build()."""

    def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
        if local_state and local_state.get("filter_fails"):
            raise KeyError("flaky filter")
        return messages[::-1][::-1]


class BrokenCounter(SimpleTokenCounter):
    """Counts like SimpleTokenCounter but fails on a marker text (a non-Jianmu error)."""

    def count_message(self, message):
        if message.content == "BOOM":
            raise ZeroDivisionError("counter bug")
        return super().count_message(message)


def _text(rng: random.Random, lo: int = 0, hi: int = 400) -> str:
    alphabet = "abcdefghij klmnop{}\":,é中🙂\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def random_history(rng: random.Random) -> list[Message]:
    """A history with pinned system messages, users, answers, tool transactions, and now
    and then something broken (an orphan result, an unanswered call at the tail)."""
    msgs: list[Message] = [system(_text(rng, 1, 80)) for _ in range(rng.choice([0, 1, 1, 2]))]
    call_no = 0
    for _ in range(rng.randint(0, rng.choice([3, 12, 40]))):
        r = rng.random()
        if r < 0.3:
            msgs.append(human(_text(rng)))
        elif r < 0.55:
            msgs.append(ai(_text(rng)))
        elif r < 0.93:
            calls = []
            for _ in range(rng.choice([1, 1, 2, 3])):
                call_no += 1
                calls.append({"id": f"call_{call_no}", "type": "function",
                              "function": {"name": rng.choice(["search", "read_file"]),
                                           "arguments": json.dumps({"q": _text(rng, 0, 40)})}})
            msgs.append(ai(rng.choice([None, _text(rng, 0, 30)]), tool_calls=calls))
            msgs.extend(tool(_text(rng), tool_call_id=c["id"]) for c in calls)
        elif r < 0.97:
            msgs.append(system(_text(rng, 1, 50)))
        else:
            msgs.append(tool("orphan " + _text(rng, 0, 20), tool_call_id="nobody"))
    if rng.random() < 0.03:
        msgs.append(ai(None, tool_calls=[{"id": "dangling", "type": "function",
                                          "function": {"name": "search", "arguments": "{}"}}]))
    if rng.random() < 0.01:
        msgs.append(human("BOOM"))
    return msgs


def random_states(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    states = []
    for _ in range(n):
        state: dict = {"messages": random_history(rng)}
        r = rng.random()
        if r < 0.02:
            state["provider_fails"] = "runtime"
        elif r < 0.03:
            state["provider_fails"] = "jianmu"
        elif r < 0.05:
            state["filter_fails"] = True
        states.append(state)
    return states


BUILDERS = {
    "max-messages": lambda: [MaxMessagesFilter(9)],
    "max-messages-oldest": lambda: [MaxMessagesFilter(7, trim_from_start=False)],
    "max-messages-chunked": lambda: [MaxMessagesFilter(8, eviction="chunked", chunk=3)],
    "tokens": lambda: [TokenBudgetFilter(400)],
    "tokens-oldest": lambda: [TokenBudgetFilter(500, trim_from_start=False)],
    "tokens-chunked": lambda: [TokenBudgetFilter(600, eviction="chunked", chunk=150)],
    "tokens-pin-user": lambda: [TokenBudgetFilter(300, counter=SimpleTokenCounter(3),
                                                  pinned_roles=("system", "user"))],
    "both-and-python": lambda: [MaxMessagesFilter(20), Flaky(), DropLongest(), TokenBudgetFilter(350)],
    "tiny-budget": lambda: [TokenBudgetFilter(30)],
    "broken-counter": lambda: [TokenBudgetFilter(500, counter=BrokenCounter())],
}


def outcomes(builder, states):
    """What ``build()`` gives per state: the prompt, or (error type, message)."""
    out = []
    for s in states:
        try:
            out.append(builder.build(s))
        except JianmuError as exc:
            out.append((type(exc), str(exc)))
    return out


def batch_outcomes(report: BatchReport):
    out = list(report.prompts)
    for f in report.failures:
        assert out[f.index] is None
        out[f.index] = (type(f.error), str(f.error))
    return out


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.CRITICAL, logger="jianmu_fast")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_build_batch_equals_build_per_state(core, name):
    builder = ContextBuilder([StaticPromptProvider("You are terse."), History()], BUILDERS[name]())
    states = random_states(seed=sum(map(ord, name)), n=400)
    expected = outcomes(builder, states)
    report = build_batch_report(builder, states)
    assert batch_outcomes(report) == expected
    assert len(report.prompts) == len(states)
    failed = [i for i, e in enumerate(expected) if isinstance(e, tuple)]
    assert [f.index for f in report.failures] == failed
    if name == "tiny-budget":
        assert len(failed) > 50  # the error paths are exercised, not only the happy one


def test_message_identity_is_kept(core):
    """Equal is not enough: the prompt holds the very Message objects build() returns."""
    builder = ContextBuilder([StaticPromptProvider("sys"), History()], [TokenBudgetFilter(400)])
    states = [s for s in random_states(7, 300) if "provider_fails" not in s]
    for got, s in zip(build_batch(builder, states, on_error="skip"), states):
        try:
            want = builder.build(s)
        except JianmuError:
            assert got == []
            continue
        assert [id(m) for m in got] == [id(m) for m in want]


@settings(deadline=None, max_examples=min(MAX_EXAMPLES, 100))
@given(histories=st.lists(conversations(max_units=20), min_size=2, max_size=12),
       budget=st.integers(1, 300), max_messages=st.integers(1, 12), from_start=st.booleans())
def test_batch_equals_build_hypothesis(histories, budget, max_messages, from_start):
    builder = ContextBuilder(
        [History()],
        [MaxMessagesFilter(max_messages, trim_from_start=from_start),
         TokenBudgetFilter(budget, trim_from_start=from_start)],
    )
    states = [{"messages": h} for h in histories]
    assert batch_outcomes(build_batch_report(builder, states)) == outcomes(builder, states)


@pytest.mark.parametrize("threads", [False, True])
def test_exact_tiktoken_counter(core, threads, monkeypatch):
    """Exact counts, counted in one thread, or split over two (forced for small batches)."""
    import jianmu_fast.memory.context._batch_plan as plan
    from jianmu_fast.memory.context import TiktokenTokenCounter

    if threads:  # forced: small batches, two CPUs allowed, an idle core whatever the machine's load
        monkeypatch.setattr(plan, "PARALLEL_MIN", 16)
        monkeypatch.setattr(plan, "_CPUS", 2)
        monkeypatch.setattr(plan, "PARALLEL_CPUS", 2)
        monkeypatch.setattr(plan, "_idle_core", lambda: True)
    else:
        monkeypatch.setattr(plan, "PARALLEL_MIN", 1 << 62)
    import threading

    counter = TiktokenTokenCounter("o200k_base", engine="tiktoken")  # "auto" counts in one thread
    budget = TokenBudgetFilter(250, counter=counter)
    threads_seen: set[str] = set()
    counts = budget._counts

    def spy(messages, lo, hi):
        threads_seen.add(threading.current_thread().name)
        return counts(messages, lo, hi)

    monkeypatch.setattr(budget, "_counts", spy)
    builder = ContextBuilder([StaticPromptProvider("You are terse."), History()],
                             [MaxMessagesFilter(30), budget])
    states = random_states(seed=11, n=600)
    got = batch_outcomes(build_batch_report(builder, states))
    assert (threads_seen != {threading.current_thread().name}) == threads
    assert got == outcomes(builder, states)


def test_transform_batch_equals_transform(core):
    builder = ContextBuilder(filters=[TokenBudgetFilter(300)])
    states = random_states(3, 200)
    lists = [[m.to_openai() for m in s["messages"]] for s in states]
    got = batch_outcomes(batch.transform_batch_report(builder, lists))
    for g, ms in zip(got, lists):
        try:
            want = builder.transform(ms)
        except JianmuError as exc:
            assert g == (type(exc), str(exc))
        else:  # dicts are coerced to new Messages: compare what is sent
            assert [m.to_openai() for m in g] == [m.to_openai() for m in want]


def test_transform_batch_passes_local_states():
    seen = []

    class Spy:
        def apply(self, messages, local_state=None, global_state=None, ctx=None, **kwargs):
            seen.append((local_state, global_state, ctx, kwargs.get("tools_schema")))
            return messages

    tools = [{"type": "function", "function": {"name": "f"}}]
    transform_batch(ContextBuilder(filters=[Spy()]), [[human("a")], [human("b")]],
                    local_states=["s0", "s1"], global_state="g", ctx="c", tools_schema=tools)
    assert seen == [("s0", "g", "c", tools), ("s1", "g", "c", tools)]
    with pytest.raises(ValueError, match="local_states has 1 entries, message_lists has 2"):
        transform_batch(ContextBuilder(), [[], []], local_states=[None])


def test_on_error_raise_names_the_lowest_failing_index():
    builder = ContextBuilder([History()], [MaxMessagesFilter(1)])
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    too_big = {"messages": [human("q"), ai(None, tool_calls=call), tool("r", tool_call_id="c1")]}
    ok = {"messages": [human("q")]}
    with pytest.raises(BatchError, match=r"^states\[1\] failed: ContextBudgetError: MaxMessagesFilter") as info:
        build_batch(builder, [ok, too_big, ok, too_big])
    assert info.value.index == 1
    assert isinstance(info.value.__cause__, ContextBudgetError)
    assert info.value.error is info.value.__cause__
    assert isinstance(info.value, ValueError)
    # skip: the failed slot is [] in build_batch, None in the report
    assert [len(p) for p in build_batch(builder, [ok, too_big, ok], on_error="skip")] == [1, 0, 1]
    report = build_batch_report(builder, [ok, too_big, ok])
    assert report.prompts[1] is None and [f.index for f in report.failures] == [1]
    assert not report.ok


def test_bad_arguments():
    b = ContextBuilder()
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        build_batch(b, [], on_error="ignore")
    with pytest.raises(ValueError, match="workers must be a positive int, got 0"):
        build_batch(b, [], workers=0)
    with pytest.raises(TypeError, match="builder: expected a ContextBuilder, got dict"):
        build_batch({}, [])
    assert build_batch(b, []) == []


def test_workers_keep_order_and_report_failures():
    builder = ContextBuilder([StaticPromptProvider("sys"), History()],
                             [MaxMessagesFilter(12), TokenBudgetFilter(200)])
    states = random_states(5, 150)
    report = build_batch_report(builder, states, workers=2)
    assert batch_outcomes(report) == outcomes(builder, states)
    assert report.failures  # some fail, and their indices are global, not per chunk
    with pytest.raises(BatchError) as info:
        build_batch(builder, states, workers=2)
    assert info.value.index == report.failures[0].index


def test_batch_error_pickles():
    err = BatchError("states[2] failed", index=2, error=ContextBudgetError("x", budget=5))
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.index, back.error.budget) == ("states[2] failed", 2, 5)


def test_counting_is_one_call_per_step(core):
    """All prompts' tails are counted together: a handful of count_array calls per batch,
    never one per prompt; the compiled planner decides every prompt in one call per round
    (a few rounds per stage), and one call decides which outputs need sanitizing."""
    calls = {"count_array": 0, "plan_windows": 0, "sanitize_windows": 0, "plan_window": 0}

    class Counting(SimpleTokenCounter):
        def count_array(self, messages):
            calls["count_array"] += 1
            return super().count_array(messages)

    import jianmu_fast._backend as backend_module

    def spy(name):
        real = getattr(backend_module, name)

        def call(*args):
            calls[name] += 1
            return real(*args)
        return real, call

    builder = ContextBuilder([History()], [MaxMessagesFilter(50), TokenBudgetFilter(300, counter=Counting())])
    rng = random.Random(1)
    pool = [human(_text(rng, 10, 200)) for _ in range(400)]
    states = [{"messages": pool[:rng.randint(1, 400)]} for _ in range(300)]
    saved = {}
    for name in ("plan_windows", "sanitize_windows", "plan_window"):
        saved[name], fake = spy(name)
        setattr(backend_module, name, fake)
    try:
        out = build_batch(builder, states)
    finally:
        for name, real in saved.items():
            setattr(backend_module, name, real)
    assert calls["plan_window"] == 0  # no prompt went the one-by-one way
    assert 2 <= calls["plan_windows"] <= 6
    assert calls["sanitize_windows"] == 1
    assert 1 <= calls["count_array"] <= 4
    assert out == [builder.build(s) for s in states]


def test_progress_without_tqdm(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm" or name.startswith("tqdm."):
            raise ImportError("no tqdm")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    assert batch._progress_bar(3, True) is None
    b = ContextBuilder([History()])
    assert build_batch(b, [{"messages": [human("a")]}], progress=True)[0][0].content == "a"


def test_batch_failure_reason():
    assert BatchFailure(0, KeyError("k")).reason == "KeyError: 'k'"


def test_providers_see_shared_histories_grouped_and_results_keep_input_order():
    """States that are prefixes of one history are provided shortest first (so incremental
    providers extend their previous output); the results come back in input order."""
    seen = []

    class Spy(History):
        def get_messages(self, local_state, global_state=None, ctx=None):
            seen.append(len(local_state["messages"]))
            return super().get_messages(local_state, global_state, ctx)

    conv = [human(f"m{i}") for i in range(30)]
    other = [human(f"o{i}") for i in range(30)]
    states = [{"messages": conv[:k]} for k in (20, 5, 30)] + [{"messages": other[:7]}, {"x": 1}, {"messages": conv[:9]}]
    states[4] = {"messages": []}
    builder = ContextBuilder([Spy()], [MaxMessagesFilter(3)])
    out = build_batch(builder, states)
    assert sorted(seen) == sorted([20, 5, 30, 7, 0, 9])  # once per state
    assert [n for n in seen if n in (5, 9, 20, 30)] == [5, 9, 20, 30]
    assert out == [builder.build(s) for s in states]


def test_the_garbage_collector_is_paused_during_the_batch_and_restored():
    import gc

    seen = []

    class Probe:
        def get_messages(self, local_state, global_state=None, ctx=None):
            seen.append(gc.isenabled())
            if local_state == "boom":
                raise KeyError("provider bug")  # logged and skipped by build()
            return [human("hi")]

    b = ContextBuilder([Probe()], [MaxMessagesFilter(1)])
    assert gc.isenabled()
    assert len(build_batch(b, [{}, "boom"])) == 2
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    from jianmu_fast.memory.context.providers.state_history import StateHistoryProvider

    gc.callbacks.append(count)
    try:
        history = ContextBuilder([StaticPromptProvider("s"), StateHistoryProvider()], [MaxMessagesFilter(2)])
        conv = [human(f"m{i}") for i in range(5)]
        assert len(build_batch(history, [{"messages": conv[:k]} for k in range(1, 6)])) == 5
        build_batch(b, [{}])
        assert not gc.isenabled()  # left as the caller had it
        assert collections == []  # and no collection made meanwhile
    finally:
        gc.callbacks.remove(count)
        gc.enable()

    class Stop(BaseException):
        pass

    class Interrupting:
        def get_messages(self, local_state, global_state=None, ctx=None):
            raise Stop()  # not an Exception: it goes through the batch, which restores the collector

    with pytest.raises(Stop):
        build_batch(ContextBuilder([Interrupting()]), [{}, {}])
    assert gc.isenabled()
