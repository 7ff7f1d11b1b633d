"""SummarizingBudgetFilter's hot path: a turn whose cut did not move is one compiled
``Records.window`` call that puts the last summary in place. Along growing histories (with
edits in the middle, changing tools, failures, threads, pickling) the warm filter's output
equals a fresh filter's on every turn. Run on both backends (JIANMU_FAST_PURE_PYTHON=1)."""

from __future__ import annotations

import json
import pickle
import threading
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from invariants import assert_valid_transactions
from jianmu_fast.batch import build_batch
from jianmu_fast.errors import ContextBudgetError
from jianmu_fast.memory.context import ContextBuilder, SummarizingBudgetFilter, TiktokenTokenCounter
from jianmu_fast.memory.context.editing import SummaryFailedWarning
from jianmu_fast.message import Message, ai, human, system, tool

COUNTER = TiktokenTokenCounter("o200k_base")
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 20,
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
         for i in range(3)]
HUGE_TOOLS = [{"type": "function", "function": {"name": "big", "description": "word " * 5000}}]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def summarize(messages: list[Message]) -> str:
    """Deterministic, a function of the content: what a fresh filter computes too."""
    roles = ",".join(m.role for m in messages)
    return f"{len(messages)} messages ({roles[:200]})"


class Counting:
    def __init__(self, fail_on: int = -1) -> None:
        self.calls = 0
        self.fail_on = fail_on  # spans of this many messages (mod 3) fail

    def __call__(self, messages: list[Message]) -> str:
        self.calls += 1
        if self.fail_on >= 0 and len(messages) % 3 == self.fail_on:
            raise RuntimeError("model down")
        return summarize(messages)


def _loop(seed: int, rounds: int, size: int = 40) -> list[Message]:
    import random

    rng = random.Random(seed)
    msgs: list[Message] = [system("You are an agent. " * 5)]
    for i in range(rounds):
        msgs.append(human(f"question {i} " * rng.randint(1, size)))
        for j in range(rng.randint(0, 2)):
            calls = [{"id": f"c{i}_{j}_{k}", "type": "function",
                      "function": {"name": "search", "arguments": json.dumps({"q": f"{i} {j}"})}}
                     for k in range(rng.randint(1, 2))]
            msgs.append(ai(None, tool_calls=calls))
            msgs += [tool(f"result {i} " * rng.randint(1, 4 * size), tool_call_id=c["id"]) for c in calls]
        msgs.append(ai(f"answer {i} " * rng.randint(1, size)))
    return msgs


def _ends(msgs: list[Message]) -> list[int]:
    """The agent loop's prompts: after each user message and after each tool round."""
    return [i + 1 for i, m in enumerate(msgs)
            if m.role == "user" or (m.role == "tool" and (i + 1 == len(msgs) or msgs[i + 1].role != "tool"))]


def _dump(out: list[Message]) -> list[dict]:
    """What a prompt says, ids included (but a summary message's own, new per filter)."""
    return [{**m.to_openai(), "id": None if "context_edit" in m.metadata else m.id, "meta": m.metadata} for m in out]


def _fresh(f: SummarizingBudgetFilter, fn=summarize) -> SummarizingBudgetFilter:
    return SummarizingBudgetFilter(f.max_tokens, f.counter, summarize=fn, summary_max_tokens=f.summary_max_tokens,
                                   keep_tokens=f.keep_tokens, eviction=f.eviction, chunk=f.chunk_tokens)


def _same_as_fresh(f: SummarizingBudgetFilter, prompt: list[Message], tools, sanitize: bool) -> list[Message]:
    try:
        want = _fresh(f)._trim(prompt, tools, sanitize)
    except ContextBudgetError:
        with pytest.raises(ContextBudgetError):
            f._trim(prompt, tools, sanitize)
        return []
    out, clean = f._trim(prompt, tools, sanitize)
    assert _dump(out) == _dump(want[0]) and clean == want[1]
    assert COUNTER.count_messages(out) + (COUNTER.count_tools(tools) if tools else 0) <= f.max_tokens
    assert_valid_transactions(out)
    return out


@FAST
@given(seed=st.integers(0, 10**6), budget=st.integers(900, 3000), eviction=st.sampled_from(["exact", "chunked"]),
       keep=st.sampled_from([None, None, 600]), data=st.data())
