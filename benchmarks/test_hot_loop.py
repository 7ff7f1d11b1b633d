"""Hot loop: an agent's history grows turn by turn and the prompt is rebuilt after each turn.

A seeded tool-calling conversation is replayed unit by unit (a user turn, an answer, or an
assistant tool call with all its results). Each timed round appends ``TURNS`` units to a
history that already holds about 100 (or 600) messages and rebuilds the prompt after each,
with an 8,000-token budget and o200k_base; the time per round divided by ``TURNS`` is the
per-turn cost, tokenization of the new messages included (every round starts from fresh
caches that only saw the history before the round, as an agent process would).

Peers, same conversation, same run:

- ``jianmu_fast``: ``ContextBuilder([StateHistoryProvider(annotate=False)],
  [TokenBudgetFilter(8000, TiktokenTokenCounter("o200k_base"))]).build(state)`` (the
  sanitize step included), compiled core; ``jianmu_fast_py``: the pure-Python core;
- ``langchain_tiktoken``: ``trim_messages(strategy="last", include_system=True,
  start_on="human")`` with a tiktoken ``token_counter`` using our exact formula
  (``lc_peers.TiktokenCount``); ``langchain_memoized``: the same counter memoized per message
  object; ``langchain_approx``: LangChain's ``count_tokens_approximately``.

Before timing, the final prompt of each peer is checked: within the budget (by our counter),
no broken tool-call transaction, the system prompt kept; and jianmu_fast's equals the
exact filter's output and holds LangChain's (a longest unit-aligned suffix).
"""

from __future__ import annotations

import pytest
from conftest import conversation
from langchain_core.messages.utils import count_tokens_approximately
from lc_peers import MemoCount, TiktokenCount, lc_trim, originals, to_langchain
from traces import check_history

import jianmu_fast._backend as backend
import jianmu_fast._filter_core_py as core_py
from jianmu_fast.memory.context import ContextBuilder, StateHistoryProvider, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.message import Message

BUDGET = 8_000
TURNS = 10
IMPLS = ["jianmu_fast", "jianmu_fast_py", "langchain_tiktoken", "langchain_memoized", "langchain_approx"]
ROUNDS = {"langchain_tiktoken": 3}  # ~50 ms a turn at 600 messages


def _units(msgs: list[Message]) -> list[list[Message]]:
    out: list[list[Message]] = []
    for m in msgs:
        if m.role == "tool" and out:
            out[-1].append(m)
        else:
            out.append([m])
    return out


def _split(size: int) -> tuple[list[Message], list[list[Message]]]:
    """The history before the round (about ``size`` messages after it) and its TURNS units."""
    units = _units(conversation(2_000))
    n, k = 0, 0
    while n + sum(len(u) for u in units[k:k + TURNS]) < size:
        n += len(units[k])
        k += 1
    return [m for u in units[:k] for m in u], units[k:k + TURNS]


def make_round(impl: str, size: int, monkeypatch):
    """``(setup, target)`` for ``benchmark.pedantic``: setup makes fresh caches over the
    history before the round; target replays the round's turns."""
    before, turns = _split(size)
    if impl.startswith("jianmu_fast"):
        if impl == "jianmu_fast_py":
            monkeypatch.setattr(backend, "select_window", core_py.select_window)
            monkeypatch.setattr(backend, "select_windows", core_py.select_windows)

        def setup():
            counter = TiktokenTokenCounter("o200k_base")
            builder = ContextBuilder([StateHistoryProvider(annotate=False)], [TokenBudgetFilter(BUDGET, counter=counter)])
            state = {"messages": list(before)}
            builder.build(state)  # the agent has run before this round
            return (builder, state), {}

        def target(builder, state):
            history = state["messages"]
            for unit in turns:
                history.extend(unit)
                out = builder.build(state)
            return out

        return setup, target

    lc_before = to_langchain(before)
    lc_turns = [to_langchain(u) for u in turns]

    def setup():
        if impl == "langchain_approx":
            counter, budget = count_tokens_approximately, BUDGET
        else:
            counter, budget = (MemoCount() if impl == "langchain_memoized" else TiktokenCount()), BUDGET
        history = list(lc_before)
        lc_trim(history, budget, counter)
        return (history, counter, budget), {}

    def target(history, counter, budget):
        for unit in lc_turns:
            history.extend(unit)
            out = lc_trim(history, budget, counter)
        return out

    return setup, target


def check(impl: str, size: int, out_raw, report) -> dict:
    before, turns = _split(size)
    full = before + [m for u in turns for m in u]
    counter = TiktokenTokenCounter("o200k_base")
    out = list(out_raw) if impl.startswith("jianmu_fast") else originals(out_raw, {m.id: m for m in full})
    issues = []
    if not out or out[0].role != "system":
        issues.append("system prompt dropped")
    try:
        check_history(out)
    except AssertionError as exc:
        issues.append(f"broken tool-call transaction ({exc})")
    tokens = counter.count_messages(out)
    if tokens > BUDGET:
        issues.append(f"over the budget by our counter ({tokens} > {BUDGET})")
    exact = TokenBudgetFilter(BUDGET, counter=counter).apply(full)
    if impl.startswith("jianmu_fast"):
        assert not issues, issues
        assert [m.id for m in out] == [m.id for m in exact]
    elif impl != "langchain_approx":
        # the same formula: LangChain's counter agrees with ours on the kept prompt
        assert TiktokenCount()(to_langchain(out)) == tokens
        assert not issues, issues
        assert {m.id for m in out} <= {m.id for m in exact}
    report.append(f"hot-loop-{size:<4} {impl:<20} kept {len(out):>3} of {len(full):>4} messages, "
                  f"{tokens:>5} tokens{'' if not issues else ' INVALID: ' + '; '.join(issues)}")
    return {"kept": len(out), "tokens": tokens, "valid": not issues, "problems": issues, "turns": TURNS,
            "history": len(full)}


def run(benchmark, report, impl, size, monkeypatch):
    setup, target = make_round(impl, size, monkeypatch)
    args, _ = setup()
    benchmark.extra_info.update(check(impl, size, target(*args), report))
    benchmark.extra_info["per"] = "round of TURNS turns"
    benchmark.pedantic(target, setup=setup, rounds=ROUNDS.get(impl, 15), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="hot-loop-600-msgs-8k-budget")
@pytest.mark.parametrize("impl", IMPLS)
def test_hot_loop_600(benchmark, report, impl, monkeypatch):
    run(benchmark, report, impl, 600, monkeypatch)


@pytest.mark.benchmark(group="hot-loop-100-msgs-8k-budget")
@pytest.mark.parametrize("impl", IMPLS)
def test_hot_loop_100(benchmark, report, impl, monkeypatch):
    run(benchmark, report, impl, 100, monkeypatch)
