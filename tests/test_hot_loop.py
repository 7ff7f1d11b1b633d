"""Hot loop: a turn costs its new messages, not the history (structural, nothing is timed).

A conversation is replayed turn by turn through ``builder.build()``; spies count what each
turn tokenizes and how many messages reach the counter. Both must stay flat as the history
grows from 100 to 600 messages.
"""

from __future__ import annotations

import json
import random

import pytest

from jianmu_fast.memory.context import (
    ContextBuilder,
    MaxMessagesFilter,
    StateHistoryProvider,
    StaticPromptProvider,
    TiktokenTokenCounter,
    TokenBudgetFilter,
)
from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.message import Message, ai, human, system, tool


class SpyCounter(TiktokenTokenCounter):
    """Records the texts tokenized and the messages counted per call."""

    def __init__(self) -> None:
        super().__init__("o200k_base")
        self.tokenized: list[str] = []
        self.counted = 0

    def _encode_counts(self, texts):
        self.tokenized.extend(texts)
        return super()._encode_counts(texts)

    def count_array(self, messages):
        self.counted += len(messages)
        return super().count_array(messages)


def units(n_messages: int, seed: int) -> list[list[Message]]:
    """A seeded tool-calling conversation as units (what one turn appends)."""
    rng = random.Random(seed)
    words = "token budget cache window tool call result history prompt 上下文 🙂".split()

    def text(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    out: list[list[Message]] = [[system("You are a careful agent.")]]
    size, k = 1, 0
    while size < n_messages:
        r = rng.random()
        if r < 0.35:
            u = [human(text(5, 60))]
        elif r < 0.6:
            u = [ai(text(10, 120))]
        else:
            calls = []
            for _ in range(rng.choice([1, 1, 2])):
                k += 1
                calls.append({"id": f"call_{k}", "type": "function",
                              "function": {"name": rng.choice(["search", "read_file"]),
                                           "arguments": json.dumps({"q": text(1, 6)})}})
            u = [ai(None, tool_calls=calls), *(tool(text(20, 300), tool_call_id=c["id"]) for c in calls)]
        out.append(u)
        size += len(u)
    return out


@pytest.mark.parametrize("annotate", [False, True])
def test_turn_cost_does_not_grow_with_history(core, annotate):
    counter = SpyCounter()
    history_provider = StateHistoryProvider(annotate=annotate)
    builder = ContextBuilder(
        [StaticPromptProvider("Be brief."), history_provider],
        [MaxMessagesFilter(400), TokenBudgetFilter(3000, counter=counter)],
    )
    history: list[Message] = []
    state = {"messages": history}
    per_turn = []  # (history length, texts tokenized, messages counted, prompt length)
    annotated_before = 0
    for unit in units(620, seed=3):
        history.extend(unit)
        counter.tokenized.clear()
        counter.counted = 0
        prompt = builder.build(state)
        assert counter.count_messages(prompt) <= 3000
        new_texts = {m.content for m in unit if isinstance(m.content, str)}
        new_texts |= {c["function"][k] for m in unit for c in m.tool_calls or () for k in ("name", "arguments")}
        # only texts of the new unit (and, with annotation, their annotated copies) are tokenized
        assert len(counter.tokenized) <= 2 * len(new_texts) + 2
        if annotate:  # each message is annotated once, when it arrives
            info = history_provider.cache_info()
            assert info.annotated - annotated_before <= sum(1 for m in unit if m.tool_calls)
            annotated_before = info.annotated
        per_turn.append((len(history), len(counter.tokenized), counter.counted, len(prompt)))

    early = [t for t in per_turn if 100 <= t[0] < 200]
    late = [t for t in per_turn if t[0] >= 500]
    assert early and late
    # what reaches the counter is bounded by the kept window, not by the history
    for n, _, counted, kept in late:
        assert counted <= 2 * kept + 64, (n, counted, kept)
    assert max(t[2] for t in late) <= max(t[2] for t in early) + 64
    # each distinct text of the conversation was tokenized about once over the whole replay
    assert sum(t[1] for t in per_turn) <= 2 * sum(len(u) for u in units(620, seed=3)) + 20


def test_builds_equal_on_replay_and_in_batch(core):
    """The replayed turns equal one batch over every prefix (same prompts, same objects)."""
    from jianmu_fast.batch import build_batch

    counter = TiktokenTokenCounter("o200k_base")
    builder = ContextBuilder([StateHistoryProvider()], [TokenBudgetFilter(2000, counter=counter)])
    all_units = units(300, seed=5)
    history: list[Message] = []
    turns = []
    for unit in all_units:
        history.extend(unit)
        turns.append(builder.build({"messages": list(history)}))
    prefixes, acc = [], []
    for unit in all_units:
        acc = acc + unit
        prefixes.append({"messages": acc})
    assert build_batch(builder, prefixes) == turns


# -- an edit in the middle of the history (context editing, an annotating provider) ----------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _edit(history: list[Message], data: st.DataObject) -> tuple[list[Message], int]:
    """``history`` after a random edit at a random position, and that position: a message
    replaced by one of the same role and ids with other content (as clearing does), deleted,
    inserted, or the list truncated."""
    out = list(history)
    if not out:  # an earlier edit emptied it: only an insert is possible
        out.append(human("inserted at 0"))
        return out, 0
    kind = data.draw(st.sampled_from(["replace", "replace", "delete", "insert", "truncate"]))
    i = data.draw(st.integers(0, len(out) - 1))
    if kind == "replace":
        out[i] = out[i].model_copy(update={"content": "[cleared]" if out[i].role == "tool" else "edited"})
    elif kind == "delete":
        del out[i]
    elif kind == "insert":
        out.insert(i, human(f"inserted at {i}"))
    else:
        del out[max(1, i):]
    return out, i


@given(seed=st.integers(0, 10**6), n=st.integers(2, 90), edits=st.integers(1, 4), data=st.data())
@settings(deadline=None, max_examples=40)
def test_an_edit_in_the_middle_keeps_the_common_prefix_and_equals_a_fresh_filter(core, seed, n, edits, data):
    """After random edits at random positions the filters (both eviction modes, counted and
    message-count limits) return what a fresh filter returns for the edited list, and their
    records equal fresh records of it (ids up to numbering); an edit after the first message
    keeps the records object (the common prefix is not rebuilt)."""
    counter = TiktokenTokenCounter("o200k_base")
    make = [lambda: TokenBudgetFilter(900, counter),
            lambda: TokenBudgetFilter(700, counter, eviction="chunked", chunk=200),
            lambda: MaxMessagesFilter(12)]
    history = [m for u in units(n, seed) for m in u]
    for build in make:
        flt = build()
        h = list(history)
        try:
            flt.apply(h)
        except ContextBudgetError:  # a random newest unit over the limit: the edits still apply
            pass
        for _ in range(edits):
            rec = flt._rec
            h, at = _edit(h, data)
            h = h + [m for u in units(data.draw(st.integers(0, 6)), seed + len(h))[1:] for m in u]
            fresh = build()
            try:
                want = fresh.apply(h)
            except ContextBudgetError as exc:
                with pytest.raises(ContextBudgetError) as got_exc:
                    flt.apply(h)
                assert str(got_exc.value) == str(exc)
                continue
            got = flt.apply(h)
            assert got == want and all(a is b for a, b in zip(got, want))
            if at > 0 and rec is not None:
                assert flt._rec is rec  # the prefix was kept, the rest re-appended
            r, f = flt._rec, fresh._rec
            assert r.n == f.n == len(h) and r.msgs == h
            assert r.roles.tolist() == f.roles.tolist() and r.call_off.tolist() == f.call_off.tolist()
            ids = [(r.call_ids.tolist(), r.result_ids.tolist()), (f.call_ids.tolist(), f.result_ids.tolist())]
            assert len({tuple(_renamed(*x)) for x in ids}) == 1
            known = [(a, b) for a, b in zip(r.counts.tolist(), f.counts.tolist()) if a >= 0 and b >= 0]
            assert all(a == b for a, b in known)


def _renamed(call_ids: list[int], result_ids: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Ids renamed by first use (calls first, then results: enough to compare two numberings
    of the same strings)."""
    names: dict[int, int] = {}
    calls = tuple(names.setdefault(v, len(names)) for v in call_ids)
    return calls, tuple(-1 if v == -1 else names.setdefault(v, len(names)) for v in result_ids)