def test_warm_filter_equals_a_fresh_one_on_every_turn(seed, budget, eviction, keep, data):
    """Along a growing history, with now and then an edit in the middle (as clearing does),
    tools that come and go and either sanitize flag, the warm filter's output and clean flag
    equal a fresh filter's; every output is within budget with valid pairing."""
    msgs = _loop(seed, 14)
    f = SummarizingBudgetFilter(budget, COUNTER, summarize=summarize, summary_max_tokens=budget // 8, keep_tokens=keep,
                                eviction=eviction, chunk=budget // 4 if eviction == "chunked" else None)
    for end in _ends(msgs):
        prompt = msgs[:end]
        if data.draw(st.integers(0, 9)) == 0 and end > 3:  # an edit in the middle
            i = data.draw(st.integers(1, end - 1))
            if prompt[i].role in ("user", "system"):
                prompt = prompt[:i] + [prompt[i].model_copy(update={"content": "edited"})] + prompt[i + 1:]
        tools = data.draw(st.sampled_from([None, None, None, TOOLS]))
        _same_as_fresh(f, prompt, tools, data.draw(st.booleans()))


@FAST
@given(seed=st.integers(0, 10**6), budget=st.integers(900, 3000), data=st.data())
def test_compiled_turn_equals_its_twin_and_the_general_path(seed, budget, data):
    """``SummarizingBudgetFilter._trim`` is ``summarizing_trim`` (compiled, or the twin on the
    pure-Python backend): two filters, one driven through the compiled function, one through the
    twin, over the same growing history, twice (sometimes with tools, a failing summarize, or
    a new list): both equal a fresh filter's output and clean flag on every turn, and call
    ``summarize`` as often; a failing summarize gives the plain budget's output."""
    from jianmu_fast import _backend
    from jianmu_fast import _filter_core_py as py
    from jianmu_fast.memory.context import TokenBudgetFilter

    core = pytest.importorskip("jianmu_fast._filter_core")
    msgs = _loop(seed, 12)
    fns = [Counting(fail_on=data.draw(st.sampled_from([-1, -1, 1]))) for _ in range(2)]
    fns[1].fail_on = fns[0].fail_on
    filters = [SummarizingBudgetFilter(budget, COUNTER, summarize=fn, summary_max_tokens=budget // 8,
                                       eviction="chunked", chunk=budget // 4) for fn in fns]
    plain = TokenBudgetFilter(budget, COUNTER, eviction="chunked", chunk=budget // 4)
    lists: list[list[Message]] = [[], []]
    ends = _ends(msgs)
    for k, end in enumerate(ends + ends):  # twice: the second pass replays the history (summaries cached)
        if k == len(ends):
            lists = [[], []]
        tools = data.draw(st.sampled_from([None, None, None, [], TOOLS]))
        if data.draw(st.integers(0, 7)) == 0:
            lists = [list(x) for x in lists]
        outs = []
        for j, (f, mod) in enumerate(zip(filters, (core, py))):
            lists[j].extend(msgs[len(lists[j]):end])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    out = mod.summarizing_trim(f, lists[j], tools, True)
                except ContextBudgetError:
                    out = None
            outs.append(out)
            failed = any(issubclass(w.category, SummaryFailedWarning) for w in caught)
            if out is not None and failed:  # the plain budget's output
                assert _dump(out[0]) == _dump(plain._trim(msgs[:end], tools, True)[0])
        assert (outs[0] is None) == (outs[1] is None)
        if outs[0] is not None:
            assert _dump(outs[0][0]) == _dump(outs[1][0]) and outs[0][1] == outs[1][1]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SummaryFailedWarning)
                want = _fresh(filters[0], Counting(fns[0].fail_on))._trim(msgs[:end], tools, True)
            assert _dump(outs[0][0]) == _dump(want[0]) and outs[0][1] == want[1]
    assert fns[0].calls == fns[1].calls
    assert SummarizingBudgetFilter.__dict__["_trim"] is _backend.summarizing_trim


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "twin"])
def test_a_replayed_moved_cut_is_resumed_in_the_turn_itself(compiled):
    """A moved cut whose summary steps and summary message are cached (a replay of the same
    history) is put in by ``summarizing_trim`` itself (``_moved_summary``: one
    ``Records.fold_step`` call), never through ``_moved``; outputs equal a fresh filter's."""
    from jianmu_fast import _filter_core_py as py

    mod = pytest.importorskip("jianmu_fast._filter_core") if compiled else py
    msgs = _loop(7, 60, size=15)
    fn = Counting()
    f = SummarizingBudgetFilter(3000, COUNTER, summarize=fn, summary_max_tokens=300, eviction="chunked", chunk=750)
    general = [0]

    def counted(*args, _moved=f._moved):
        general[0] += 1
        return _moved(*args)

    f._moved = counted
    per_pass = []
    for _ in range(2):
        src: list[Message] = []
        general[0] = 0
        for end in _ends(msgs):
            src.extend(msgs[len(src):end])
            out = mod.summarizing_trim(f, src, None, True)
            assert _dump(out[0]) == _dump(_fresh(f)._trim(msgs[:end], None, True)[0])
        per_pass.append(general[0])
        calls = fn.calls
    assert per_pass[0] > 3 and per_pass[1] == 0 and fn.calls == calls  # (the restart rebinds the chain: _rebind)


def test_an_unchanged_cut_reuses_the_summary_without_calling_summarize():
    """The hot loop: on every turn whose dropped span did not change, the output holds the
    very summary message of the turn before, and ``summarize`` is called about once per move
    of the chunked cut; every turn equals a fresh filter's."""
    msgs = _loop(7, 80, size=15)
    fn = Counting()
    f = SummarizingBudgetFilter(3000, COUNTER, summarize=fn, summary_max_tokens=300, eviction="chunked", chunk=750)
    prev = None
    reused = moves = 0
    for end in _ends(msgs):
        out = _same_as_fresh(f, msgs[:end], None, True)
        if out and out[1].metadata.get("context_edit", {}).get("kind") == "summary":
            if prev is not None and prev[1].metadata["context_edit"]["messages"] == out[1].metadata["context_edit"]["messages"]:
                assert out[1] is prev[1]
                reused += 1
            else:
                moves += 1
            prev = out
    assert reused > 3 * moves > 0
    assert fn.calls <= 2 * moves


def test_a_failing_summarize_gives_the_plain_budget_on_the_hot_path_too():
    """A span whose summary fails gives the plain budget's prompt with a warning on every
    turn that drops it (nothing remembered from the failed turn); others get their summary."""
    msgs = _loop(3, 40)
    f = SummarizingBudgetFilter(2500, COUNTER, summarize=Counting(fail_on=1), summary_max_tokens=300,
                                eviction="chunked", chunk=600)
    plain_turns = 0
    for end in _ends(msgs):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            out, _ = f._trim(msgs[:end], None, True)
            fresh, _ = _fresh(f, Counting(fail_on=1))._trim(msgs[:end], None, True)
        failed = [w for w in got if issubclass(w.category, SummaryFailedWarning)]
        assert _dump(out) == _dump(fresh)
        if failed:
            assert len(failed) == 2 and not any(m.metadata.get("context_edit") for m in out)  # warm and fresh
            assert len(out) < end
            plain_turns += 1
    assert plain_turns > 0


def test_tools_that_no_longer_fit_raise_after_hot_turns():
    msgs = _loop(5, 30)
    f = SummarizingBudgetFilter(2000, COUNTER, summarize=summarize, summary_max_tokens=200, eviction="chunked", chunk=500)
    for end in _ends(msgs)[-6:]:
        _same_as_fresh(f, msgs[:end], None, True)
    assert f._hot is not None
    with pytest.raises(ContextBudgetError):
        f._trim(msgs, HUGE_TOOLS, True)
    _same_as_fresh(f, msgs, TOOLS, True)


def test_pickled_and_threaded_filters_equal_fresh_ones():
    msgs = _loop(11, 40)
    f = SummarizingBudgetFilter(2500, COUNTER, summarize=summarize, summary_max_tokens=300, eviction="chunked", chunk=600)
    ends = _ends(msgs)
    for end in ends[: len(ends) // 2]:
        f._trim(msgs[:end], None, True)
    g = pickle.loads(pickle.dumps(f))
    assert g._hot is None
    for end in ends[len(ends) // 2:]:
        _same_as_fresh(g, msgs[:end], None, True)
    other = _loop(12, 40)
    errors: list[BaseException] = []

    def run(history: list[Message]) -> None:
        try:
            for end in _ends(history):
                out, _ = f._trim(history[:end], None, True)
                want, _ = _fresh(f)._trim(history[:end], None, True)
                assert _dump(out) == _dump(want)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(h,)) for h in (msgs, other, msgs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_preset_hot_loop_equals_build_batch():
    """``for_react(summarize=)``: the warm builder's prompt on every turn (its hot path) equals
    its general path (``transform`` of the same history, on a copy of the builder) and
    ``build_batch`` over the same states."""
    msgs = _loop(21, 50)
    states = [{"messages": msgs[:end]} for end in _ends(msgs)]
    b = ContextBuilder.for_react(system_prompt="You help.", max_tokens=3000, token_counter=COUNTER,
                                 summarize=summarize)
    cold = pickle.loads(pickle.dumps(b))
    warm = [b.build(s) for s in states]
    assert b._hot is not None
    batch = build_batch(cold, states)
    assert [_dump(p) for p in warm] == [_dump(p) for p in batch]
    assert _dump(warm[-1]) == _dump(pickle.loads(pickle.dumps(b)).build(states[-1]))
    assert sum(1 for p in warm if any(m.metadata.get("context_edit") for m in p)) > len(states) // 2


def test_turns_between_the_inner_budget_and_the_budget_keep_everything():
    """A prompt over the inner budget (``max_tokens - summary_max_tokens``) but within
    ``max_tokens`` is not over: every message is kept, no summary, turn after turn (the hot
    path then follows the plain budget's records); the first turn over it gets the summary."""
    msgs = [system("You help.")] + [human(f"message {i} " * 8) for i in range(80)]
    f = SummarizingBudgetFilter(1000, COUNTER, summarize=summarize, summary_max_tokens=300, eviction="chunked",
                                chunk=250)
    between = 0
    for end in range(2, len(msgs) + 1):
        out = _same_as_fresh(f, msgs[:end], None, True)
        total = COUNTER.count_messages(msgs[:end])
        if total <= 1000:
            assert out == msgs[:end]
            between += total > 700
        else:
            assert out[1].metadata["context_edit"]["kind"] == "summary"
    assert between >= 3


@pytest.mark.parametrize("setting", ["max_tokens", "summary_max_tokens", "keep_tokens"])
def test_changing_a_setting_forgets_the_remembered_turn(setting):
    """The hot path follows a setting changed between turns, as the general path does."""
    msgs = _loop(9, 30)
    ends = _ends(msgs)
    f = SummarizingBudgetFilter(2500, COUNTER, summarize=summarize, summary_max_tokens=300, eviction="chunked", chunk=600)
    for end in ends[:-3]:
        f._trim(msgs[:end], None, True)
    assert f._hot is not None
    setattr(f, setting, {"max_tokens": 2000, "summary_max_tokens": 200, "keep_tokens": 500}[setting])
    assert f._hot is None
    for end in ends[-3:]:
        _same_as_fresh(f, msgs[:end], None, True)
    g = pickle.loads(pickle.dumps(f))
    assert getattr(g, setting) == getattr(f, setting) and g._hot is None


@pytest.mark.parametrize("seed", [5, 11])
def test_behind_stepped_clearing_the_hot_summary_equals_a_fresh_one(seed):
    """Behind a stepped ``ClearToolResultsFilter`` (each step rewrites results in the middle:
    the inner budget's records take the cleared copies in place, a new ``Records.version``),
    every turn equals a fresh filter's; a moved cut between steps resumes the rolling summary
    off the inner records (no copy of the dropped span), and a step starts it over."""
    from jianmu_fast.memory.context import ClearToolResultsFilter

    msgs = _loop(seed, 70, size=15)
    clear = ClearToolResultsFilter(2600, COUNTER, keep=2, clear_at_least=600)
    f = SummarizingBudgetFilter(3000, COUNTER, summarize=summarize, summary_max_tokens=300, eviction="chunked", chunk=600)
    src: list[Message] = []
    resumed = 0
    for end in _ends(msgs):
        src.extend(msgs[len(src):end])
        prompt = clear._hot_apply(src, None)
        chain = f._chain
        out = _same_as_fresh(f, prompt, None, True)
        if out and f._hot is not None and f._chain is not chain and f._chain[0] is None:
            assert f._chain[1] is f._hot[1]  # read off the inner records, which it keeps
            resumed += 1
    assert resumed > 3 and any(m.content == "[cleared]" for m in prompt)


# -- the per-message content digest (what the summary cache keys a span by) ---------------------------

CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{\"x\": 1}"}}


def _variants() -> list[Message]:
    """Messages that each differ from the first in exactly one sent field (or its shape)."""
    return [
        Message(role="tool", content="abc", tool_call_id="c1"),
        Message(role="user", content="abc", tool_call_id="c1"),  # role
        Message(role="tool", content="abd", tool_call_id="c1"),  # content
        Message(role="tool", content="abc", tool_call_id="c2"),  # tool_call_id
        Message(role="tool", content="abc"),  # tool_call_id missing
        Message(role="tool", content="abc", tool_call_id="c1", name="calc"),  # name
        Message(role="tool", content="abc", tool_call_id="c1", name=""),  # empty name is not no name
        Message(role="tool", content=[{"type": "text", "text": "abc"}], tool_call_id="c1"),  # str vs blocks
        Message(role="tool", content="", tool_call_id="c1"),  # empty text is not no content
        Message(role="tool", content=None, tool_call_id="c1"),
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[CALL]),  # tool_calls
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[]),
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[CALL, CALL]),  # the usual shape: strings
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[{**CALL, "id": "c2"}]),
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[{**CALL, "type": "x"}]),
        Message(role="tool", content="abc", tool_call_id="c1",
                tool_calls=[{**CALL, "function": {"name": "calc", "arguments": "{}"}}]),
        Message(role="tool", content="abc", tool_call_id="c1",
                tool_calls=[{**CALL, "function": {"name": "calcx", "arguments": "\"x\": 1}"}}]),  # shifted text
        Message(role="tool", content="abc", tool_call_id="c1", tool_calls=[{**CALL, "z": 1}]),  # another shape: JSON
        Message(role="tool", content="abc", tool_call_id="c1", extra={"refusal": "no"}),  # extra
        # shifting text between adjacent fields never collides (length prefixes)
        Message(role="tool", content="c1abc", tool_call_id=""),
        Message(role="tool", content="abc", tool_call_id="c1", name="N"),
        Message(role="tool", content="\ud800abc", tool_call_id="c1"),  # a lone surrogate hashes (surrogatepass)
    ]


