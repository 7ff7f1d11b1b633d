"""MaxMessagesFilter and TokenBudgetFilter keep every invariant, on both backends."""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import MaxMessagesFilter, SimpleTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context.filters import split_units
from jianmu_fast.message import ai, human, system, tool
from invariants import assert_valid_transactions, leading_pinned, units_of
from strategies import conversations

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
COUNTER = SimpleTokenCounter()


# -- the design document's example -----------------------------------------------------------


def test_max_messages_design_doc_example(core):
    msgs = [system("sys1"), system("sys2"), human("u1"), ai("a1"), human("u2"), ai("a2"), human("u3"), ai("a3")]
    out = MaxMessagesFilter(max_messages=5, pinned_roles=("system",)).apply(msgs)
    assert [m.content for m in out] == ["sys1", "sys2", "a1", "u2", "a2", "u3", "a3"]


def test_max_messages_never_cuts_a_transaction(core):
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(2)]
    msgs = [system("s"), human("q"), ai(None, tool_calls=calls), tool("r0", tool_call_id="c0"),
            tool("r1", tool_call_id="c1"), ai("done")]
    out = MaxMessagesFilter(max_messages=3).apply(msgs)
    assert [m.content for m in out] == ["s", "done"]  # the 3-message transaction would need 4 slots
    out = MaxMessagesFilter(max_messages=4).apply(msgs)
    assert [m.role for m in out] == ["system", "assistant", "tool", "tool", "assistant"]


def test_newest_transaction_too_long_for_max_messages_raises(core):
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(3)]
    msgs = [system("s"), human("q"), ai(None, tool_calls=calls)] + [tool("r", tool_call_id=f"c{i}") for i in range(3)]
    with pytest.raises(ContextBudgetError) as info:
        MaxMessagesFilter(max_messages=3).apply(msgs)
    text = str(info.value)
    assert "messages[2:6] (assistant, tool, tool, tool), needs 4 messages" in text
    assert "the limit is 3 messages" in text
    assert (info.value.budget, info.value.pinned, info.value.newest) == (3, 0, 4)


def test_token_budget_error_says_what_each_part_needs(core):
    msgs = [system("x" * 40), human("y" * 400)]
    with pytest.raises(ContextBudgetError) as info:
        TokenBudgetFilter(max_tokens=60).apply(msgs)
    text = str(info.value)
    assert "the pinned prefix, messages[0:1], needs 14 tokens" in text
    assert "the newest unit, messages[1:2] (user), needs 104 tokens" in text
    assert "the limit is 60 tokens, 3 of them the request's fixed cost" in text
    assert isinstance(info.value, ValueError)


def test_pinned_prefix_over_budget_raises_even_without_history(core):
    with pytest.raises(ContextBudgetError, match="there is nothing else to drop"):
        TokenBudgetFilter(max_tokens=10).apply([system("z" * 100)])
    with pytest.raises(ContextBudgetError):
        TokenBudgetFilter(max_tokens=10).apply([system("z" * 100), human("hi")])


def test_keep_oldest_mode(core):
    msgs = [system("s"), human("a" * 8), ai("b" * 8), human("c" * 8)]
    out = TokenBudgetFilter(max_tokens=3 + 5 + 6 + 6, trim_from_start=False).apply(msgs)
    assert [m.content for m in out] == ["s", "a" * 8, "b" * 8]


def test_empty_and_all_pinned(core):
    assert TokenBudgetFilter(100).apply([]) == []
    only = [system("a"), system("b")]
    assert TokenBudgetFilter(100).apply(only) == only
    assert MaxMessagesFilter(1).apply(only) == only


def test_pinned_roles_are_configurable(core):
    msgs = [system("s"), human("pinned user"), ai("a1"), human("u2"), ai("a2")]
    out = MaxMessagesFilter(1, pinned_roles=("system", "user")).apply(msgs)
    assert [m.content for m in out] == ["s", "pinned user", "a2"]


