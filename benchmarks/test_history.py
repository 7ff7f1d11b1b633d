"""Per-turn cost of StateHistoryProvider + sanitize_tool_call_history in an agent's hot loop.

A turn: the history (100 or 1,000 messages of the seeded trace, every tool result carrying
``metadata["tool_result"]``) grew by one unit of new Message objects since the previous
turn; the provider annotates the history and the sanitizer checks it. The caches are warm
from the previous turn, as in a running agent. Each group shows the ratio of the 1,000- to
the 100-message turn; ``fresh`` builds a new provider every turn (no cache) for scale.

Run: ``.venv/bin/python -m pytest benchmarks/test_history.py --benchmark-disable-gc``.
"""

from __future__ import annotations

import json

import pytest
from conftest import conversation

from jianmu_fast.memory.context import StateHistoryProvider
from jianmu_fast.message import Message, sanitize_tool_call_history

SIZES = [100, 1_000]


def _with_results(ms: list[Message]) -> list[Message]:
    out = []
    for m in ms:
        if m.role == "tool":
            try:
                result = json.loads(m.text())
            except ValueError:
                result = m.text()
            m = m.model_copy(update={"metadata": {"tool_result": result}})
        out.append(m)
    return out


_HIST: dict[int, list[Message]] = {}


def history(n: int) -> list[Message]:
    if n not in _HIST:
        _HIST[n] = _with_results(conversation(n))[1:]  # the system prompt comes from another provider
    return _HIST[n]


def _last_unit(ms: list[Message]) -> list[Message]:
    i = len(ms) - 1
    while i > 0 and ms[i].role == "tool":
        i -= 1
    return ms[i:]


def _turns(n: int, provider: StateHistoryProvider):
    """``setup`` for benchmark.pedantic: the provider has seen the ``n``-message history, then
    the same new unit (one tool round of the 100-message trace, as new Message objects, so
    every size does the same new work) is appended."""
    base = history(n)
    unit = _last_unit(history(100))

    def setup():
        provider.get_messages({"messages": base})
        return ({"messages": base + [m.model_copy() for m in unit]},), {}

    return setup


def _check(n: int) -> None:
    p = StateHistoryProvider()
    setup = _turns(n, p)
    (state,), _ = setup()
    got = sanitize_tool_call_history(p.get_messages(state))
    want = StateHistoryProvider().get_messages(state)
    assert [m.model_dump_json() for m in got] == [m.model_dump_json() for m in want]


@pytest.mark.benchmark(group="history-turn: provider + sanitize")
@pytest.mark.parametrize("impl", ["cached", "fresh"])
@pytest.mark.parametrize("n", SIZES)
def test_turn_provider_and_sanitize(benchmark, n, impl):
    _check(n)
    p = StateHistoryProvider()
    setup = _turns(n, p)

    def turn(state):
        provider = p if impl == "cached" else StateHistoryProvider()
        return sanitize_tool_call_history(provider.get_messages(state))

    benchmark.pedantic(turn, setup=setup, rounds=200 if impl == "cached" else 20, iterations=1)


@pytest.mark.benchmark(group="history-turn: provider only")
@pytest.mark.parametrize("n", SIZES)
def test_turn_provider(benchmark, n):
    p = StateHistoryProvider()
    benchmark.pedantic(p.get_messages, setup=_turns(n, p), rounds=200, iterations=1)


@pytest.mark.benchmark(group="history-turn: sanitize only")
@pytest.mark.parametrize("n", SIZES)
def test_turn_sanitize(benchmark, n):
    msgs = StateHistoryProvider().get_messages({"messages": history(n)})
    assert all(a is b for a, b in zip(sanitize_tool_call_history(msgs), msgs))  # the fast path
    benchmark(sanitize_tool_call_history, msgs)