def test_message_digest_differs_in_any_one_field():
    from jianmu_fast.memory.context.editing.summarizing import message_digest
    ms = _variants()
    digests = [message_digest(m) for m in ms]
    assert all(len(d) == 32 for d in digests)
    assert len(set(digests)) == len(ms), [m.to_openai() for m, d in zip(ms, digests) if digests.count(d) > 1]


def test_message_digest_equal_messages_equal_digests():
    from jianmu_fast.memory.context.editing.summarizing import message_digest
    for m in _variants():
        again = Message.model_validate(m.model_dump())  # an equal message, a new object and id
        assert again is not m and message_digest(again) == message_digest(m)
        # metadata and the local id are never sent: they do not change the digest
        assert message_digest(m.model_copy(update={"metadata": {"k": 1}, "id": "x" * 32})) == message_digest(m)
    # the text fast path and the general encoding agree (a str subclass takes the general one)
    class Text(str):
        pass
    assert message_digest(human(Text("hi"))) == message_digest(human("hi"))
    blocks = [{"type": "text", "text": "a", "z": 1, "b": [1, 2]}]
    assert message_digest(human(blocks)) == message_digest(human([dict(reversed(list(blocks[0].items())))]))
    # tool calls: key order does not matter in either encoding
    flipped = {"function": {"arguments": CALL["function"]["arguments"], "name": "calc"}, "type": "function", "id": "c1"}
    for extra in ({}, {"z": 1}):
        assert message_digest(ai(None, tool_calls=[{**CALL, **extra}])) == message_digest(ai(None, tool_calls=[{**flipped, **extra}]))


