"""Issue 16: the two-line switch from the tool a user had, measured on a realistic history.

One seeded tool-calling conversation (``traces.make_conversation``, 400 messages: system
prompt, user turns, tool rounds with 1-3 parallel calls, results up to 4,000 characters) is
replayed as an agent runs it: one trim per model call (after each user message and after
each complete run of tool results, ``prefix_cache.turn_ends``), 8,000-token budget, o200k_base.
Each benchmark times the whole replay and records, in ``extra_info`` and the end-of-run
figures, how many of its prompts were invalid requests (a tool result whose call was cut off,
or a call without its results).

Peers:

- LangChain: ``langchain_core.messages.trim_messages(strategy="last", include_system=True)``
  with a tiktoken ``token_counter`` (``lc_peers.TiktokenCount``, the same formula as ours) and
  with ``token_counter="approximate"``; against ``jianmu_fast.integrations.langchain.trim_messages``
  with ``token_counter="o200k_base"`` (same call, same arguments);
- Agents SDK: a ``call_model_input_filter`` keeping the last N input items (the filter the
  SDK's docs suggest for staying within a limit), N the mean item count that our filter keeps;
  against ``call_model_input_filter(ContextBuilder(filters=[TokenBudgetFilter(...)]))``;
- Anthropic: keeping the last N turns of ``messages``; against ``build_anthropic`` with
  ``TokenBudgetFilter(8000, ApproxClaudeTokenCounter())`` and one ``AnthropicConverter``.

The Agents SDK and Anthropic peers are list slices, which cost next to nothing: there the
gain is validity, and the timing says what the valid prompt costs per model call.

Run: ``.venv/bin/python -m pytest benchmarks/test_integrations.py --benchmark-disable-gc``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import conversation
from langchain_core.messages import trim_messages as lc_trim
from lc_peers import TiktokenCount, to_langchain

from jianmu_fast.integrations.anthropic import (AnthropicConverter, ApproxClaudeTokenCounter, build_anthropic,
                                               to_anthropic)
from jianmu_fast.integrations.langchain import trim_messages
from jianmu_fast.integrations.openai_agents import call_model_input_filter
from jianmu_fast.integrations.openai_responses import to_responses
from jianmu_fast.memory.context import ContextBuilder, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.prefix_cache import turn_ends

N_MESSAGES = 400
BUDGET = 8000
ENCODING = "o200k_base"


@pytest.fixture(scope="module")
def history():
    msgs = conversation(N_MESSAGES)
    return msgs, turn_ends(msgs)


def lc_invalid(out) -> bool:
    """An invalid request: a ToolMessage not answering the AIMessage before its run, or a call unanswered."""
    pending: set = set()
    for m in out:
        if m.type == "tool":
            if m.tool_call_id not in pending:
                return True
            pending.discard(m.tool_call_id)
            continue
        if pending:
            return True
        pending = {c["id"] for c in getattr(m, "tool_calls", None) or ()}
    return bool(pending)


def items_invalid(items) -> bool:
    """Responses items: a function_call_output whose function_call is not in the input, or a call without output."""
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    return calls != outs


def anthropic_invalid(req) -> bool:
    turns = req["messages"]
    for k, t in enumerate(turns):
        blocks = t["content"] if isinstance(t["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
        prev = turns[k - 1]["content"] if k and isinstance(turns[k - 1]["content"], list) else []
        nxt = turns[k + 1]["content"] if k + 1 < len(turns) and isinstance(turns[k + 1]["content"], list) else []
        if results and not results <= {b["id"] for b in prev if b["type"] == "tool_use"}:
            return True
        if uses and uses != {b["tool_use_id"] for b in nxt if b["type"] == "tool_result"}:
            return True
    return False


def record(benchmark, report, name: str, outs: list, invalid) -> int:
    bad = sum(1 for o in outs if invalid(o))
    benchmark.extra_info.update({"model_calls": len(outs), "invalid_requests": bad})
    report.append(f"integrations {name}: {bad} invalid requests of {len(outs)} model calls")
    return bad


# -- LangChain -------------------------------------------------------------------------------------

LC_IMPLS = ["jianmu_fast", "langchain_tiktoken", "langchain_approximate"]


@pytest.mark.benchmark(group="integrations-langchain-trim-replay")
@pytest.mark.parametrize("impl", LC_IMPLS)
def test_langchain_trim_replay(benchmark, report, history, impl):
    msgs, ends = history
    lc = to_langchain(msgs)  # converted once, outside the timed region, as a LangGraph state holds them
    prefixes = [lc[:e] for e in ends]
    if impl == "jianmu_fast":
        def replay():
            return [trim_messages(p, max_tokens=BUDGET, token_counter=ENCODING, include_system=True)
                    for p in prefixes]
    else:
        counter = TiktokenCount(ENCODING) if impl == "langchain_tiktoken" else "approximate"

        def replay():
            return [lc_trim(p, max_tokens=BUDGET, token_counter=counter, strategy="last", include_system=True)
                    for p in prefixes]

    outs = replay()  # checked before timing
    bad = record(benchmark, report, f"LangChain replay, {impl}", outs, lc_invalid)
    if impl == "jianmu_fast":
        assert bad == 0
        c = TiktokenTokenCounter(ENCODING)
        from jianmu_fast.integrations.langchain import from_langchain

        assert all(c.count_messages(from_langchain(o)) <= BUDGET for o in outs)
    benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=0)


# -- OpenAI Agents SDK -------------------------------------------------------------------------------


def _agent_inputs(msgs, ends):
    items = to_responses(msgs[1:])  # the system prompt travels as the agent's instructions
    # item count of each prefix: Messages map to items in order (one assistant message with its calls)
    per = [len(to_responses([m])) for m in msgs[1:]]
    offsets = [0]
    for n in per:
        offsets.append(offsets[-1] + n)
    return [items[:offsets[e - 1]] for e in ends]


@pytest.mark.benchmark(group="integrations-agents-filter-replay")
@pytest.mark.parametrize("impl", ["jianmu_fast", "last_n_items"])
def test_agents_filter_replay(benchmark, report, history, impl):
    msgs, ends = history
    inputs = _agent_inputs(msgs, ends)
    def make():
        return call_model_input_filter(ContextBuilder(filters=[TokenBudgetFilter(BUDGET, TiktokenTokenCounter(ENCODING))]))

    ours = make()
    datas = [SimpleNamespace(model_data=SimpleNamespace(input=i, instructions="You research."), context=None)
             for i in inputs]
    kept = [len(ours(d).input) for d in datas]
    n_last = max(1, sum(kept) // len(kept))

    if impl == "jianmu_fast":
        def replay():
            f = make()  # one filter per run, as one RunConfig holds it
            return [f(d).input for d in datas]
    else:
        def replay():
            return [d.model_data.input[-n_last:] for d in datas]

    outs = replay()
    bad = record(benchmark, report, f"Agents SDK replay, {impl} (N={n_last})", outs, items_invalid)
    if impl == "jianmu_fast":
        assert bad == 0
    benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=0)


# -- Anthropic ---------------------------------------------------------------------------------------


@pytest.mark.benchmark(group="integrations-anthropic-replay")
@pytest.mark.parametrize("impl", ["jianmu_fast", "last_n_turns"])
def test_anthropic_replay(benchmark, report, history, impl):
    msgs, ends = history
    reqs = [to_anthropic(msgs[:e]) for e in ends]
    builder = ContextBuilder(filters=[TokenBudgetFilter(BUDGET, ApproxClaudeTokenCounter())])
    kept = [len(build_anthropic(builder, r["messages"], r.get("system"))["messages"]) for r in reqs]
    n_last = max(1, sum(kept) // len(kept))

    if impl == "jianmu_fast":
        def replay():
            conv = AnthropicConverter()  # one per conversation, as an agent loop holds it
            return [build_anthropic(builder, r["messages"], r.get("system"), conv) for r in reqs]
    else:
        def replay():
            return [{"system": r.get("system"), "messages": r["messages"][-n_last:]} for r in reqs]

    outs = replay()
    bad = record(benchmark, report, f"Anthropic replay, {impl} (N={n_last})", outs, anthropic_invalid)
    if impl == "jianmu_fast":
        assert bad == 0
    benchmark.pedantic(replay, rounds=3, iterations=1, warmup_rounds=0)
