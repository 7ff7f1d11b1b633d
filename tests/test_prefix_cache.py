"""jianmu_fast.prefix_cache: exact figures on handmade prompt runs."""

from __future__ import annotations

import dataclasses

import pytest

import jianmu_fast
from jianmu_fast.errors import MessageValidationError
from jianmu_fast.memory.context import SimpleTokenCounter
from jianmu_fast.message import ai, human, system, tool
from jianmu_fast.prefix_cache import PrefixCacheStats, common_prefix_length, prefix_cache_stats

CALL = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x":1}'}}]


def test_exported_from_package():
    assert jianmu_fast.prefix_cache_stats is prefix_cache_stats
    assert jianmu_fast.PrefixCacheStats is PrefixCacheStats
    assert {"prefix_cache_stats", "PrefixCacheStats"} <= set(jianmu_fast.__all__)


def test_handmade_run_exact_numbers():
    c = SimpleTokenCounter()
    s = system("You are terse.")          # 4 + ceil(14/4)=4 -> 8
    u1 = human("What is 2+2?")            # 4 + 3 -> 7
    call = ai(None, tool_calls=CALL)      # 4 + 3 + ceil(2/4)=1 + ceil(4/4)=1 + ceil(7/4)=2 -> 11
    res = tool("4", tool_call_id="c1")    # 4 + 1 + 1 -> 6
    a1 = ai("It is 4.")                   # 4 + 2 -> 6
    u2 = human("Thanks")                  # 4 + 2 -> 6
    assert [c.count_message(m) for m in (s, u1, call, res, a1, u2)] == [8, 7, 11, 6, 6, 6]
    prompts = [
        [s, u1],                          # 3 + 15 = 18
        [s, u1, call, res],               # 3 + 32 = 35, extends turn 1: hit, cached 15
        [s, u1, call, res, a1, u2],       # 3 + 44 = 47, extends turn 2: hit, cached 32
        [s, a1, u2],                      # 3 + 20 = 23, cut moved: miss, cached 8 (system)
        [s, a1, u2],                      # identical: hit, cached 20
    ]
    st = prefix_cache_stats(prompts, c)
    assert st == PrefixCacheStats(turns=5, prefix_hits=3, total_tokens=18 + 35 + 47 + 23 + 23,
                                  cached_tokens=15 + 32 + 8 + 20)
    assert st.prefix_hit_rate == 3 / 4
    assert st.cached_token_share == 75 / 146
    assert st.mean_prompt_tokens == 146 / 5


def test_default_counter_is_simple():
    prompts = [[system("abcd"), human("x")], [system("abcd"), human("x"), ai("yy")]]
    assert prefix_cache_stats(prompts) == prefix_cache_stats(prompts, SimpleTokenCounter())


def test_dicts_and_messages_compare_by_wire_form():
    # Different ids and metadata, same chat-completions dict: still a cache hit.
    a = [human("hi", metadata={"k": 1})]
    b = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    st = prefix_cache_stats([a, b])
    assert (st.prefix_hits, st.cached_tokens) == (1, 5)


def test_one_byte_difference_is_a_miss():
    st = prefix_cache_stats([[system("abc"), human("q")], [system("abd"), human("q"), ai("a")]])
    assert (st.prefix_hits, st.cached_tokens, st.prefix_hit_rate) == (0, 0, 0.0)


def test_shorter_prompt_is_a_miss_but_shares_its_prefix():
    s, u = system("s"), human("u")
    st = prefix_cache_stats([[s, u, ai("a")], [s, u]])
    assert st.prefix_hits == 0
    assert st.cached_tokens == 10  # s and u, 5 tokens each


def test_empty_and_single_runs():
    assert prefix_cache_stats([]) == PrefixCacheStats(0, 0, 0, 0)
    empty = prefix_cache_stats([])
    assert (empty.prefix_hit_rate, empty.cached_token_share, empty.mean_prompt_tokens) == (1.0, 0.0, 0.0)
    one = prefix_cache_stats([[human("hi")]])
    assert (one.turns, one.prefix_hits, one.cached_tokens, one.total_tokens) == (1, 0, 0, 8)
    assert one.prefix_hit_rate == 1.0


def test_accepts_a_generator():
    gen = ([human("a")] * k for k in range(1, 4))
    assert prefix_cache_stats(gen).prefix_hits == 2


def test_stats_are_frozen():
    st = prefix_cache_stats([[human("a")]])
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.turns = 3  # type: ignore[misc]


def test_bad_prompt_names_its_index():
    with pytest.raises(MessageValidationError, match=r"prompts\[1\]\[0\]\.role"):
        prefix_cache_stats([[human("a")], [{"role": "robot", "content": "x"}]])
    with pytest.raises(MessageValidationError, match=r"prompts\[0\]: expected a list of messages"):
        prefix_cache_stats(["not a prompt"])
    with pytest.raises(MessageValidationError, match="expected a sequence of prompts"):
        prefix_cache_stats("abc")


def test_common_prefix_length():
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2], [1, 2]) == 2
    assert common_prefix_length([1, 2, 3], [1, 9, 3]) == 1