_CALLS = st.one_of(st.none(), st.lists(st.fixed_dictionaries(
    {"id": st.text(max_size=3), "type": st.sampled_from(["function", "f"]),
     "function": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=3), "arguments": st.text(max_size=4)})},
    optional={"z": st.integers(0, 1)}), max_size=2))


@FAST
@given(st.lists(st.tuples(st.sampled_from(["assistant", "tool"]), st.one_of(st.none(), st.text(max_size=3)), _CALLS),
                min_size=2, max_size=2))
def test_message_digest_injective_with_tool_calls(pair):
    from jianmu_fast.memory.context.editing.summarizing import message_digest
    a, b = (Message(role=r, content=c, tool_calls=calls) for r, c, calls in pair)
    assert (message_digest(a) == message_digest(b)) == (a.to_openai() == b.to_openai())


@FAST
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.text(max_size=6),
                          st.one_of(st.none(), st.text(max_size=3)), st.one_of(st.none(), st.text(max_size=3))),
                min_size=2, max_size=2))
def test_message_digest_injective(pair):
    from jianmu_fast.memory.context.editing.summarizing import message_digest
    a, b = (Message(role=r, content=c, name=n, tool_call_id=t) for r, c, n, t in pair)
    assert (message_digest(a) == message_digest(b)) == (a.to_openai() == b.to_openai())
