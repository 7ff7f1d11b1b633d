"""Checks of CONTRACT.md section 3 shared by the filter tests."""

from __future__ import annotations

from jianmu_fast.memory.context.filters import split_units


def leading_pinned(msgs, roles=("system",)):
    """How many leading messages have a pinned role."""
    n = 0
    while n < len(msgs) and msgs[n].role in roles:
        n += 1
    return n


def units_of(msgs, start):
    """The units of ``msgs[start:]``, as lists of messages."""
    starts = split_units(msgs, start).tolist() + [len(msgs) - start]
    return [msgs[start + a:start + b] for a, b in zip(starts, starts[1:])]


def assert_valid_transactions(out):
    """No tool result without its call right before it; no call without all its results."""
    i = 0
    while i < len(out):
        m = out[i]
        assert m.role != "tool", f"orphan tool result at output[{i}]"
        if m.role == "assistant" and m.tool_calls:
            j = i + 1
            while j < len(out) and out[j].role == "tool":
                j += 1
            answered = sorted(t.tool_call_id for t in out[i + 1:j])
            assert answered == sorted(c["id"] for c in m.tool_calls), f"unanswered call at output[{i}]"
            i = j
        else:
            i += 1
