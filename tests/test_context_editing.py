"""Context-editing stages (issue 19): ToolResultCapFilter, ClearToolResultsFilter,
SummarizingBudgetFilter. Run on both backends (JIANMU_FAST_PURE_PYTHON=1 for the twin)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from invariants import assert_valid_transactions
from jianmu_fast.batch import build_batch
from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import (
    ClearToolResultsFilter,
    ContextBuilder,
    HFTokenCounter,
    SimpleTokenCounter,
    StateHistoryProvider,
    StaticPromptProvider,
    SummarizingBudgetFilter,
    TiktokenTokenCounter,
    TokenBudgetFilter,
    ToolResultCapFilter,
    summarizer_from_client,
)
from jianmu_fast.memory.context.editing import SummaryFailedWarning, describe_edits
from jianmu_fast.message import Message, ai, human, system, tool
from jianmu_fast.prefix_cache import turn_ends

TIKTOKEN = TiktokenTokenCounter("o200k_base")
SIMPLE = SimpleTokenCounter()
HF = HFTokenCounter(Path(__file__).parent / "data" / "all-MiniLM-L6-v2.tokenizer.json")
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 20,
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
         for i in range(4)]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_text = st.text(alphabet=st.sampled_from(list("abcdefgh ij{}\":,.é中文🙂\n0123456789")), min_size=0, max_size=400)


def _call(cid: str, name: str = "search", args: str = '{"q": "x"}') -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


@st.composite
def histories(draw, max_units: int = 25):
    """A valid agent history: a system prompt, then users, answers and tool rounds (parallel
    calls too) whose results are 0 to ~400 characters."""
    msgs: list[Message] = [system("You are an agent. " * draw(st.integers(1, 20)))]
    n = 0
    for _ in range(draw(st.integers(0, max_units))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools", "tools"]))
        if kind == "user":
            msgs.append(human(draw(_text) or "q"))
        elif kind == "assistant":
            msgs.append(ai(draw(_text) or "a"))
        else:
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                n += 1
                calls.append(_call(f"c{n}", draw(st.sampled_from(["search", "read_file", "memory"])),
                                   json.dumps({"q": draw(_text)[:40]})))
            msgs.append(ai(None, tool_calls=calls))
            for c in calls:
                msgs.append(tool(draw(_text) * draw(st.integers(1, 6)), tool_call_id=c["id"]))
    return msgs


def _tool_name(msgs, i):
    j = i
    while msgs[j].role == "tool":
        j -= 1
    for c in msgs[j].tool_calls:
        if c["id"] == msgs[i].tool_call_id:
            return c["function"]["name"]
    raise AssertionError(i)


# -- ToolResultCapFilter ----------------------------------------------------------------------


def _check_cut(original: str, out: str, cap: int, counter) -> None:
    assert counter.count_text(out) <= cap
    head, sep, rest = out.partition("\n[... ")
    assert sep, out
    omitted, sep2, tail = rest.partition(" tokens omitted ...]\n")
    assert sep2 and omitted.isdigit()
    assert original.startswith(head) and original.endswith(tail)
    assert len(head) + len(tail) < len(original)
    if cap >= 60:
        assert head and tail


@pytest.mark.parametrize("counter", [TIKTOKEN, SIMPLE, HF], ids=["tiktoken", "simple", "hf"])
@FAST
@given(text=_text, reps=st.integers(1, 30), cap=st.integers(20, 300))
def test_cap_cuts_within_cap_keeping_head_and_tail(counter, text, reps, cap):
    original = text * reps
    m = tool(original, tool_call_id="c1")
    f = ToolResultCapFilter(cap, counter)
    out = f.apply([human("q"), ai(None, tool_calls=[_call("c1")]), m])
    if counter.count_text(original) <= cap:
        assert out[2] is m
        return
    cut = out[2]
    _check_cut(original, cut.content, cap, counter)
    assert (cut.id, cut.role, cut.tool_call_id) == (m.id, m.role, m.tool_call_id)
    assert cut.metadata["context_edit"]["kind"] == "cut"
    assert m.content == original  # the caller's message is untouched
    assert f.apply([m])[0] is cut  # cached per message


@FAST
@given(text=st.text(alphabet=st.sampled_from(["a", " ", "é", "中", "🙂", "\ud800", "\n", "b", "1"]), max_size=80),
       cap=st.integers(0, 120))
def test_a_result_certainly_under_the_cap_is_not_counted(text, cap):
    """With tiktoken, a text of at most ``cap`` UTF-8 bytes counts at most ``cap`` tokens
    (each token is at least one byte), so the cap skips counting it (``Cutter.within``); the
    outputs equal those of a cutter that counts everything."""
    from jianmu_fast.memory.context.editing._common import DEFAULT_CUT_MARKER
    from jianmu_fast.memory.context.editing._cutter import Cutter

    cutter = Cutter(TIKTOKEN)
    if cutter.within(text, cap):
        assert TIKTOKEN.count_text(text) <= cap
    assert Cutter(SIMPLE).within(text, cap) is False and Cutter(HF).within(text, cap) is False
    counting = Cutter(TIKTOKEN)
    counting._byte_level = False
    assert cutter.cut(text, cap, DEFAULT_CUT_MARKER) == counting.cut(text, cap, DEFAULT_CUT_MARKER)


def test_cap_never_splits_utf8_on_tiktoken_tokens():
    original = "🙂中文é" * 500
    for cap in range(20, 120, 7):
        out = ToolResultCapFilter(cap, TIKTOKEN).cap(tool(original, tool_call_id="c"))
        _check_cut(original, out.content, cap, TIKTOKEN)
        out.content.encode("utf-8")  # a valid str: no lone surrogate, no split character


def test_cap_setting_changed_cuts_as_a_new_filter():
    """Changing ``max_tokens``, ``marker`` or ``counter`` drops the cuts made (and the hot path's
    lists): ``apply`` and the builder's hot path then give what a new filter with those settings
    gives. An old pickle (settings stored under their own names) still loads."""
    import pickle

    big = [tool(f"result {i} " + "word " * (200 + 40 * i), tool_call_id=f"c{i}") for i in range(4)]
    msgs = [m for i, r in enumerate(big) for m in (human(f"q{i}"), ai(None, tool_calls=[_call(f"c{i}")]), r)]
    from jianmu_fast.memory.context.editing._common import DEFAULT_CUT_MARKER

    f = ToolResultCapFilter(300, TIKTOKEN)
    b = ContextBuilder(providers=[StateHistoryProvider(annotate=False)], filters=[f])
    assert b._hot_plan() is not None  # the builder's hot path
    state: dict = {"messages": []}
    settings = {"max_tokens": 300, "marker": DEFAULT_CUT_MARKER, "counter": TIKTOKEN}
    changes = {4: ("max_tokens", 120), 7: ("marker", "<{omitted} cut>"), 10: ("counter", SIMPLE)}
    for i, m in enumerate(msgs):
        state["messages"].append(m)
        if i in changes:
            setattr(f, *changes[i])
            settings[changes[i][0]] = changes[i][1]
        fresh = ToolResultCapFilter(settings["max_tokens"], settings["counter"], marker=settings["marker"])
        want = [x.to_openai() for x in fresh.apply(msgs[:i + 1])]
        if m.role != "assistant":  # (a prompt never ends with a call awaiting its result)
            assert [x.to_openai() for x in b.build(state)] == want
        assert [x.to_openai() for x in f.apply(msgs[:i + 1])] == want
    old = pickle.loads(pickle.dumps(f))
    old.__setstate__({**{k: v for k, v in old.__dict__.items() if k not in ("_max_tokens", "_marker", "_counter")},
                      "max_tokens": 50, "marker": "[{omitted}]", "counter": TIKTOKEN})
    assert (old.max_tokens, old.marker, old.counter) == (50, "[{omitted}]", TIKTOKEN)
    assert TIKTOKEN.count_text(old.apply(msgs)[2].content) <= 50


def test_cap_leaves_other_messages_and_small_results_alone():
    msgs = [system("s" * 5000), human("u" * 5000), ai("a" * 5000), tool("small", tool_call_id="c")]
    out = ToolResultCapFilter(50).apply(msgs)
    assert all(a is b for a, b in zip(out, msgs)) and out is not msgs


@pytest.mark.parametrize("counter", [TIKTOKEN, SIMPLE], ids=["tiktoken", "simple"])
def test_cap_cuts_structured_content_in_its_text_blocks(counter):
    blocks = [{"type": "text", "text": "alpha " * 300}, {"type": "image_url", "image_url": {"url": "data:x"}},
              {"type": "text", "text": "beta " * 300}, {"type": "text", "text": "gamma " * 300}]
    m = tool(blocks, tool_call_id="c")
    out = ToolResultCapFilter(200, counter).cap(m)
    cost = sum(counter.count_text(b["text"]) if b["type"] == "text" else counter.image_tokens
               if hasattr(counter, "image_tokens") else 85 for b in out.content)
    assert cost <= 200
    assert out.content[0]["text"].startswith("alpha alpha") and "tokens omitted" in out.content[0]["text"]
    assert out.content[-1]["text"].endswith("gamma gamma ")
    assert any(b["type"] == "image_url" for b in out.content)
    assert not any(b.get("text", "").startswith("beta") for b in out.content)


def test_cap_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_tokens must be an int between 1 and 2\\*\\*53, got 0"):
        ToolResultCapFilter(0)
    with pytest.raises(ValueError, match="marker: a format string whose only field is"):
        ToolResultCapFilter(10, marker="{n} left out")
    with pytest.raises(TypeError, match="counter: expected a TokenCounterProtocol"):
        ToolResultCapFilter(10, counter=object())


# -- ClearToolResultsFilter -------------------------------------------------------------------


@FAST
@given(msgs=histories(), trigger=st.integers(0, 3000), keep=st.integers(0, 4),
       step=st.sampled_from([0, 50, 400]), inputs=st.booleans(), with_tools=st.booleans())
def test_clearing_keeps_ids_roles_newest_and_excluded(msgs, trigger, keep, step, inputs, with_tools):
    f = ClearToolResultsFilter(trigger, TIKTOKEN, keep=keep, clear_at_least=step, exclude_tools=("memory",),
                               clear_tool_inputs=inputs)
    tools = TOOLS if with_tools else None
    out = f.apply(msgs, tools_schema=tools)
    assert [(m.id, m.role, m.tool_call_id) for m in out] == [(m.id, m.role, m.tool_call_id) for m in msgs]
    assert [[c["id"] for c in m.tool_calls or ()] for m in out] == [[c["id"] for c in m.tool_calls or ()] for m in msgs]
    assert_valid_transactions(out)
    results = [i for i, m in enumerate(msgs) if m.role == "tool"]
    newest = set(results[len(results) - keep:]) if keep else set()
    cleared = set(f.cleared_results(msgs, tools))
    for i in results:
        if i in newest or _tool_name(msgs, i) == "memory":
            assert out[i] is msgs[i] and i not in cleared
        if i in cleared:
            assert out[i].content == "[cleared]" and out[i].metadata["context_edit"]["kind"] == "cleared"
        else:
            assert out[i] is msgs[i]
    total = TIKTOKEN.count_messages(msgs) + TIKTOKEN.count_tools(tools)
    if total <= trigger:
        assert not cleared and all(a is b for a, b in zip(out, msgs))
    for i, m in enumerate(out):
        if m.role == "assistant" and m.tool_calls:
            for c, c0 in zip(m.tool_calls, msgs[i].tool_calls):
                answered = next(j for j in results if j > i and msgs[j].tool_call_id == c["id"])
                expect = "{}" if inputs and answered in cleared else c0["function"]["arguments"]
                assert c["function"]["arguments"] == expect
    # deterministic, no hidden state: a fresh filter, and the same filter after another history
    g = ClearToolResultsFilter(trigger, TIKTOKEN, keep=keep, clear_at_least=step, exclude_tools=("memory",),
                               clear_tool_inputs=inputs)
    assert [m.to_openai() for m in g.apply(msgs, tools_schema=tools)] == [m.to_openai() for m in out]
    f.apply(msgs[:3])
    assert [m.to_openai() for m in f.apply(msgs, tools_schema=tools)] == [m.to_openai() for m in out]


@FAST
@given(msgs=histories(max_units=40), trigger=st.integers(0, 3000), keep=st.integers(0, 4),
       step=st.sampled_from([0, 50, 400, 2000]), data=st.data())
def test_clearing_is_monotone_along_a_growing_history(msgs, trigger, keep, step, data):
    f = ClearToolResultsFilter(trigger, TIKTOKEN, keep=keep, clear_at_least=step)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(msgs)), max_size=6)) + [len(msgs)])
    before: set[int] = set()
    prev = None
    for n in cuts:
        now = set(f.cleared_results(msgs[:n]))
        assert before <= now, (n, sorted(before - now))
        out = f.apply(msgs[:n])
        if prev is not None and now == before:  # between two steps each prompt extends the previous one
            assert [m.to_openai() for m in out[:len(prev)]] == [m.to_openai() for m in prev]
        before, prev = now, out


def test_clearing_counts_the_tools_in_the_trigger():
    msgs = [system("s"), human("q")]
    for i in range(6):
        msgs += [ai(None, tool_calls=[_call(f"c{i}")]), tool("r " * 200, tool_call_id=f"c{i}")]
    total = TIKTOKEN.count_messages(msgs)
    f = ClearToolResultsFilter(total + 10, TIKTOKEN, keep=2)
    assert f.cleared_results(msgs) == []
    assert f.cleared_results(msgs, TOOLS) == [3, 5, 7]  # then the prompt, as cleared, is under the trigger


def _agent_loop(seed: int, rounds: int) -> list[Message]:
    import random

    rng = random.Random(seed)
    msgs = [system("s" * 200)]
    for i in range(rounds):
        if rng.random() < 0.4:
            msgs.append(human("q" * rng.randint(20, 400)))
        msgs += [ai(None, tool_calls=[_call(f"c{i}")]), tool("r" * rng.randint(40, 3000), tool_call_id=f"c{i}")]
        if rng.random() < 0.5:
            msgs.append(ai("a" * rng.randint(20, 600)))
    return msgs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clear_at_least_steps_where_the_chunked_cut_moves(seed):
    """Each step saves at least clear_at_least tokens or clears all that is eligible, and is
    taken at a turn where the chunked budget filter's cut moves anyway (its prompt would not
    extend the previous one even without the step), so between steps prompts extend."""
    msgs = _agent_loop(seed, 120)
    trigger, step = 2000, 500
    f = ClearToolResultsFilter(trigger, SIMPLE, keep=2, clear_at_least=step)
    prev_out = prev_prompt = None
    prev_cleared: list[int] = []
    steps = 0
    for end in turn_ends(msgs):
        out = f.apply(msgs[:end])
        cleared = f.cleared_results(msgs[:end])
        assert cleared[:len(prev_cleared)] == prev_cleared  # monotone
        budget = TokenBudgetFilter(trigger, SIMPLE, eviction="chunked", chunk=step)
        if prev_out is not None and cleared != prev_cleared:
            steps += 1
            new = [i for i in cleared if i not in prev_cleared]
            saved = sum(SIMPLE.count_message(msgs[i]) - SIMPLE.count_message(out[i]) for i in new)
            n_results = sum(1 for m in msgs[:end] if m.role == "tool")
            assert saved >= step or len(cleared) == n_results - 2
            # without the step, the budget's prompt would not extend the previous one either
            without = budget.apply(prev_out + msgs[len(prev_out):end])
            assert without[:len(prev_prompt)] != prev_prompt
        elif prev_out is not None:
            assert out[:len(prev_out)] == prev_out
        prev_out, prev_cleared = out, cleared
        prev_prompt = TokenBudgetFilter(trigger, SIMPLE, eviction="chunked", chunk=step).apply(out)
    assert steps >= 3


def test_clear_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keep must be an int between 0 and 2\\*\\*53, got -1"):
        ClearToolResultsFilter(10, keep=-1)
    with pytest.raises(TypeError, match="exclude_tools must be a collection of tool names, not a string"):
        ClearToolResultsFilter(10, exclude_tools="memory")
    with pytest.raises(TypeError, match="exclude_tools\\[1\\]: expected a tool name"):
        ClearToolResultsFilter(10, exclude_tools=["a", 3])


@FAST
@given(msgs=histories(), budget=st.integers(600, 4000), keep=st.integers(0, 3), with_tools=st.booleans())
def test_clear_then_budget_is_within_budget_with_valid_pairing(msgs, budget, keep, with_tools):
    tools = TOOLS if with_tools else None
    b = ContextBuilder(filters=[ToolResultCapFilter(150, TIKTOKEN), ClearToolResultsFilter(budget, TIKTOKEN, keep=keep),
                                TokenBudgetFilter(budget, TIKTOKEN)])
    try:
        out = b.transform(msgs, tools_schema=tools)
    except ContextBudgetError:
        return
    assert TIKTOKEN.count_messages(out) + TIKTOKEN.count_tools(tools) <= budget
    assert_valid_transactions(out)


# -- SummarizingBudgetFilter ------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls: list[list[Message]] = []

    def __call__(self, messages):
        self.calls.append(list(messages))
        return f"{len(messages)} messages about " + ", ".join(sorted({m.role for m in messages}))


@FAST
@given(msgs=histories(max_units=30), budget=st.integers(700, 4000), with_tools=st.booleans(),
       eviction=st.sampled_from(["exact", "chunked"]))
def test_summarizing_budget_is_within_budget(msgs, budget, with_tools, eviction):
    tools = TOOLS if with_tools else None
    chunk = budget // 4 if eviction == "chunked" else None
    f = SummarizingBudgetFilter(budget, TIKTOKEN, summarize=Recorder(), summary_max_tokens=150,
                                eviction=eviction, chunk=chunk)
    plain = TokenBudgetFilter(budget, TIKTOKEN, eviction=eviction, chunk=chunk)
    try:
        expect = plain.apply(msgs, tools_schema=tools)
    except ContextBudgetError:
        with pytest.raises(ContextBudgetError):
            f.apply(msgs, tools_schema=tools)
        return
    out = f.apply(msgs, tools_schema=tools)
    assert TIKTOKEN.count_messages(out) + TIKTOKEN.count_tools(tools) <= budget
    assert_valid_transactions(out)
    summaries = [i for i, m in enumerate(out) if m.metadata.get("context_edit", {}).get("kind") == "summary"]
    if len(expect) == len(msgs):
        assert out == expect and not summaries
        return
    if summaries:
        (i,) = summaries
        assert i == 1 and out[i].role == "system"  # right after the pinned system prompt
        kept = out[2:]
        assert kept == msgs[len(msgs) - len(kept):]  # a contiguous run of the newest messages
        n = out[i].metadata["context_edit"]["messages"]
        assert msgs[1:1 + n] + kept == msgs[1:]
    else:
        assert out == expect


def _long_history(n_rounds=30):
    msgs = [system("You help.")]
    for i in range(n_rounds):
        msgs += [human(f"question {i} " * 10), ai(None, tool_calls=[_call(f"c{i}")]),
                 tool(f"result {i} " * 60, tool_call_id=f"c{i}"), ai(f"answer {i} " * 10)]
    return msgs


@pytest.mark.parametrize("failure", ["raise", "timeout", "not-a-str"])
def test_summarizer_failure_gives_the_plain_budget_result(failure):
    def bad(messages):
        if failure == "raise":
            raise RuntimeError("model down")
        if failure == "timeout":
            time.sleep(1.0)
            return "late"
        return 42

    msgs = _long_history()
    f = SummarizingBudgetFilter(1500, TIKTOKEN, summarize=bad, summary_max_tokens=200, timeout=0.2)
    with pytest.warns(SummaryFailedWarning, match="the prompt is the plain budget filter's"):
        out = f.apply(msgs, tools_schema=TOOLS)
    assert out == TokenBudgetFilter(1500, TIKTOKEN).apply(msgs, tools_schema=TOOLS)


def test_summaries_roll_and_are_cached_by_content():
    rec = Recorder()
    f = SummarizingBudgetFilter(2500, TIKTOKEN, summarize=rec, summary_max_tokens=200, eviction="chunked", chunk=600)
    msgs = _long_history(40)
    prompts = [f.apply(msgs[:n]) for n in range(5, len(msgs) + 1, 4)]
    moves = len({p[2].id for p in prompts if p[1].metadata.get("context_edit")})
    assert 0 < len(rec.calls) <= moves + 1
    rolled = [c for c in rec.calls if c[0].content.startswith("Summary of the earlier conversation:")]
    assert rolled, "a longer history extends the previous summary"
    # the same span in equal, new Message objects: no new call
    n = len(rec.calls)
    copies = [Message(**m.model_dump()) for m in msgs]
    again = f.apply(copies)
    assert len(rec.calls) == n and again[1].content == f.apply(msgs)[1].content


def test_rolling_summary_resumed_along_a_growing_history_equals_a_fresh_one():
    """The summary of a span resumed from the previous span's fold points (the hot loop)
    is the summary a fresh filter computes for the same history (the same text, and the
    same summarize calls for the steps that the fresh filter also needs)."""
    msgs = _long_history(40)
    grown = SummarizingBudgetFilter(2500, TIKTOKEN, summarize=Recorder(), summary_max_tokens=200,
                                    eviction="chunked", chunk=600)
    for n in range(5, len(msgs) + 1, 3):
        out = grown.apply(msgs[:n])
        fresh = SummarizingBudgetFilter(2500, TIKTOKEN, summarize=Recorder(), summary_max_tokens=200,
                                        eviction="chunked", chunk=600)
        assert [m.to_openai() for m in fresh.apply(msgs[:n])] == [m.to_openai() for m in out]


@pytest.mark.parametrize("records", [False, True, "uncounted"])
@pytest.mark.parametrize("step", [1, 2, 5])
def test_rolling_summary_resumed_from_the_previous_span_end_equals_a_fresh_one(step, records):
    """The fold scan and the content keys resume at the previous span's end (not only at its
    last fold point): every span of a growing history gets the summary, the fold points and
    the content keys that a fresh filter computes for it, whether the span extends the last
    one by comparison (a list of its own) or by the records it is read from (the hot path:
    the same records, only grown, ``Records.version`` unchanged; ``"uncounted"``: records
    without counts, which the filter counts into them); a rewound record set starts over and
    still agrees. The fresh filter has no records: ``Records.fold_keys`` over records of the
    span alone (one implementation of the scan and the keys)."""
    from jianmu_fast import _backend

    msgs = _long_history(40)
    kw = dict(summary_max_tokens=200, eviction="chunked", chunk=300)
    grown = SummarizingBudgetFilter(2500, TIKTOKEN, summarize=Recorder(), **kw)
    rec = _backend.Records(Message) if records else None
    folds = set()
    for n in range(1, len(msgs) + 1, step):
        if rec is not None:
            if n == 61:  # an edit in the middle: the records are rewound (a new version)
                rec.truncate(30)
            rec.extend(msgs[rec.n:n], None if records == "uncounted" else [TIKTOKEN.count_message(m) for m in msgs[rec.n:n]])
        got = grown._summary_text(msgs, 1, n, rec, None if records else msgs[1:n])
        if rec is not None:  # (counted into the records as far as the span reaches)
            assert rec.counts[1:n].tolist() == [TIKTOKEN.count_message(m) for m in msgs[1:n]]
        fresh = SummarizingBudgetFilter(2500, TIKTOKEN, summarize=Recorder(), **kw)
        assert got == fresh._summary_text(msgs[1:n], 0, n - 1)
        # (span, records, version, start) differ; the fold state and keys are the same
        assert grown._chain[4:] == fresh._chain[4:]
        folds.add(grown._chain[4])
    assert len(folds) >= 3  # the history folds several times


def test_async_summarizer_and_model_client_adapter():
    async def summarize(messages):
        await asyncio.sleep(0)
        return "async summary"

    f = SummarizingBudgetFilter(1500, TIKTOKEN, summarize=summarize, summary_max_tokens=200)
    out = f.apply(_long_history())
    assert out[1].content.endswith("async summary")

    class Client:  # a ModelClient: invoke(messages, *, tools=None, config=None) -> Message
        def __init__(self):
            self.seen = []

        def invoke(self, messages, *, tools=None, config=None):
            self.seen.append(messages)
            return ai("They asked 30 questions.")

    client = Client()
    f = SummarizingBudgetFilter(1500, TIKTOKEN, summarize=client, summary_max_tokens=200)
    out = f.apply(_long_history())
    assert out[1].content.endswith("They asked 30 questions.")
    assert client.seen[0][0].role == "system" and "user: question 0" in client.seen[0][1].content
    assert callable(summarizer_from_client(client))
    with pytest.raises(TypeError, match="client: expected a ModelClient"):
        summarizer_from_client(object())


def test_summary_is_capped():
    f = SummarizingBudgetFilter(1500, TIKTOKEN, summarize=lambda ms: "word " * 5000, summary_max_tokens=100)
    out = f.apply(_long_history())
    assert TIKTOKEN.count_message(out[1]) <= 100 and TIKTOKEN.count_messages(out) <= 1500


# -- in builders, batches and reports ---------------------------------------------------------


def _builder(summarize=None):
    filters = [ToolResultCapFilter(120, TIKTOKEN), ClearToolResultsFilter(1800, TIKTOKEN, keep=2, clear_at_least=300)]
    if summarize:
        filters.append(SummarizingBudgetFilter(1800, TIKTOKEN, summarize=summarize, summary_max_tokens=150))
    else:
        filters.append(TokenBudgetFilter(1800, TIKTOKEN))
    return ContextBuilder(providers=[StaticPromptProvider("You help."), StateHistoryProvider()], filters=filters)


@pytest.mark.parametrize("summarize", [None, Recorder()], ids=["budget", "summarizing"])
def test_build_batch_equals_per_state_build(summarize):
    history = _long_history(25)[1:]
    states = [{"messages": history[:n]} for n in turn_ends(history)]
    states += states[::-1]
    batch = build_batch(_builder(summarize), states, tools_schema=TOOLS)
    fresh = [_builder(summarize).build(s, tools_schema=TOOLS) for s in states]
    assert [[m.to_openai() for m in p] for p in batch] == [[m.to_openai() for m in p] for p in fresh]


def test_build_report_shows_each_stage_effect():
    r = _builder(Recorder()).build_report({"messages": _long_history(25)[1:]}, tools_schema=TOOLS)
    details = {s.name: s.detail for s in r.filters}
    assert details["ToolResultCapFilter"].startswith("cut 25 result(s) (-")
    assert details["ClearToolResultsFilter"].startswith("cleared ")
    assert details["SummarizingBudgetFilter"].startswith("summary of ")
    assert "cut 25 result(s)" in str(r)


def test_describe_edits_is_empty_without_edits():
    msgs = [human("a")]
    assert describe_edits(msgs, msgs) == ""


# -- presets, config, command line ------------------------------------------------------------


def test_for_react_adds_the_editing_stages():
    b = ContextBuilder.for_react(max_tokens=8000, token_counter=TIKTOKEN, tool_result_max_tokens=2000,
                                 clear_tool_results=3, summarize=lambda ms: "s")
    assert [type(f).__name__ for f in b.filters] == ["ToolResultCapFilter", "ClearToolResultsFilter",
                                                     "SummarizingBudgetFilter"]
    assert b.filters[1].keep == 3 and b.filters[1].trigger_tokens == 8000 and b.filters[0].max_tokens == 2000
    b = ContextBuilder.for_react(max_tokens=8000, clear_tool_results={"keep": 1, "clear_at_least": 2000})
    assert (b.filters[0].keep, b.filters[0].clear_at_least) == (1, 2000)
    assert [type(f).__name__ for f in ContextBuilder.for_react(max_tokens=800).filters] == ["TokenBudgetFilter"]
    with pytest.raises(ValueError, match="clear_tool_results needs max_tokens="):
        ContextBuilder.for_react(clear_tool_results=3)
    with pytest.raises(ValueError, match="summarize= summarizes what the token budget drops"):
        ContextBuilder.for_react(summarize=lambda ms: "s")


def test_jianmu_yaml_constraints_configure_the_preset(tmp_path, monkeypatch):
    cfg = tmp_path / "jianmu.yaml"
    cfg.write_text("constraints:\n  tool_result_max_tokens: 500\n  clear_tool_results: 0\n", encoding="utf-8")
    monkeypatch.setenv("JIANMU_CONFIG", str(cfg))
    b = ContextBuilder.for_react(max_tokens=4000)
    assert [type(f).__name__ for f in b.filters] == ["ToolResultCapFilter", "ClearToolResultsFilter", "TokenBudgetFilter"]
    assert b.filters[0].max_tokens == 500 and b.filters[1].keep == 0
    cfg.write_text("constraints:\n  clear_tool_results: -1\n", encoding="utf-8")
    from jianmu_fast.errors import ConfigError

    with pytest.raises(ConfigError, match="clear_tool_results"):
        ContextBuilder.for_react(max_tokens=4000)


def test_cli_flags(tmp_path):
    import subprocess
    import sys

    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    for i in range(8):
        history += [{"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}")]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i} " * 300}]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": history}) + "\n", encoding="utf-8")
    dst = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "jianmu_fast.cli", "build", str(src), "-o", str(dst), "--preset", "react",
           "--max-tokens", "3000", "--tool-result-max-tokens", "400", "--clear-tool-results", "2"]
    subprocess.run(cmd, check=True, capture_output=True)
    out = json.loads(dst.read_text(encoding="utf-8"))
    msgs = out["messages"] if isinstance(out, dict) else out
    results = [m["content"] for m in msgs if m["role"] == "tool"]
    assert results[-2:] and all("tokens omitted" in r for r in results[-2:])
    assert results[0] == "[cleared]" and all(r == "[cleared]" or "tokens omitted" in r for r in results)
    bad = subprocess.run(cmd[:-6] + ["--clear-tool-results", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--clear-tool-results clears once a prompt is over --max-tokens" in bad.stderr


def _summarize_for_pickle(messages):
    return f"{len(messages)} messages"


def test_stages_pickle_and_share_across_threads():
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    stages = [ToolResultCapFilter(120, TIKTOKEN), ClearToolResultsFilter(1800, TIKTOKEN, keep=2, clear_at_least=300),
              SummarizingBudgetFilter(1800, TIKTOKEN, summarize=_summarize_for_pickle, summary_max_tokens=150)]
    b = ContextBuilder(filters=stages)
    history = _long_history(25)
    prefixes = [history[:e] for e in turn_ends(history)]
    expect = [[m.to_openai() for m in ContextBuilder(filters=pickle.loads(pickle.dumps(stages))).transform(p)]
              for p in prefixes]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: [m.to_openai() for m in b.transform(p)], prefixes * 4))
    assert got == expect * 4


@pytest.mark.parametrize("name", ["ToolResultCapFilter", "ClearToolResultsFilter", "SummarizingBudgetFilter",
                                  "SummaryFailedWarning", "_Cutter"])
def test_pickles_made_before_the_package_split_still_resolve(name):
    """Pickles from the single-module ``editing.py`` name ``jianmu_fast.memory.context.editing.<name>``
    (``_Cutter``: the cutter inside a pickled cap or summarizing stage): the unpickler finds the same class."""
    import io
    import pickle

    from jianmu_fast.memory.context.editing import _cutter, cap, clearing, summarizer, summarizing

    now = {"ToolResultCapFilter": cap.ToolResultCapFilter, "ClearToolResultsFilter": clearing.ClearToolResultsFilter,
           "SummarizingBudgetFilter": summarizing.SummarizingBudgetFilter,
           "SummaryFailedWarning": summarizer.SummaryFailedWarning, "_Cutter": _cutter.Cutter}[name]
    assert pickle.Unpickler(io.BytesIO()).find_class("jianmu_fast.memory.context.editing", name) is now