def test_pinned_roles_set_later_are_checked_and_used(core):
    msgs = [system("s"), human("pinned user"), ai("a1"), human("u2"), ai("a2")]
    flt = MaxMessagesFilter(1)
    assert [m.content for m in flt.apply(msgs)] == ["s", "a2"]
    flt.pinned_roles = ["system", "user"]  # (any collection, as the constructor takes)
    assert flt.pinned_roles == frozenset({"system", "user"})
    assert [m.content for m in flt.apply(msgs)] == ["s", "pinned user", "a2"]
    with pytest.raises(ValueError, match=r"pinned_roles has unknown roles \['robot'\]"):
        flt.pinned_roles = ["robot"]
    with pytest.raises(TypeError, match="not a string"):
        flt.pinned_roles = "system"
    assert flt.pinned_roles == frozenset({"system", "user"})


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: MaxMessagesFilter(0), "max_messages must be a positive int of at most 2**53, got 0"),
        (lambda: MaxMessagesFilter(True), "max_messages must be a positive int of at most 2**53, got True"),
        (lambda: TokenBudgetFilter(-5), "max_tokens must be a positive int of at most 2**53, got -5"),
        (lambda: TokenBudgetFilter(2**53 + 1), "max_tokens must be a positive int of at most 2**53, got 9007199254740993"),
        (lambda: MaxMessagesFilter(2**64), "max_messages must be a positive int of at most 2**53, got 18446744073709551616"),
        (lambda: TokenBudgetFilter(10, eviction="chunked", chunk=2**64), "chunk= a positive int of at most 2**53 (tokens), got 18446744073709551616"),
        (lambda: TokenBudgetFilter(10, eviction="chunked", chunk=2**63 - 1), "chunk= a positive int of at most 2**53 (tokens)"),
        (lambda: TokenBudgetFilter(10, pinned_roles=("robot",)), "pinned_roles has unknown roles ['robot']"),
        (lambda: TokenBudgetFilter(10, eviction="lru"), "eviction must be 'exact' or 'chunked', got 'lru'"),
        (lambda: TokenBudgetFilter(10, eviction="chunked"), "needs chunk= a positive int of at most 2**53 (tokens), got None"),
        (lambda: MaxMessagesFilter(10, chunk=3), "chunk only applies to eviction='chunked'"),
    ],
)
def test_bad_arguments(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert message in str(info.value)


def test_bad_counter_and_roles_types():
    with pytest.raises(TypeError, match="counter: expected a TokenCounterProtocol"):
        TokenBudgetFilter(10, counter="tiktoken")
    with pytest.raises(TypeError, match="not a string"):
        MaxMessagesFilter(3, pinned_roles="system")


# -- properties --------------------------------------------------------------------------------


@given(msgs=conversations(), budget=st.integers(1, 400))
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_token_budget_invariants(core, msgs, budget):
    before = copy.deepcopy([m.model_dump() for m in msgs])
    f = TokenBudgetFilter(max_tokens=budget)
    try:
        out = f.apply(msgs)
    except ContextBudgetError as exc:
        n_pinned = leading_pinned(msgs)
        units = units_of(msgs, n_pinned)
        pinned = COUNTER.count_messages(msgs[:n_pinned])
        newest = sum(COUNTER.count_message(m) for m in units[-1]) if units else 0
        assert pinned + newest > budget
        assert (exc.pinned, exc.newest) == (pinned - 3, newest)
        return
    assert [m.model_dump() for m in msgs] == before, "input mutated"
    assert out is not msgs
    assert COUNTER.count_messages(out) <= budget
    n_pinned = leading_pinned(msgs)
    assert out[:n_pinned] == msgs[:n_pinned]
    rest = out[n_pinned:]
    assert rest == msgs[len(msgs) - len(rest):] if rest else True
    assert_valid_transactions(rest)
    units = units_of(msgs, n_pinned)
    boundaries = set()
    acc = 0
    for u in reversed(units):
        acc += len(u)
        boundaries.add(acc)
    assert len(rest) in boundaries | {0}
    if units:
        assert rest, "the newest unit fits, so it is kept"
    # maximal: adding the next older unit would exceed the budget
    older = [u for u in units if u[0] not in rest]
    if len(rest) < len(msgs) - n_pinned and older:
        assert COUNTER.count_messages(out) + sum(COUNTER.count_message(m) for m in older[-1]) > budget
    # determinism, byte for byte
    again = f.apply(list(msgs))
    assert json.dumps([m.model_dump() for m in again]) == json.dumps([m.model_dump() for m in out])


@given(msgs=conversations(), n=st.integers(1, 12))
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_max_messages_invariants(core, msgs, n):
    f = MaxMessagesFilter(max_messages=n)
    n_pinned = leading_pinned(msgs)
    units = units_of(msgs, n_pinned)
    try:
        out = f.apply(msgs)
    except ContextBudgetError:
        assert units and len(units[-1]) > n
        return
    assert out[:n_pinned] == msgs[:n_pinned]
    rest = out[n_pinned:]
    assert len(rest) <= n
    assert rest == msgs[len(msgs) - len(rest):] if rest else True
    assert_valid_transactions(rest)
    acc = 0
    for u in reversed(units):
        if acc + len(u) > n:
            break
        acc += len(u)
    assert len(rest) == acc, "not the longest run of whole units within max_messages"


@given(msgs=conversations(max_units=40), budget=st.integers(20, 300))
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 3))
def test_tail_walk_equals_a_decision_over_the_whole_history(core, msgs, budget):
    """The filter hands the core only a tail; the result equals one call over everything."""
    f = TokenBudgetFilter(max_tokens=budget)
    n_pinned = leading_pinned(msgs)
    counts = COUNTER.count_array(msgs)
    starts = split_units(msgs, n_pinned) + n_pinned
    lo, hi = core.select_window(counts, starts, n_pinned, budget - 3, True, 0)
    try:
        out = f.apply(msgs)
    except ContextBudgetError:
        assert lo == hi and len(msgs) > n_pinned or COUNTER.count_messages(msgs[:n_pinned]) > budget
        return
    assert out == msgs[:n_pinned] + msgs[lo:hi]


