"""``jianmu_fast.integrations.langchain.trim_messages`` on LangChain's own test cases.

The cases in ``LC_CASES`` are taken from langchain-core's test suite,
``libs/core/tests/unit_tests/messages/test_utils.py`` in langchain-ai/langchain (the
``test_trim_messages_*`` tests; LangChain is MIT-licensed, Copyright (c) LangChain, Inc.),
restated here as data: the same inputs, counters, arguments and expected outputs. None of
them relies on the orphaning bug (langchain#33245), so every one is asserted unchanged,
against LangChain's own result too. The cases after them add tool calls, where the outputs
differ on purpose:

==============================================  =======================  ======================
case (``strategy="last"`` unless said)          LangChain                jianmu_fast
==============================================  =======================  ======================
budget cuts between the call and its result     orphan ``ToolMessage``   the whole transaction
                                                first (invalid request)  goes
``start_on="human"``, same cut                  valid (drops the orphan) same output
``end_on="ai"`` on ``[.., ai(call), tool, h]``  ends on the unanswered   ends on the previous
(pops single messages)                          ``ai(call)`` (invalid)   unit
parallel calls, budget fits one result          one result of two        whole transaction or
                                                (invalid)                none
``allow_partial`` with a tool result next       cuts the tool result,    no partial message
                                                keeps it without call
``include_system``, system over budget          returns it (over budget)  ``ContextBudgetError``
broken newest transaction in the input          passes it through        ``ToolCallHistoryError``
==============================================  =======================  ======================
"""

from __future__ import annotations

import pytest
from langchain_core.language_models.fake_chat_models import FakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages import trim_messages as lc_trim
from langchain_core.messages.utils import count_tokens_approximately

from jianmu_fast.errors import ContextBudgetError, ToolCallHistoryError
from jianmu_fast.integrations.langchain import trim_messages
from jianmu_fast.memory.context import SimpleTokenCounter, TiktokenTokenCounter

# -- LangChain's cases (see the module docstring for the source) ------------------------------

TEXT = "This is a 4 token text."
TRIM_INPUT = [
    SystemMessage(TEXT),
    HumanMessage(TEXT, id="first"),
    AIMessage([{"type": "text", "text": "This is the FIRST 4 token block."},
               {"type": "text", "text": "This is the SECOND 4 token block."}], id="second"),
    HumanMessage(TEXT, id="third"),
    AIMessage(TEXT, id="fourth"),
]
SECOND_ONLY = AIMessage([{"type": "text", "text": "This is the SECOND 4 token block."}], id="second")
FIRST_ONLY = AIMessage([{"type": "text", "text": "This is the FIRST 4 token block."}], id="second")


def ten_per_message(messages: list[BaseMessage]) -> int:
    """LangChain's dummy counter: 3 + 4 + 3 per string message, 3 + 4 per block + 3 per list."""
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += 10
        elif isinstance(m.content, list):
            total += 6 + 4 * len(m.content)
    return total


def count_words(messages: list[BaseMessage]) -> int:
    total = 0
    for m in messages:
        text = m.content if isinstance(m.content, str) else " ".join(b["text"] for b in m.content)
        total += len(text.split(" "))
    return total


def split_on_space(text: str) -> list[str]:
    parts = text.split(" ")
    return [p + " " for p in parts[:-1]] + parts[-1:]


def count_chars(messages: list[BaseMessage]) -> int:
    return sum(len(m.content) if isinstance(m.content, str) else 0 for m in messages)


def count_text_len(messages: list[BaseMessage]) -> int:
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += len(m.content)
        else:
            total += sum(len(b["text"]) for b in m.content if isinstance(b, dict) and b.get("type") == "text")
    return total


