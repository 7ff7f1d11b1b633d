"""Issue 2 item 10: trimming speed, jianmu_fast (compiled and pure-Python core) against
LangChain ``trim_messages``, on seeded tool-calling conversations of 50, 2,000 and 20,000
messages, with the same token counter in the same run.

Peers per group:

- ``jianmu_fast``: ``TokenBudgetFilter.apply`` / ``MaxMessagesFilter.apply``, compiled core;
- ``jianmu_fast_py``: the same with ``jianmu_fast._backend.select_window`` swapped for the
  pure-Python twin;
- ``jianmu_fast_chunked`` (token groups): ``eviction="chunked", chunk=budget // 4``;
- ``langchain``: ``trim_messages(strategy="last", include_system=True, allow_partial=False)``;
- ``langchain_start_on_human``: the same with ``start_on="human"``, LangChain's documented
  way to avoid starting the window on a tool result.

The token counter is ``SimpleTokenCounter()`` for all: LangChain gets a per-message
``token_counter`` that calls our ``count_message`` on the Message each LangChain message was
converted from (converted once, outside the timed region), and ``max_tokens`` less our
3-token request overhead, so both keep to the same budget. Before timing, every output is
checked (system prompt kept, no orphan tool result or unanswered call, within the budget);
an invalid LangChain output is not hidden: it is reported at the end of the run and in the
benchmark's ``extra_info``, and only then timed.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage, convert_to_messages, trim_messages
from traces import check_history

import jianmu_fast._backend as backend
import jianmu_fast._filter_core_py as core_py
from jianmu_fast.memory.context import MaxMessagesFilter, SimpleTokenCounter, TokenBudgetFilter
from jianmu_fast.message import Message

COUNTER = SimpleTokenCounter()
OVERHEAD = COUNTER.count_messages([])  # per request, added by count_messages
IMPLS = ["jianmu_fast", "jianmu_fast_py", "langchain", "langchain_start_on_human"]


class LangChainSide:
    """A conversation converted once to LangChain messages, with a counter that calls our
    ``count_message`` on the original Message (so both sides count the same tokens)."""

    def __init__(self, msgs: list[Message]) -> None:
        self.msgs = msgs
        # LangChain copies messages inside trim_messages; its ``id`` field survives the copies
        self.lc = convert_to_messages([{**m.to_openai(), "id": m.id} for m in msgs])
        by_id = {m.id: m for m in msgs}
        self.by_id = by_id
        count = COUNTER.count_message

        def token_counter(message: BaseMessage) -> int:  # per-message form (annotation matters)
            return count(by_id[message.id])

        # LangChain picks the per-message form from the real class in the annotation, which
        # ``from __future__ import annotations`` would leave a string
        token_counter.__annotations__["message"] = BaseMessage
        self.token_counter = token_counter

    def originals(self, out: list[BaseMessage]) -> list[Message]:
        return [self.by_id[m.id] for m in out]


_SIDES: dict[int, LangChainSide] = {}


def side(msgs: list[Message]) -> LangChainSide:
    if id(msgs) not in _SIDES:
        _SIDES[id(msgs)] = LangChainSide(msgs)
    return _SIDES[id(msgs)]


def problems(out: list[Message], within) -> list[str]:
    """What is wrong with a trimmed prompt (empty when valid)."""
    found = []
    if not out or out[0].role != "system":
        found.append("system prompt dropped")
    try:
        check_history(out)
    except AssertionError as exc:
        found.append(f"broken tool-call transaction ({exc})")
    if not within(out):
        found.append("over the limit")
    return found


def make_call(impl: str, msgs: list[Message], kind: str, limit: int, monkeypatch):
    """The function to time, with the filter/converted input prepared outside it."""
    if impl == "jianmu_fast_py":
        monkeypatch.setattr(backend, "select_window", core_py.select_window)
        monkeypatch.setattr(backend, "select_windows", core_py.select_windows)
    if impl.startswith("jianmu_fast"):
        if kind == "tokens":
            kw = {"eviction": "chunked", "chunk": limit // 4} if impl == "jianmu_fast_chunked" else {}
            flt = TokenBudgetFilter(limit, COUNTER, **kw)
        else:
            flt = MaxMessagesFilter(limit)
        return lambda: flt.apply(msgs), (lambda out: out)
    lcs = side(msgs)
    extra = {"start_on": "human"} if impl == "langchain_start_on_human" else {}
    if kind == "tokens":
        counter, max_tokens = lcs.token_counter, limit - OVERHEAD
    else:
        counter, max_tokens = len, limit + 1  # the system message counts for LangChain
    call = lambda: trim_messages(lcs.lc, max_tokens=max_tokens, token_counter=counter,  # noqa: E731
                                 strategy="last", include_system=True, allow_partial=False, **extra)
    return call, lcs.originals


def run(benchmark, report, impl, msgs, kind, limit, monkeypatch, scenario):
    call, to_ours = make_call(impl, msgs, kind, limit, monkeypatch)
    out = to_ours(call())
    if kind == "tokens":
        within = lambda o: COUNTER.count_messages(o) <= limit  # noqa: E731
    else:
        within = lambda o: sum(m.role != "system" for m in o) <= limit  # noqa: E731
    issues = problems(out, within)
    exact = (TokenBudgetFilter(limit, COUNTER) if kind == "tokens" else MaxMessagesFilter(limit)).apply(msgs)
    benchmark.extra_info.update(kept=len(out), valid=not issues, problems=issues,
                                same_as_exact=[m.id for m in out] == [m.id for m in exact])
    note = "valid" if not issues else "INVALID: " + "; ".join(issues)
    report.append(f"{scenario:<30} {impl:<26} kept {len(out):>4} of {len(msgs):>5} "
                  f"(exact keeps {len(exact):>4}) {note}")
    if impl.startswith("jianmu_fast"):
        assert not issues, issues
        if impl != "jianmu_fast_chunked":
            assert [m.id for m in out] == [m.id for m in exact]
    benchmark(call)


# -- token budget -------------------------------------------------------------------------------

TOKEN_IMPLS = ["jianmu_fast", "jianmu_fast_py", "jianmu_fast_chunked", "langchain", "langchain_start_on_human"]


@pytest.mark.benchmark(group="trim-50-msgs-2k-budget")
@pytest.mark.parametrize("impl", TOKEN_IMPLS)
def test_trim_50(benchmark, report, impl, conversation_50, monkeypatch):
    run(benchmark, report, impl, conversation_50, "tokens", 2_000, monkeypatch, "trim-50-msgs-2k-budget")


@pytest.mark.benchmark(group="trim-2k-msgs-8k-budget")
@pytest.mark.parametrize("impl", TOKEN_IMPLS)
def test_trim_2k(benchmark, report, impl, conversation_2k, monkeypatch):
    run(benchmark, report, impl, conversation_2k, "tokens", 8_000, monkeypatch, "trim-2k-msgs-8k-budget")


@pytest.mark.benchmark(group="trim-20k-msgs-8k-budget")
@pytest.mark.parametrize("impl", TOKEN_IMPLS)
def test_trim_20k(benchmark, report, impl, conversation_20k, monkeypatch):
    run(benchmark, report, impl, conversation_20k, "tokens", 8_000, monkeypatch, "trim-20k-msgs-8k-budget")


# -- message count ------------------------------------------------------------------------------


@pytest.mark.benchmark(group="max-messages-50-msgs-keep-20")
@pytest.mark.parametrize("impl", IMPLS)
def test_max_messages_50(benchmark, report, impl, conversation_50, monkeypatch):
    run(benchmark, report, impl, conversation_50, "messages", 20, monkeypatch, "max-messages-50-msgs-keep-20")


@pytest.mark.benchmark(group="max-messages-2k-msgs-keep-100")
@pytest.mark.parametrize("impl", IMPLS)
def test_max_messages_2k(benchmark, report, impl, conversation_2k, monkeypatch):
    run(benchmark, report, impl, conversation_2k, "messages", 100, monkeypatch, "max-messages-2k-msgs-keep-100")


@pytest.mark.benchmark(group="max-messages-20k-msgs-keep-100")
@pytest.mark.parametrize("impl", IMPLS)
def test_max_messages_20k(benchmark, report, impl, conversation_20k, monkeypatch):
    run(benchmark, report, impl, conversation_20k, "messages", 100, monkeypatch, "max-messages-20k-msgs-keep-100")
