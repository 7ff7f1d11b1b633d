"""Hypothesis strategies: filter-core cases and conversations with tool calls."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from jianmu_fast.message import Message, ai, human, system, tool


@dataclass(frozen=True)
class WindowCase:
    counts: tuple[int, ...]
    unit_starts: tuple[int, ...]
    n_pinned: int
    budget: int
    from_start: bool
    chunk: int

    @property
    def args(self):
        return (
            np.array(self.counts, dtype=np.int64),
            np.array(self.unit_starts, dtype=np.int64),
            self.n_pinned,
            self.budget,
            self.from_start,
            self.chunk,
        )


@st.composite
def window_cases(draw, max_messages: int = 30, max_count: int = 50) -> WindowCase:
    """A valid argument set for ``select_window``."""
    n_pinned = draw(st.integers(0, 4))
    n_rest = draw(st.integers(0, max_messages))
    counts = draw(st.lists(st.integers(0, max_count), min_size=n_pinned + n_rest, max_size=n_pinned + n_rest))
    starts: list[int] = []
    if n_rest:
        inner = draw(st.sets(st.integers(n_pinned + 1, n_pinned + n_rest - 1), max_size=n_rest)) if n_rest > 1 else set()
        starts = [n_pinned] + sorted(inner)
    total = sum(counts)
    budget = draw(st.one_of(st.integers(0, total + 5), st.integers(0, 10)))
    return WindowCase(
        counts=tuple(counts),
        unit_starts=tuple(starts),
        n_pinned=n_pinned,
        budget=budget,
        from_start=draw(st.booleans()),
        chunk=draw(st.sampled_from([0, 0, 1, 3, 10, 40])),
    )


_words = st.text(alphabet=st.sampled_from(list("abcdefgh ij{}\":,é中🙂\n")), min_size=0, max_size=60)


@st.composite
def conversations(draw, max_units: int = 14, pinned_max: int = 3) -> list[Message]:
    """A valid history: system prefix, then users, answers and tool-call transactions
    (parallel calls included); every call has all its results right after it."""
    msgs: list[Message] = [system(draw(_words) or "sys") for _ in range(draw(st.integers(0, pinned_max)))]
    call_no = 0
    for _ in range(draw(st.integers(0, max_units))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "system"]))
        if kind == "user":
            msgs.append(human(draw(_words)))
        elif kind == "assistant":
            msgs.append(ai(draw(_words)))
        elif kind == "system":
            msgs.append(system(draw(_words) or "note"))
        else:
            n_calls = draw(st.integers(1, 3))
            calls = []
            for _ in range(n_calls):
                call_no += 1
                calls.append({"id": f"call_{call_no}", "type": "function",
                              "function": {"name": draw(st.sampled_from(["search", "calc", "read_file"])),
                                           "arguments": json.dumps({"q": draw(_words)})}})
            msgs.append(ai(draw(st.one_of(st.none(), _words)), tool_calls=calls))
            for c in calls:
                msgs.append(tool(draw(_words), tool_call_id=c["id"]))
    return msgs