T = TRIM_INPUT
FUNKY = [HumanMessage("This is a funky text.", id="third")]
LC_CASES = {
    "first_30": (T, dict(max_tokens=30, token_counter=ten_per_message, strategy="first"), T[:2]),
    "first_30_allow_partial": (T, dict(max_tokens=30, token_counter=ten_per_message, strategy="first",
                                       allow_partial=True), [*T[:2], FIRST_ONLY]),
    "first_30_allow_partial_end_on_human": (T, dict(max_tokens=30, token_counter=ten_per_message, strategy="first",
                                                    allow_partial=True, end_on="human"), T[:2]),
    "last_30_include_system": (T, dict(max_tokens=30, include_system=True, token_counter=ten_per_message),
                               [T[0], T[3], T[4]]),
    "last_40_include_system_allow_partial": (T, dict(max_tokens=40, token_counter=ten_per_message,
                                                     allow_partial=True, include_system=True),
                                             [T[0], SECOND_ONLY, T[3], T[4]]),
    "last_30_include_system_allow_partial_end_on_human": (
        T, dict(max_tokens=30, token_counter=ten_per_message, allow_partial=True, include_system=True,
                end_on="human"), [T[0], SECOND_ONLY, T[3]]),
    "last_30_include_system_allow_partial_start_on_human": (
        T, dict(max_tokens=30, token_counter=ten_per_message, allow_partial=True, include_system=True,
                start_on="human"), [T[0], T[3], T[4]]),
    "allow_partial_one_message": (FUNKY, dict(max_tokens=2, token_counter=count_chars, text_splitter=list,
                                              strategy="first", allow_partial=True), [HumanMessage("Th", id="third")]),
    "last_allow_partial_one_message": (FUNKY, dict(max_tokens=2, token_counter=count_chars, text_splitter=list,
                                                   allow_partial=True), [HumanMessage("t.", id="third")]),
    "allow_partial_text_splitter": (T, dict(max_tokens=10, token_counter=count_words, allow_partial=True,
                                            text_splitter=split_on_space),
                                    [HumanMessage("a 4 token text.", id="third"), T[4]]),
    "partial_text_splitting": ([HumanMessage("This is a long message that needs trimming")],
                               dict(max_tokens=10, token_counter=count_chars, strategy="first", allow_partial=True,
                                    text_splitter=list), [HumanMessage("This is a ")]),
    "mixed_content_with_partial": (
        [AIMessage([{"type": "text", "text": "First part of text."},
                    {"type": "text", "text": "Second part that should be trimmed."}])],
        dict(max_tokens=20, token_counter=count_text_len, strategy="first", allow_partial=True),
        [AIMessage([{"type": "text", "text": "First part of text."}])]),
    "exact_token_boundary_10": ([SystemMessage("10 tokens exactly."), HumanMessage("Another 10 tokens.")],
                                dict(max_tokens=10, token_counter=ten_per_message, strategy="first"),
                                [SystemMessage("10 tokens exactly.")]),
    "exact_token_boundary_20": ([SystemMessage("10 tokens exactly."), HumanMessage("Another 10 tokens.")],
                                dict(max_tokens=20, token_counter=ten_per_message, strategy="first"),
                                [SystemMessage("10 tokens exactly."), HumanMessage("Another 10 tokens.")]),
    "start_on_with_allow_partial": (
        [HumanMessage("First human message"), AIMessage("AI response"), HumanMessage("Second human message")],
        dict(max_tokens=20, token_counter=ten_per_message, allow_partial=True, start_on="human"),
        [HumanMessage("Second human message")]),
}


@pytest.mark.parametrize("name", sorted(LC_CASES))
def test_langchain_case(name):
    messages, kwargs, expected = LC_CASES[name]
    before = [m.model_copy(deep=True) for m in messages]
    assert trim_messages(messages, **kwargs) == expected
    assert lc_trim(messages, **kwargs) == expected  # the case is LangChain's own expectation
    assert messages == before  # the input is never mutated


def test_runnable_form_and_empty_input():
    assert trim_messages(max_tokens=10, token_counter=ten_per_message, include_system=True).invoke([]) == []
    runnable = trim_messages(max_tokens=10, token_counter=ten_per_message)
    assert runnable.invoke(T) == trim_messages(T, max_tokens=10, token_counter=ten_per_message) == [T[4]]


class TenPerMessageModel(FakeChatModel):
    def get_num_tokens_from_messages(self, messages, tools=None) -> int:
        return ten_per_message(messages)


def test_model_token_counter_bound():
    trimmer = trim_messages(max_tokens=10, token_counter=TenPerMessageModel().bind(foo="bar"))
    assert trimmer.invoke([HumanMessage("foobar")]) == [HumanMessage("foobar")]


def test_bad_token_counter_same_error_as_langchain():
    msg = ("'token_counter' expected to be a model that implements 'get_num_tokens_from_messages()' or a "
           "function. Received object of type <class 'dict'>.")
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        trim_messages([HumanMessage("foobar")], max_tokens=10, token_counter={})


def test_approximate_shortcut_and_invalid_shortcut():
    messages = [SystemMessage("This is a test message"), HumanMessage("Another test message", id="first"),
                AIMessage("AI response here", id="second")]
    ours = trim_messages(messages, max_tokens=50, token_counter="approximate")
    assert ours == trim_messages(messages, max_tokens=50, token_counter=count_tokens_approximately)
    assert ours == lc_trim(messages, max_tokens=50, token_counter="approximate")
    with pytest.raises(ValueError, match="Invalid token_counter shortcut 'invalid'"):
        trim_messages(messages, max_tokens=50, token_counter="invalid")


def test_argument_errors_match_langchain():
    with pytest.raises(ValueError, match="start_on parameter is only valid with strategy='last'"):
        trim_messages(T, max_tokens=10, strategy="first", start_on="human")
    with pytest.raises(ValueError, match="include_system parameter is only valid"):
        trim_messages(T, max_tokens=10, strategy="first", include_system=True)
    with pytest.raises(ValueError, match="Unrecognized strategy"):
        trim_messages(T, max_tokens=10, strategy="middle")


# -- tool calls: where LangChain's output is an invalid request ---------------------------------


def call(cid: str, q: str = "weather in Paris, Lyon and Nice " * 4) -> dict:
    return {"name": "search", "args": {"q": q}, "id": cid}


