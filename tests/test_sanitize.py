"""sanitize_tool_call_history: adjacency matching, drops, tail errors, id filling, fuzzing."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import JianmuError, ToolCallHistoryError
from jianmu_fast.memory.context import ContextBuilder, MaxMessagesFilter, StaticPromptProvider
from jianmu_fast.message import (
    Message,
    ai,
    human,
    sanitize_tool_call_history,
    sanitize_tool_call_history_report,
    system,
    tool,
)

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))


def call(cid, name="calc", args="{}"):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        c["id"] = cid
    return c


def assert_api_valid(out):
    """No orphan result, no unanswered call, no call without id, no duplicate."""
    i, n = 0, len(out)
    while i < n:
        m = out[i]
        assert m.role != "tool", f"orphan tool result at output[{i}]"
        j = i + 1
        if m.role == "assistant" and m.tool_calls:
            ids = [c.get("id") for c in m.tool_calls]
            assert all(ids), f"call without id at output[{i}]"
            assert len(set(ids)) == len(ids), f"duplicate call ids at output[{i}]"
            while j < n and out[j].role == "tool":
                j += 1
            rids = [r.tool_call_id for r in out[i + 1 : j]]
            assert sorted(rids) == sorted(ids), f"output[{i}] calls {ids} answered by {rids}"
        i = j


# -- fixed cases ------------------------------------------------------------------------------


def test_valid_history_keeps_the_same_objects_in_a_new_list():
    h = [system("s"), human("q"), ai("x", tool_calls=[call("c1"), call("c2")]),
         tool("2", tool_call_id="c2"), tool("1", tool_call_id="c1"), ai("done")]
    out = sanitize_tool_call_history(h)
    assert out is not h
    assert len(out) == len(h) and all(a is b for a, b in zip(out, h))
    r = sanitize_tool_call_history_report(h)
    assert not r.changed and r.dropped == [] and r.filled == []


def test_reused_call_id_in_two_transactions_is_valid():
    h = [human("a"), ai(None, tool_calls=[call("call_0")]), tool("1", tool_call_id="call_0"),
         human("b"), ai(None, tool_calls=[call("call_0")]), tool("2", tool_call_id="call_0"), ai("ok")]
    assert all(a is b for a, b in zip(sanitize_tool_call_history(h), h))


def test_historical_unanswered_call_drops_the_whole_transaction_with_its_text():
    h = [human("q"), ai("I will check", tool_calls=[call("c1"), call("c2")]),
         tool("1", tool_call_id="c1"), human("hello?"), ai("hi")]
    r = sanitize_tool_call_history_report(h)
    assert [m.content for m in r.messages] == ["q", "hello?", "hi"]
    assert r.dropped_indices == [1, 2]
    assert r.dropped[0].call_ids == ("c1", "c2")
    assert r.dropped[0].reason == "call(s) ['c2'] have no result"


def test_historical_orphan_and_extra_and_duplicate_results_are_dropped():
    h = [human("q"), tool("stray", tool_call_id="x"),                       # orphan run
         ai(None, tool_calls=[call("c1")]), tool("1", tool_call_id="c1"), tool("9", tool_call_id="c9"),  # extra
         ai(None, tool_calls=[call("d1")]), tool("1", tool_call_id="d1"), tool("1", tool_call_id="d1"),  # dup
         human("next"), ai("fine")]
    r = sanitize_tool_call_history_report(h)
    assert [m.content for m in r.messages] == ["q", "next", "fine"]
    assert [d.indices for d in r.dropped] == [(1,), (2, 3, 4), (5, 6, 7)]
    assert "follow no assistant tool-call message" in r.dropped[0].reason
    assert "['c9'] answer no call" in r.dropped[1].reason
    assert "duplicated result(s) for ['d1']" in r.dropped[2].reason
    assert_api_valid(r.messages)


def test_broken_tail_raises_naming_index_role_and_ids():
    h = [system("s"), human("q"), ai(None, tool_calls=[call("c1"), call("c2")]), tool("1", tool_call_id="c1")]
    with pytest.raises(ToolCallHistoryError) as ei:
        sanitize_tool_call_history(h)
    msg = str(ei.value)
    assert msg.startswith("messages[2] (role='assistant', tool_call ids=['c1', 'c2'])")
    assert "call(s) ['c2'] have no result" in msg and "append one role='tool' message" in msg
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, JianmuError)
    e = pickle.loads(pickle.dumps(ei.value))  # batch workers send errors across processes
    assert (e.index, e.role, e.call_ids, e.reason) == (2, "assistant", ("c1", "c2"), "call(s) ['c2'] have no result")
    assert str(e) == msg


def test_orphan_tool_run_at_the_tail_raises():
    with pytest.raises(ToolCallHistoryError, match=r"^messages\[1\] \(role='tool', tool_call_id='zz'"):
        sanitize_tool_call_history([human("q"), tool("r", tool_call_id="zz")])


def test_broken_unit_followed_only_by_system_messages_is_still_the_tail():
    h = [human("q"), ai(None, tool_calls=[call("c1")]), system("Current time: noon")]
    with pytest.raises(ToolCallHistoryError, match=r"messages\[1\]"):
        sanitize_tool_call_history(h)
    r = sanitize_tool_call_history_report(h, on_broken_tail="drop")
    assert [m.content for m in r.messages] == ["q", "Current time: noon"]


def test_missing_call_id_is_filled_from_its_only_result():
    a = ai("x", tool_calls=[call(None), call("c2", name="search")])
    h = [human("q"), a, tool("1", tool_call_id="c1"), tool("2", tool_call_id="c2"), ai("ok")]
    r = sanitize_tool_call_history_report(h)
    out = r.messages
    assert out[1] is not a and out[1].id == a.id and out[1].content == "x"
    assert [c["id"] for c in out[1].tool_calls] == ["c1", "c2"]
    assert a.tool_calls[0].get("id") is None  # the stored message is untouched
    assert [(f.index, f.call_index, f.tool_call_id) for f in r.filled] == [(1, 0, "c1")]
    assert out[2] is h[2] and out[4] is h[4]
    assert_api_valid(out)


def test_missing_ids_are_filled_by_matching_tool_names():
    a = ai(None, tool_calls=[call(None, name="calc"), call(None, name="search")])
    h = [a, tool("s", name="search", tool_call_id="s1"), tool("c", name="calc", tool_call_id="k1"), human("?")]
    out = sanitize_tool_call_history(h)
    assert [c["id"] for c in out[0].tool_calls] == ["k1", "s1"]


def test_ambiguous_missing_ids_are_not_guessed():
    h = [ai(None, tool_calls=[call(None), call(None)]), tool("1", tool_call_id="a"), tool("2", tool_call_id="b"),
         human("next")]
    r = sanitize_tool_call_history_report(h)
    assert [m.content for m in r.messages] == ["next"] and r.filled == []
    assert "2 call(s) without id" in r.dropped[0].reason


def test_single_missing_id_with_a_contradicting_result_name_is_not_filled():
    h = [ai(None, tool_calls=[call(None, name="calc")]), tool("1", name="search", tool_call_id="a"), human("n")]
    assert [m.content for m in sanitize_tool_call_history(h)] == ["n"]


def test_dict_input_is_coerced_and_bad_dict_names_its_index():
    out = sanitize_tool_call_history([{"role": "user", "content": "hi"}])
    assert isinstance(out[0], Message) and out[0].content == "hi"
    with pytest.raises(JianmuError, match=r"messages\[1\]\.role"):
        sanitize_tool_call_history([human("a"), {"role": "robot"}])


def test_drops_are_logged_at_warning_and_fills_at_info(caplog):
    caplog.set_level(logging.INFO, logger="jianmu_fast.message")
    sanitize_tool_call_history([ai(None, tool_calls=[call(None)]), tool("1", tool_call_id="c1"),
                                tool("x", tool_call_id="q"), human("n")])
    sanitize_tool_call_history([ai(None, tool_calls=[call(None)]), tool("1", tool_call_id="c1"), human("n")])
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "jianmu_fast.message"]
    assert levels[0][0] == logging.WARNING and "dropped 1 broken tool-call unit" in levels[0][1]
    assert levels[1][0] == logging.INFO and "tool_calls[0].id='c1'" in levels[1][1]


def test_report_rejects_bad_arguments():
    with pytest.raises(ValueError, match="on_broken_tail"):
        sanitize_tool_call_history_report([], on_broken_tail="ignore")
    with pytest.raises(TypeError, match="expected a list of messages, got dict"):
        sanitize_tool_call_history({"role": "user"})


# -- the builder ------------------------------------------------------------------------------


class _History:
    def get_messages(self, local_state, global_state=None, ctx=None):
        return local_state["h"]


def test_builder_sanitizes_last_and_tail_error_propagates():
    b = ContextBuilder(providers=[StaticPromptProvider("sys"), _History()], filters=[MaxMessagesFilter(10)])
    h = [human("q"), ai(None, tool_calls=[call("c1")]), human("again"), ai("ok")]
    assert [m.content for m in b.build({"h": h})] == ["sys", "q", "again", "ok"]
    with pytest.raises(ToolCallHistoryError, match=r"messages\[2\] \(role='assistant'"):
        b.build({"h": h[:2]})  # index counts the system prompt of the built request
    assert [m.content for m in ContextBuilder([_History()], sanitize=False).build({"h": h[:2]})] == ["q", None]


# -- fuzzing ----------------------------------------------------------------------------------

_IDS = ["c0", "c1", "c2", None]


@st.composite
def histories(draw):
    """Random roles; transactions with dropped, duplicated, reordered, foreign or id-less
    results; missing and reused call ids; stray tool messages."""
    out = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "system", "tx", "tx", "stray"]))
        if kind == "user":
            out.append(human("u"))
        elif kind == "assistant":
            out.append(ai("a"))
        elif kind == "system":
            out.append(system("s"))
        elif kind == "stray":
            out.append(tool("t", tool_call_id=draw(st.sampled_from(_IDS))))
        else:
            names = ["calc", "search", "read"]
            calls = [call(draw(st.sampled_from(_IDS)), draw(st.sampled_from(names)))
                     for _ in range(draw(st.integers(1, 3)))]
            out.append(ai(draw(st.sampled_from([None, "plan"])), tool_calls=calls))
            results = []
            for c in calls:
                cid = c.get("id") or draw(st.sampled_from(["c0", "c1", "c9"]))
                r = dict(tool_call_id=cid, name=draw(st.sampled_from([None, c["function"]["name"]])))
                copies = draw(st.sampled_from([1, 1, 1, 0, 2]))
                results.extend([r] * copies)
            if draw(st.booleans()):
                results.append(dict(tool_call_id=draw(st.sampled_from(_IDS)), name=None))
            results = draw(st.permutations(results))
            out.extend(tool("r", **{k: v for k, v in r.items() if v is not None}) for r in results)
    return out


def _plain(m):
    return m.role != "tool" and not (m.role == "assistant" and m.tool_calls)


@given(h=histories())
@settings(deadline=None, max_examples=MAX_EXAMPLES)
def test_fuzzed_histories_come_out_valid_or_raise_for_the_tail(h):
    try:
        out = sanitize_tool_call_history(h)
    except ToolCallHistoryError as exc:
        idx = int(str(exc).split("]")[0].removeprefix("messages["))
        head = h[idx]
        assert head.role == "tool" or (head.role == "assistant" and head.tool_calls)
        j = idx + 1
        while j < len(h) and h[j].role == "tool":
            j += 1
        assert all(m.role == "system" for m in h[j:]), "raised for a unit that is not the tail"
        out = sanitize_tool_call_history_report(h, on_broken_tail="drop").messages
    assert_api_valid(out)
    # the output is the input minus whole units (order kept), ids are stable, and no plain
    # message is ever dropped
    pos = {m.id: i for i, m in enumerate(h)}
    idx = [pos[m.id] for m in out]
    assert idx == sorted(idx)
    assert [m.id for m in h if _plain(m)] == [m.id for m in out if _plain(m)]
    assert sanitize_tool_call_history(out) == out  # idempotent
