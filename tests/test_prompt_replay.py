"""Byte-stable prompt prefix (issue 7): replay a conversation turn by turn through a
``ContextBuilder`` and compare the serialized prompts.

A turn is one model call: after each user message and after each complete tool round.
With ``eviction="chunked"`` the prompt of turn t+1 starts, byte for byte, with the whole
prompt of turn t, except at the few turns where the cut moved; the pinned system messages
before the history are byte-identical on every turn.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider, TokenBudgetFilter
from jianmu_fast.memory.context import MaxMessagesFilter, SimpleTokenCounter, StateHistoryProvider
from jianmu_fast.message import Message, ai, human, tool
from jianmu_fast.prefix_cache import prefix_cache_stats, turn_ends

COUNTER = SimpleTokenCounter()
SYSTEM = "You are a careful assistant. Use the tools when they help. 请用用户的语言回答。"


class HistoryProvider:
    """Returns ``local_state["messages"]`` as stored: the history without annotations."""

    def get_messages(self, local_state: Any, global_state: Any = None, ctx: Any = None) -> list[Message]:
        return list(local_state["messages"])


def conversation(n_episodes: int, seed: int) -> list[Message]:
    """Seeded tool-calling history: user, 0-3 tool rounds of 1-3 (parallel) calls, answer."""
    rng = random.Random(seed)
    msgs: list[Message] = []
    call_no = 0
    text = lambda lo, hi: " ".join(rng.choice(["alpha", "beta", "缓存", "token", "🙂", "{\"k\": 1}"])  # noqa: E731
                                   for _ in range(rng.randint(lo, hi)))
    for _ in range(n_episodes):
        msgs.append(human(text(2, 30)))
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            calls = []
            for _ in range(rng.choice([1, 1, 2, 3])):
                call_no += 1
                calls.append({"id": f"call_{call_no}", "type": "function",
                              "function": {"name": rng.choice(["search", "read_file", "sql"]),
                                           "arguments": json.dumps({"q": text(1, 6)}, ensure_ascii=False)}})
            msgs.append(ai(None, tool_calls=calls))
            msgs.extend(tool(text(5, 120), tool_call_id=c["id"]) for c in calls)
        msgs.append(ai(text(3, 60)))
    return msgs


def replay(flt, msgs, provider=None):
    provider = provider if provider is not None else StateHistoryProvider()
    builder = ContextBuilder(providers=[StaticPromptProvider(SYSTEM), provider], filters=[flt])
    return [builder.build({"messages": msgs[:end]}) for end in turn_ends(msgs)]


def wire(prompt):
    return [json.dumps(m.to_openai(), sort_keys=True, ensure_ascii=False) for m in prompt]


def n_pinned(prompt):
    n = 0
    while n < len(prompt) and prompt[n].role == "system":
        n += 1
    return n


def final_step(flt, msgs):
    """``ceil(excess / chunk)`` for the whole history: the number of chunk steps the cut has
    taken by the last turn (no unit here is large enough to hold the cut back)."""
    if isinstance(flt, TokenBudgetFilter):
        cost = sum(COUNTER.count_message(m) for m in msgs)
        avail = flt.max_tokens - COUNTER.count_messages([]) - COUNTER.count_message(StaticPromptProvider(SYSTEM)._message)
    else:
        cost, avail = len(msgs), flt.max_messages
    return max(0, -(-(cost - avail) // flt.chunk))


@pytest.mark.parametrize("provider", ["plain", "state_history"])
@pytest.mark.parametrize("make_filter", [
    lambda: TokenBudgetFilter(2_000, COUNTER, eviction="chunked", chunk=500),
    lambda: MaxMessagesFilter(60, eviction="chunked", chunk=15),
], ids=["tokens", "messages"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_prefix_is_byte_stable(core, make_filter, seed, provider):
    msgs = conversation(120, seed)
    flt = make_filter()
    prompts = replay(flt, msgs, HistoryProvider() if provider == "plain" else StateHistoryProvider())
    serial = [wire(p) for p in prompts]
    heads = [s[:n_pinned(p)] for s, p in zip(serial, prompts)]
    system_json = json.dumps({"content": SYSTEM, "role": "system"}, ensure_ascii=False)
    assert all(h[0] == system_json for h in heads)
    # Everything before the history is byte-identical on every turn; with annotations, the
    # "History semantics" note joins it once, at the first turn with an annotated message.
    changes = [t for t in range(1, len(heads)) if heads[t] != heads[t - 1]]
    if provider == "plain":
        assert changes == []
    else:
        assert len(changes) == 1 and heads[changes[0]][:1] == heads[0] and len(heads[changes[0]]) == 2
    misses = 0
    ids = {m.id: i for i, m in enumerate(msgs)}
    for t in range(1, len(serial)):
        if serial[t][:len(serial[t - 1])] != serial[t - 1]:
            misses += 1
            if t in changes:
                continue
            # a miss is a move of the cut: the history now starts later than before
            first_prev = prompts[t - 1][len(heads[t - 1])].id
            first_now = prompts[t][len(heads[t])].id
            assert ids[first_now] > ids[first_prev], f"turn {t}: cut moved back"
    assert len(serial) > 100
    assert misses > len(changes), "the replay never went over the limit: the test proves nothing"
    # the cut moves only when the excess reaches a new multiple of the chunk
    if provider == "plain":
        assert misses <= final_step(flt, msgs), f"{misses} of {len(serial)} turns missed the cache"
    # whole-prompt string form: a hit means the previous request is a byte prefix
    joined = ["[" + ", ".join(s) for s in serial]
    hits = sum(joined[t].startswith(joined[t - 1]) for t in range(1, len(joined)))
    assert hits == len(serial) - 1 - misses
    assert prefix_cache_stats(prompts, COUNTER).prefix_hits == hits


def test_exact_eviction_misses_once_over_budget(core):
    """The motivation: exact eviction changes the start of the history almost every turn."""
    msgs = conversation(120, 0)
    exact = prefix_cache_stats(replay(TokenBudgetFilter(2_000, COUNTER), msgs), COUNTER)
    chunked = prefix_cache_stats(
        replay(TokenBudgetFilter(2_000, COUNTER, eviction="chunked", chunk=500), msgs), COUNTER)
    assert exact.turns == chunked.turns
    assert exact.prefix_hit_rate < 0.5 and chunked.prefix_hit_rate > exact.prefix_hit_rate + 0.15
    assert chunked.cached_token_share > exact.cached_token_share + 0.15


def test_replay_is_deterministic_across_builders(core):
    msgs = conversation(30, 5)
    flt = lambda: TokenBudgetFilter(800, COUNTER, eviction="chunked", chunk=200)  # noqa: E731
    assert [wire(p) for p in replay(flt(), msgs)] == [wire(p) for p in replay(flt(), msgs)]