def valid(out: list[BaseMessage]) -> bool:
    """Every ToolMessage answers a call of the AIMessage opening its run, and every call is answered."""
    i = 0
    while i < len(out):
        m = out[i]
        j = i + 1
        while j < len(out) and out[j].type == "tool":
            j += 1
        if m.type == "tool":
            return False
        calls = {c["id"] for c in getattr(m, "tool_calls", None) or ()}
        if calls != {r.tool_call_id for r in out[i + 1:j]} or len(calls) != j - i - 1:
            return False
        i = j
    return True


HISTORY = [SystemMessage("Be brief."), HumanMessage("Weather?", id="h1"),
           AIMessage("", tool_calls=[call("c1")], id="a1"), ToolMessage("Sunny.", tool_call_id="c1", id="t1"),
           HumanMessage("Thanks!", id="h2")]


def test_cut_between_call_and_result():
    lc = lc_trim(HISTORY, max_tokens=60, include_system=True, token_counter="approximate")
    ours = trim_messages(HISTORY, max_tokens=60, include_system=True, token_counter="approximate")
    assert [m.id for m in lc] == [None, "t1", "h2"] and not valid(lc)
    assert [m.id for m in ours] == [None, "h2"] and valid(ours)


def test_start_on_human_hides_the_bug_here_and_we_agree():
    kw = dict(max_tokens=60, include_system=True, token_counter="approximate", start_on="human")
    assert trim_messages(HISTORY, **kw) == lc_trim(HISTORY, **kw) == [HISTORY[0], HISTORY[4]]


def test_end_on_never_leaves_an_unanswered_call():
    kw = dict(max_tokens=1000, token_counter="approximate", end_on="ai")
    history = [HumanMessage("q", id="h0"), AIMessage("a", id="a0"), *HISTORY[1:]]
    lc = lc_trim(history, **kw)
    assert lc[-1].id == "a1" and not valid(lc)
    assert trim_messages(history, **kw) == history[:2]


def test_parallel_calls_are_kept_or_dropped_together():
    ai_msg = AIMessage("", tool_calls=[call("p1", "a"), call("p2", "b")], id="ap")
    history = [HumanMessage("two lookups", id="h"), ai_msg,
               ToolMessage("x" * 200, tool_call_id="p1", id="r1"), ToolMessage("y", tool_call_id="p2", id="r2")]
    kw = dict(max_tokens=30, token_counter="approximate")
    lc = lc_trim(history, **kw)
    assert [m.id for m in lc] == ["r2"] and not valid(lc)
    assert trim_messages(history, **kw) == []
    assert trim_messages(history, max_tokens=105, token_counter="approximate") == history[1:]  # 42+55+5


def test_allow_partial_never_cuts_a_transaction():
    history = [HumanMessage("q"), AIMessage("", tool_calls=[call("c1")], id="a"),
               ToolMessage("line\n" * 40, tool_call_id="c1", id="t")]
    kw = dict(max_tokens=30, token_counter="approximate", allow_partial=True)
    lc = lc_trim(history, **kw)
    assert [m.id for m in lc] == ["t"] and not valid(lc)
    assert trim_messages(history, **kw) == []


def test_system_over_budget_raises():
    with pytest.raises(ContextBudgetError, match=r"messages\[0\]"):
        trim_messages([SystemMessage("x" * 400), HumanMessage("hi")], max_tokens=20, include_system=True,
                      token_counter=SimpleTokenCounter())


def test_broken_newest_transaction_raises_and_historical_is_left_out():
    with pytest.raises(ToolCallHistoryError, match=r"messages\[1\] \(AIMessage"):
        trim_messages([HumanMessage("q"), AIMessage("", tool_calls=[call("c9")])], max_tokens=1000)
    orphan = [HumanMessage("q", id="q"), ToolMessage("stray", tool_call_id="zz", id="s"), HumanMessage("r", id="r")]
    assert [m.id for m in trim_messages(orphan, max_tokens=1000)] == ["q", "r"]


@pytest.mark.parametrize("counter", ["o200k_base", "gpt-4o", TiktokenTokenCounter("o200k_base")])
def test_our_counters_keep_the_whole_output_within_budget(counter):
    c = TiktokenTokenCounter("o200k_base")
    from jianmu_fast.integrations.langchain import from_langchain

    history = HISTORY * 1  # one conversation, unique objects are not needed
    for budget in range(10, 120, 7):
        out = trim_messages(history, max_tokens=budget, token_counter=counter, include_system=True)
        assert valid(out)
        assert c.count_messages(from_langchain(out)) <= budget
        # and it is the longest valid suffix: one more unit would not fit
        assert out == trim_messages(history, max_tokens=budget, token_counter=c, include_system=True)


def test_per_message_counter_is_called_per_message():
    seen = []

    def per_message(m: BaseMessage) -> int:
        seen.append(m.id)
        return 1

    out = trim_messages(HISTORY, max_tokens=2, token_counter=per_message)
    assert [m.id for m in out] == ["h2"]  # the call unit (2 messages) does not fit beside it
    assert seen == ["h2", "a1", "t1"]  # the tail walk stops at the first unit that does not fit
