"""Chunked eviction (issue 7): the invariants, the budget and the stability of the cut.

Notation, for a history ``H`` with ``P`` pinned messages and a filter with a limit:

- ``avail``: what the non-pinned messages may cost (``max_tokens`` minus the request's fixed
  cost minus the pinned prefix; ``max_messages`` for ``MaxMessagesFilter``);
- ``excess(H) = cost(H[P:]) - avail`` and ``step(H) = ceil(excess / chunk)`` (0 when
  everything fits);
- ``cut(H)``: the index of the first kept non-pinned message (``len(H)`` when none).

The specification (``jianmu_fast/_filter_core_py.py``): ``cut(H)`` is the first unit
boundary ``b`` with ``cost(H[P:b]) >= step(H) * chunk``, except that it never passes the
start of the newest unit, and never lies before the exact cut. Hence, when the history
grows by whole units ``H -> H'``:

- **monotone**: ``cut(H') >= cut(H)``: the cut never moves back;
- **stable**: if ``step(H') == step(H)`` and the cut of ``H`` was not held back at the
  newest unit (``cost(H[P:cut(H)]) >= step(H) * chunk``), then ``cut(H') == cut(H)``: the
  prompt for ``H'`` starts with the whole prompt for ``H``;
- **moves only on a new step**: ``cut(H') != cut(H)`` implies ``step(H') > step(H)`` or
  the held-back case above; unless ``H`` or ``H'`` is held back, the move then drops
  ``cost(H'[P:cut(H')]) >= (step(H) + 1) * chunk``, at least one chunk past the last target.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import MaxMessagesFilter, SimpleTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context.filters import split_units
from jianmu_fast.message import ai, human, system, tool
from invariants import assert_valid_transactions, leading_pinned
from strategies import conversations

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
REPLAY_EXAMPLES = max(1, MAX_EXAMPLES // 3)  # each replay example runs the filters ~30 times
COUNTER = SimpleTokenCounter()


def unit_boundaries(msgs, n_pinned):
    """Indices (into msgs) where units start after the pinned prefix, plus len(msgs)."""
    return [n_pinned + s for s in split_units(msgs, n_pinned).tolist()] + [len(msgs)]


class Setup:
    """One filter under test with its own cost model, so the test states the spec itself."""

    def __init__(self, kind, limit, chunk):
        self.kind, self.limit, self.chunk = kind, limit, chunk
        if kind == "tokens":
            self.chunked = TokenBudgetFilter(limit, COUNTER, eviction="chunked", chunk=chunk)
            self.exact = TokenBudgetFilter(limit, COUNTER)
        else:
            self.chunked = MaxMessagesFilter(limit, eviction="chunked", chunk=chunk)
            self.exact = MaxMessagesFilter(limit)

    def __repr__(self):
        return f"Setup({self.kind!r}, limit={self.limit}, chunk={self.chunk})"

    def cost(self, msgs):
        return sum(COUNTER.count_message(m) for m in msgs) if self.kind == "tokens" else len(msgs)

    def avail(self, msgs, n_pinned):
        if self.kind == "tokens":
            return self.limit - COUNTER.count_messages([]) - self.cost(msgs[:n_pinned])
        return self.limit

    def step(self, msgs, n_pinned):
        excess = self.cost(msgs[n_pinned:]) - self.avail(msgs, n_pinned)
        return max(0, -(-excess // self.chunk))

    def within_limit(self, out):
        if self.kind == "tokens":
            return COUNTER.count_messages(out) <= self.limit
        return len(out) - leading_pinned(out) <= self.limit

    def cut(self, msgs):
        """(cut index, output) or (None, error text) when the filter raises."""
        try:
            out = self.chunked.apply(msgs)
        except ContextBudgetError as exc:
            return None, str(exc)
        n_pinned = leading_pinned(msgs)
        return len(msgs) - (len(out) - n_pinned), out


setups = st.one_of(
    st.builds(Setup, st.just("tokens"), st.integers(1, 400), st.integers(1, 80)),
    st.builds(Setup, st.just("messages"), st.integers(1, 20), st.integers(1, 8)),
)


# -- worked examples -------------------------------------------------------------------------


def numbered(n):
    return [system("s")] + [human(f"m{i:02d}") for i in range(n)]  # 5 tokens each, system too


@pytest.mark.parametrize(("n", "exact", "chunked"), [
    (5, list(range(5)), list(range(5))),            # fits: nothing dropped
    (6, list(range(1, 6)), list(range(2, 6))),      # excess 5 tokens -> drop 10 (2 messages)
    (7, list(range(2, 7)), list(range(2, 7))),      # excess 10 -> still drop 10: cut unchanged
    (8, list(range(3, 8)), list(range(4, 8))),      # excess 15 -> drop 20 (4 messages)
    (9, list(range(4, 9)), list(range(4, 9))),
])
def test_token_budget_worked_example(core, n, exact, chunked):
    msgs = numbered(n)
    budget = 3 + 5 + 25  # request + system + five 5-token messages
    keep = lambda f: [m.content for m in f.apply(msgs)][1:]  # noqa: E731
    assert keep(TokenBudgetFilter(budget)) == [f"m{i:02d}" for i in exact]
    assert keep(TokenBudgetFilter(budget, eviction="chunked", chunk=10)) == [f"m{i:02d}" for i in chunked]


def test_max_messages_worked_example(core):
    f = MaxMessagesFilter(4, eviction="chunked", chunk=3)
    kept = [[m.content for m in f.apply(numbered(n))][1:] for n in range(4, 10)]
    assert kept == [
        ["m00", "m01", "m02", "m03"],
        ["m03", "m04"],                    # 1 too many -> drop 3
        ["m03", "m04", "m05"],             # 2 too many -> still 3
        ["m03", "m04", "m05", "m06"],      # 3 too many -> still 3
        ["m06", "m07"],                    # 4 too many -> drop 6
        ["m06", "m07", "m08"],
    ]


def test_chunked_keeps_the_newest_unit_even_when_the_step_reaches_into_it(core):
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msgs = [system("s"), human("q"), ai(None, tool_calls=calls), tool("r" * 40, tool_call_id="c1")]
    # unit costs: q 5, call 4+3+1+1+1 = 10, result 4+10+1 = 15; 27 left for history
    f = TokenBudgetFilter(3 + 5 + 27, eviction="chunked", chunk=100)
    assert [m.role for m in f.apply(msgs)] == ["system", "assistant", "tool"]


CALLS3 = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(3)]


@pytest.mark.parametrize(("exact", "chunked", "msgs", "text"), [
    (TokenBudgetFilter(40), TokenBudgetFilter(40, eviction="chunked", chunk=10),
     [system("s"), human("q"), ai("x" * 200)],
     "the newest unit, messages[2:3] (assistant), needs 54 tokens"),
    (MaxMessagesFilter(3), MaxMessagesFilter(3, eviction="chunked", chunk=2),
     [system("s"), human("q"), ai(None, tool_calls=CALLS3)] + [tool("r", tool_call_id=f"c{i}") for i in range(3)],
     "the newest unit, messages[2:6] (assistant, tool, tool, tool), needs 4 messages"),
], ids=["tokens", "messages"])
def test_newest_unit_too_large_raises_like_exact(core, exact, chunked, msgs, text):
    with pytest.raises(ContextBudgetError) as a:
        exact.apply(msgs)
    with pytest.raises(ContextBudgetError) as b:
        chunked.apply(msgs)
    assert str(a.value) == str(b.value)
    assert text in str(b.value)


# -- properties --------------------------------------------------------------------------------


@given(msgs=conversations(), setup=setups)
@example(msgs=[], setup=Setup("tokens", 1, 1))
@example(msgs=numbered(3), setup=Setup("messages", 1, 1))
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_chunked_invariants(core, msgs, setup):
    before = [m.model_dump() for m in msgs]
    try:
        expected = setup.exact.apply(msgs)
    except ContextBudgetError as exc:
        with pytest.raises(ContextBudgetError) as info:
            setup.chunked.apply(msgs)
        assert str(info.value) == str(exc)  # same error as exact, same text
        return
    out = setup.chunked.apply(msgs)
    assert [m.model_dump() for m in msgs] == before  # input untouched
    n_pinned = leading_pinned(msgs)
    # pinned prefix whole, and the rest is a contiguous newest run...
    assert out[:n_pinned] == msgs[:n_pinned]
    rest = out[n_pinned:]
    assert rest == msgs[len(msgs) - len(rest):]
    # ...that is a suffix of what exact eviction keeps (cut at or after the exact cut)
    assert len(rest) <= len(expected) - n_pinned
    # transactions whole, budget kept, newest unit kept whenever exact keeps it
    assert_valid_transactions(out)
    assert setup.within_limit(out)
    if len(expected) > n_pinned:
        assert rest, "chunked dropped the newest unit that exact keeps"
    # the cut is a unit boundary at the spec's place
    cut = len(msgs) - len(rest)
    bounds = unit_boundaries(msgs, n_pinned)
    assert cut in bounds
    target = setup.step(msgs, n_pinned) * setup.chunk
    first = next((b for b in bounds if setup.cost(msgs[n_pinned:b]) >= target), len(msgs))
    exact_cut = len(msgs) - (len(expected) - n_pinned)
    assert cut == max(exact_cut, min(first, bounds[-2] if len(bounds) > 1 else len(msgs)))
    # determinism
    assert setup.chunked.apply(msgs) == out
    assert [m.to_openai() for m in setup.chunked.apply(list(msgs))] == [m.to_openai() for m in out]


@given(msgs=conversations(max_units=20), setup=setups)
@settings(deadline=None, max_examples=REPLAY_EXAMPLES)
def test_cut_is_monotone_and_stable_while_the_history_grows(core, msgs, setup):
    n_pinned = leading_pinned(msgs)
    bounds = unit_boundaries(msgs, n_pinned)[1:]  # every prefix that ends on a whole unit
    prev = None
    for b in bounds:
        h = msgs[:b]
        cut, out = setup.cut(h)
        if cut is None:
            prev = None  # the newest unit does not fit: no prompt this turn
            continue
        step = setup.step(h, n_pinned)
        held = setup.cost(h[n_pinned:cut]) < step * setup.chunk
        if prev is not None:
            p_cut, p_step, p_out, p_held = prev
            assert cut >= p_cut, f"the cut moved back from {p_cut} to {cut}"
            assert step >= p_step
            if step == p_step and not p_held:
                assert cut == p_cut, f"cut moved {p_cut} -> {cut} within step {step}"
                assert out[:len(p_out)] == p_out  # the previous prompt is a prefix of this one
            if cut != p_cut:
                assert step > p_step or p_held
                if not (held or p_held):  # a move drops a chunk more than the last target
                    assert setup.cost(h[n_pinned:cut]) >= (p_step + 1) * setup.chunk
        prev = (cut, step, out, held)


@given(lists=st.lists(conversations(max_units=10), min_size=1, max_size=6), setup=setups)
@settings(deadline=None, max_examples=REPLAY_EXAMPLES)
def test_batch_and_hot_loop_give_the_same_prompts(core, lists, setup):
    from jianmu_fast.batch import transform_batch
    from jianmu_fast.memory.context import ContextBuilder

    builder = ContextBuilder(filters=[setup.chunked])
    one_by_one = []
    for msgs in lists:
        try:
            one_by_one.append(builder.transform(msgs))
        except ContextBudgetError:
            one_by_one.append([])
    batched = transform_batch(builder, lists, on_error="skip")
    assert [[m.to_openai() for m in p] for p in batched] == [[m.to_openai() for m in p] for p in one_by_one]


def test_bad_chunk_arguments():
    with pytest.raises(ValueError, match="needs chunk= a positive int of at most 2\\*\\*53 \\(messages\\), got 0"):
        MaxMessagesFilter(5, eviction="chunked", chunk=0)
    with pytest.raises(ValueError, match="needs chunk= a positive int of at most 2\\*\\*53 \\(tokens\\), got True"):
        TokenBudgetFilter(5, eviction="chunked", chunk=True)
    with pytest.raises(ValueError, match="chunk only applies to eviction='chunked'"):
        TokenBudgetFilter(5, chunk=2)
