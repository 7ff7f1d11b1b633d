"""TokenBudgetFilter keeps its invariants with the exact counters, on both backends."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import HFTokenCounter, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context.filters import split_units
from jianmu_fast.message import ai, human, system, tool
from strategies import conversations

MAX_EXAMPLES = min(100, int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "100")))
COUNTERS = {
    "o200k": TiktokenTokenCounter("o200k_base", cache_size=256),
    "cl100k": TiktokenTokenCounter("cl100k_base"),
    "hf": HFTokenCounter(Path(__file__).parent / "data" / "all-MiniLM-L6-v2.tokenizer.json"),
}
_CALL = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "<|endoftext|>"}'}}]
_EDGE = [system("sys"), human("question"), ai(None, tool_calls=_CALL), tool("result 🙂", tool_call_id="c1"),
         ai("answer"), human("最后的问题")]


def _pinned(msgs):
    n = 0
    while n < len(msgs) and msgs[n].role == "system":
        n += 1
    return n


def _units(msgs, start):
    starts = split_units(msgs, start).tolist() + [len(msgs) - start]
    return [msgs[start + a:start + b] for a, b in zip(starts, starts[1:])]


@given(msgs=conversations(max_units=20), budget=st.integers(1, 600), which=st.sampled_from(sorted(COUNTERS)))
@example(msgs=_EDGE, budget=1, which="o200k")
@example(msgs=_EDGE, budget=10_000, which="cl100k")
@example(msgs=[], budget=5, which="hf")
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_budget_kept_with_exact_counters(core, msgs, budget, which):
    counter = COUNTERS[which]
    f = TokenBudgetFilter(max_tokens=budget, counter=counter)
    n_pinned = _pinned(msgs)
    units = _units(msgs, n_pinned)
    try:
        out = f.apply(msgs)
    except ContextBudgetError:
        newest = sum(counter.count_message(m) for m in units[-1]) if units else 0
        assert counter.count_messages(msgs[:n_pinned]) + newest > budget
        return
    assert counter.count_messages(out) <= budget
    assert out[:n_pinned] == msgs[:n_pinned]
    rest = out[n_pinned:]
    assert rest == (msgs[len(msgs) - len(rest):] if rest else [])
    kept_units = [u for u in units if u[0] in rest]
    assert sum(len(u) for u in kept_units) == len(rest), "a unit was split"
    older = [u for u in units if u[0] not in rest]
    if older:  # maximal: the next older unit would not have fitted
        assert counter.count_messages(out) + sum(counter.count_message(m) for m in older[-1]) > budget