def test_long_history_tail_only(core):
    """A 5,000-message history: the filter counts only a tail, not the whole history."""
    calls = []

    class Spy(SimpleTokenCounter):
        def count_array(self, ms):
            calls.append(len(ms))
            return super().count_array(ms)

    msgs = [system("s")] + [human(f"message {i}") if i % 2 == 0 else ai(f"answer {i}") for i in range(5000)]
    out = TokenBudgetFilter(max_tokens=200, counter=Spy()).apply(msgs)
    assert out[-1] is msgs[-1]
    assert sum(calls) < 200, calls


@given(convs=st.lists(conversations(max_units=10), min_size=1, max_size=4), cuts=st.lists(st.integers(0, 40), min_size=1, max_size=6),
       budget=st.integers(30, 300), chunked=st.sampled_from(["exact", "chunked", "oldest"]), drop=st.integers(0, 3))
@settings(deadline=None, max_examples=max(50, MAX_EXAMPLES // 3))
def test_reused_filter_equals_a_fresh_one(core, convs, cuts, budget, chunked, drop):
    """The caches (the tail walk's, and the whole-history one of the chunked and keep-oldest
    paths) never change a result: replaying growing prefixes, switching conversations,
    shrinking, and prefixes that start on a tool message all match a fresh filter."""
    opts = {"eviction": "chunked", "chunk": 25} if chunked == "chunked" else (
        {"trim_from_start": False} if chunked == "oldest" else {})
    reused = TokenBudgetFilter(budget, **opts)
    n_opts = {"eviction": "chunked", "chunk": 2} if chunked == "chunked" else (
        {"trim_from_start": False} if chunked == "oldest" else {})
    reused_n = MaxMessagesFilter(5, **n_opts)
    for conv in convs:
        for cut in sorted(cuts) + cuts:
            msgs = conv[: min(cut, len(conv))]
            if cut % 2:  # drop a few leading messages: the pinned prefix shrinks or vanishes
                msgs = msgs[drop:]
            for f, fresh in ((reused, TokenBudgetFilter(budget, **opts)), (reused_n, MaxMessagesFilter(5, **n_opts))):
                try:
                    expected = fresh.apply(msgs)
                except ContextBudgetError as exc:
                    with pytest.raises(ContextBudgetError) as info:
                        f.apply(msgs)
                    assert str(info.value) == str(exc)
                    continue
                assert f.apply(msgs) == expected


def test_history_cache_is_not_pickled_and_reprs_show_options():
    import pickle

    f = TokenBudgetFilter(100, eviction="chunked", chunk=25)
    msgs = [system("s"), human("a"), ai("b")]
    f.apply(msgs)
    assert f._rec is not None and f._rec.n == 3
    g = pickle.loads(pickle.dumps(f))
    assert g._rec is None and g.chunk == 25
    assert g.apply(msgs) == f.apply(msgs)
    assert repr(f) == ("TokenBudgetFilter(max_tokens=100, counter=SimpleTokenCounter(chars_per_token=4), "
                       "pinned_roles=('system',), eviction='chunked', chunk=25)")
    assert repr(MaxMessagesFilter(3, trim_from_start=False)) == (
        "MaxMessagesFilter(max_messages=3, pinned_roles=('system',), trim_from_start=False)")


def test_tail_cache_keeps_unit_flags_of_the_messages_not_of_the_call(core):
    """A tool message right after the pinned prefix starts the walk's first unit in one call;
    the cache must not remember it as a unit start for a call where it follows a user turn."""
    orphan = tool("r" * 40, tool_call_id="c1")
    rest = [human("q" * 40), ai("a" * 40)]
    sys1, sys2, user = system("s"), system("t"), human("u" * 40)
    f = MaxMessagesFilter(3)
    assert f.apply([sys1, sys2, orphan, *rest]) == [sys1, sys2, orphan, *rest]
    # the same objects at the same positions, but now the tool message joins the user's unit
    msgs = [sys1, user, orphan, *rest]
    assert f.apply(msgs) == MaxMessagesFilter(3).apply(msgs) == [sys1, *rest]


def test_setting_another_counter_forgets_cached_counts(core):
    msgs = [system("s")] + [human("x" * 40) if i % 2 else ai("y" * 40) for i in range(30)]
    f = TokenBudgetFilter(200)
    first = f.apply(msgs)
    f.counter = SimpleTokenCounter(chars_per_token=2)  # twice the tokens per message
    assert f.apply(msgs) == TokenBudgetFilter(200, SimpleTokenCounter(chars_per_token=2)).apply(msgs)
    assert len(f.apply(msgs)) < len(first)
    with pytest.raises(TypeError, match="counter: expected a TokenCounterProtocol"):
        f.counter = object()


def test_changing_a_setting_between_calls_takes_effect_at_once(core):
    """pinned_roles, trim_from_start and chunk are read once per change (the planner's
    settings are precomputed), so a change after a call is honoured by the next call."""
    msgs = [system("s")] + [human("x" * 40) if i % 2 else ai("y" * 40) for i in range(30)]
    f = TokenBudgetFilter(200)
    f.apply(msgs)
    f.trim_from_start = False
    assert f.apply(msgs) == TokenBudgetFilter(200, trim_from_start=False).apply(msgs)
    f.trim_from_start = True
    f.pinned_roles = frozenset({"system", "user"})
    assert f.apply(msgs) == TokenBudgetFilter(200, pinned_roles=("system", "user")).apply(msgs)
    f.pinned_roles = frozenset({"system"})
    f.eviction, f.chunk = "chunked", 60
    assert f.apply(msgs) == TokenBudgetFilter(200, eviction="chunked", chunk=60).apply(msgs)
    g = MaxMessagesFilter(5)
    g.apply(msgs)
    g.pinned_roles = frozenset()
    assert g.apply(msgs) == MaxMessagesFilter(5, pinned_roles=()).apply(msgs)


def test_agent_loop_turns_take_the_compiled_turn_path(core, monkeypatch):
    """After the first call, a history grown in place is trimmed by one Records.window call
    per turn: the general path (records rebuilt, counts filled, errors) is not taken, and
    each message is counted once, when it arrives."""
    from jianmu_fast.memory.context import TiktokenTokenCounter
    from jianmu_fast.memory.context.filters import _WindowFilter

    counter = TiktokenTokenCounter("o200k_base")
    f = TokenBudgetFilter(300, counter)
    history = [system("s")] + [human(f"question {i} " * 5) if i % 2 else ai(f"answer {i} " * 9) for i in range(60)]
    want = f.apply(history)
    general = []
    real = _WindowFilter._trim_general
    monkeypatch.setattr(_WindowFilter, "_trim_general",
                        lambda self, *a: (general.append(len(a[0])) if self is f else None, real(self, *a))[1])
    counted = []
    real_counts = counter._counts
    f._turn_counts = lambda new: (counted.append(len(new)), real_counts(new))[1]
    assert f.apply(history) == want and not general and not counted  # the repeated call
    for i in range(20):
        history.extend([human(f"more {i}"), ai(f"reply {i} " * 3)])
        out = f.apply(history)
        assert out == TokenBudgetFilter(300, counter).apply(list(history))
    assert general == [] and counted == [2] * 20
