"""ChatTemplateTokenCounter against transformers' apply_chat_template, on real chat templates.

Every bundled template (tests/data/chat_templates, see PROVENANCE.md) is loaded twice from the
same model folder: by our counter, and by transformers' AutoTokenizer (offline). On random and
real-shaped conversations with tools (parallel calls, reasoning, refusals included) the counts
must be equal; the trimming filters must keep the budget by exact full rendering.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import ContextBudgetError, MessageValidationError, TokenizerLoadError
from jianmu_fast.memory.context import ChatTemplateTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context.chat_template import message_to_template_dict
from jianmu_fast.message import Message

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

_HERE = os.path.join(os.path.dirname(__file__), "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(_HERE, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]

FAMILIES = mk.FAMILIES
#: families whose per-message counts are exact (not only upper bounds) without reasoning
LOCAL = {"qwen3", "hermes", "llama3.1", "mistral", "gpt-oss"}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "top_k": {"type": "integer", "description": "How many results"}},
            "required": ["query"]}}},
]


#: both tokenizing engines run every test below (fastokens only where the [fast] extra is installed)
ENGINES = ["tokenizers"] + (["fastokens"] if importlib.util.find_spec("fastokens") else [])
_REFERENCES: dict[str, object] = {}  # family -> transformers' tokenizer, shared by both engines


class Family:
    def __init__(self, name: str, path: str, engine: str) -> None:
        self.name = name
        self.path = path
        self.engine = engine
        self.counter = ChatTemplateTokenCounter(path, engine=engine)
        assert self.counter.engine_in_use == engine
        if name not in _REFERENCES:
            _REFERENCES[name] = transformers.AutoTokenizer.from_pretrained(path)
        self.hf = _REFERENCES[name]

    def fresh(self) -> ChatTemplateTokenCounter:
        """A new counter on this family's folder, with this engine."""
        return ChatTemplateTokenCounter(self.path, engine=self.engine)

    def reference(self, messages, tools=None):
        """transformers' count, or the exception it raises."""
        dicts = [message_to_template_dict(m) for m in messages]
        try:
            ids = self.hf.apply_chat_template(dicts, tools=tools, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
        except Exception as exc:  # the template refused
            return exc
        return len(ids)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    return {f: mk.model_dir(f, str(tmp_path_factory.mktemp(f))) for f in FAMILIES}


@pytest.fixture(scope="session", params=ENGINES)
def families(request, model_dirs):
    return {f: Family(f, model_dirs[f], request.param) for f in FAMILIES}


@pytest.fixture(params=FAMILIES)
def family(request, families):
    return families[request.param]


# -- conversations --------------------------------------------------------------------------

_words = st.sampled_from([
    "Paris", "weather", "What's the weather in Paris?", "sunny, 21°C", "  padded  ", "line\nbreak",
    "```json\n{\"a\": 1}\n```", "数据", "émoji 🙂", "<tool_call>", "</think>", "x" * 50, "", "1234567",
    "<think>\nhm\n</think>\n\nok",
])
_text = st.one_of(_words, st.text(st.characters(blacklist_categories=("Cs",)), max_size=30))


#: a user's or a tool result's ``name`` (chat-completions participants), odd ones included
_names = st.sampled_from(["alice", "Bob_2", "数据", "a b"])
#: a message's text, empty more often than ``_text`` alone draws it
_content = st.one_of(_text, _text, _text, st.just(""))


def _sometimes(draw, one_in: int) -> bool:
    return draw(st.integers(0, one_in - 1)) == 0


@st.composite
def conversations(draw, parallel: bool = True, reasoning: bool = True, end_on_assistant: bool = True):
    """What real prompts look like: 0-3 system messages first (the presets pin several),
    now and then a system message between units (some builders insert one), users with and
    without ``name``, tool calls (parallel ones where ``parallel``) whose results carry
    ``name`` or not, text-only assistant turns, two in a row at times, empty contents."""
    ms: list[Message] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))):
        ms.append(Message(role="system", content=draw(_content)))
    n_calls = 0
    for turn in range(draw(st.integers(1, 4))):
        if turn and _sometimes(draw, 8):
            ms.append(Message(role="system", content=draw(_content)))
        name = draw(_names) if _sometimes(draw, 4) else None
        ms.append(Message(role="user", content=draw(_content), name=name))
        for _ in range(draw(st.integers(0, 3))):
            k = draw(st.integers(1, 3 if parallel else 1))
            calls, results = [], []
            for _ in range(k):
                n_calls += 1
                name = draw(st.sampled_from(["get_weather", "search"]))
                args = {"city": draw(_text)} if name == "get_weather" else {"query": draw(_text), "top_k": draw(st.integers(1, 9))}
                cid = f"call_{n_calls}"
                calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
                results.append(Message(role="tool", content=draw(_content), tool_call_id=cid,
                                       name=None if _sometimes(draw, 5) else name))
            extra = {"reasoning_content": draw(_text)} if reasoning and draw(st.booleans()) and draw(st.booleans()) else {}
            # text beside the calls ("Let me check."): gpt-oss shows it only while no final answer follows
            text = draw(st.one_of(st.none(), _text)) if draw(st.booleans()) else None
            ms.append(Message(role="assistant", content=text, tool_calls=calls, extra=extra))
            ms.extend(results)
        for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2]))):  # text-only answers, at times two in a row
            extra = {"reasoning_content": draw(_text)} if reasoning and draw(st.booleans()) and draw(st.booleans()) else {}
            ms.append(Message(role="assistant", content=draw(_content), extra=extra))
    if not end_on_assistant and ms[-1].role == "assistant":
        ms.append(Message(role="user", content=draw(_text)))
    return ms


# -- exactness ----------------------------------------------------------------------------------

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(ms=conversations(), with_tools=st.booleans())
def test_counts_equal_transformers(family, ms, with_tools):
    tools = TOOLS if with_tools else None
    ref = family.reference(ms, tools)
    c = family.counter
    if isinstance(ref, Exception):
        with pytest.raises(MessageValidationError, match="chat template refused"):
            c.count_messages(ms) + c.count_tools(tools, ms)
            c.count_request(ms, tools)
        return
    assert c.count_messages(ms) + c.count_tools(tools, ms) == ref
    assert c.count_request(ms, tools) == ref



@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(reasoning=False, end_on_assistant=False), heads=st.lists(_text, min_size=2, max_size=4),
       with_tools=st.booleans())
def test_a_run_of_system_messages_first_counts_exactly(family, ms, heads, with_tools):
    """The builder's presets pin several system messages (persona, protocol, tools, files):
    a conversation opening with a run of them counts exactly, fresh and turn by turn (Llama
    3.1 prints only the first in its header: the first unit's cost is not the plain
    difference with a system stand-in after it)."""
    tools = TOOLS if with_tools else None
    ms = [Message(role="system", content=t) for t in heads] + [m for m in ms if m.role != "system"]
    c = family.fresh()
    for k in range(len(heads) + 1, len(ms) + 1):
        if ms[k - 1].role not in ("user", "tool") or (k < len(ms) and ms[k].role == "tool"):
            continue  # turn boundaries only: a hot loop's calls
        ref = family.reference(ms[:k], tools)
        if isinstance(ref, Exception):
            continue
        assert c.count_messages(ms[:k]) + c.count_tools(tools, ms[:k]) == ref, k
        assert c.count_messages([]) + int(c.count_array(ms[:k]).sum()) >= ref - c.count_tools(tools, ms[:k]), k
    ref = family.reference(ms)
    if not isinstance(ref, Exception):  # a fresh counter, the whole conversation at once
        assert family.fresh().count_messages(ms) == ref

@_SETTINGS
@given(ms=conversations(reasoning=False, end_on_assistant=False))
def test_per_message_counts_add_up(family, ms):
    """count_messages([]) + sum(count_array) is never below the exact count; equal for the
    families whose units do not depend on their neighbours."""
    ref = family.reference(ms)
    if isinstance(ref, Exception):
        return
    c = family.counter
    total = c.count_messages([]) + int(c.count_array(ms).sum())
    assert total >= ref
    # a system message after the first is charged the most it costs over its neighbours, the
    # first place included (gpt-oss prints only a first one; Llama 3.1 folds a first one into
    # its header), and a lone one (count_message) is costed as the first
    if family.name in LOCAL and not _looks_ahead(c, ms) and all(m.role != "system" for m in ms[1:]):
        assert total - ref == c.count_messages([]) - c._end_cost(ms[-1].role)  # exact but for the end cost
        assert c.count_messages([]) + sum(c.count_message(m) for m in ms) >= ref


def test_a_system_message_later_is_charged_its_text_joined_to_the_first(families):
    """DeepSeek-V3 joins every system message's text into its header with "\n\n" between:
    a later one's text follows the first one's, not its stand-in's (whose "." took the "\n\n"
    into its pre-token: charged 1 token under, and the budget filter sent 31 tokens for a
    budget of 30). A system unit is also charged after a stand-in whose text ends on a letter."""
    s, u, a = (lambda text, role=role: Message(role=role, content=text) for role in ("system", "user", "assistant"))
    ms = [s("P"), u(""), s("P"), u(""), a("")]
    fam = families["deepseek-v3"]
    c = fam.fresh()
    assert fam.reference(ms) == c.count_messages(ms) == 16
    assert c.count_array(ms).tolist() == [1, 2, 2, 2, 2] and c.count_messages([]) == 7  # was [1, 2, 1, 2, 2]: 15
    fuzzed = [s("Paris"), s("0:0:0:0\x810ØØ"), u(""), s("Paris"), u(""), a("")]
    assert fam.reference(fuzzed) == 31
    kept = TokenBudgetFilter(max_tokens=30, counter=fam.fresh()).apply(fuzzed)
    assert kept == fuzzed[:2] + fuzzed[3:] and fam.reference(kept) == fam.counter.count_request(kept) == 29
    for f in families.values():
        for conv in (ms, fuzzed, [u("a"), s("Be brief."), u("b")], [s("A."), s("B"), u("c"), s("D"), u("e")]):
            ref = f.reference(conv)
            if not isinstance(ref, Exception):
                assert f.counter.count_messages([]) + int(f.counter.count_array(conv).sum()) >= ref, f.name


def _looks_ahead(counter, ms):
    """Whether a message's cost may depend on what follows it (reasoning, or text the template
    looks ahead for): its per-message count is then an upper bound."""
    return any(counter._lookahead(message_to_template_dict(m)) for m in ms)


def test_text_the_template_looks_ahead_for_is_counted_exactly(families):
    """gpt-oss shows a tool call's text as analysis only while no final answer follows, and
    Qwen3 reads ``</think>`` in an assistant text as reasoning: the self-check finds both.
    Qwen3's calls holding one are rendered whole; gpt-oss's are counted from segments, each
    call costed with a final answer after it where the conversation has one (``_final_rule``,
    found by more probes); both exact, per-message counts stay upper bounds."""
    assert "call_text" not in families["gpt-oss"].counter._sensitive and families["gpt-oss"].counter._final_rule
    assert "think_text" in families["qwen3"].counter._sensitive
    assert not families["hermes"].counter._sensitive
    assert not any(f.counter._final_rule for n, f in families.items() if n != "gpt-oss")

    def call(i, text):
        args = json.dumps({"city": f"c{i}"})
        return Message(role="assistant", content=text, tool_calls=[
            {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}])

    def result(i):
        return Message(role="tool", content=f"r{i}", tool_call_id=f"c{i}", name="get_weather")

    ms = [Message(role="system", content="s"), Message(role="user", content="go"), call(1, "Let me check."),
          result(1), Message(role="user", content="more"), call(2, "Looking."), result(2),
          Message(role="assistant", content="<think>\nhm\n</think>\n\nIt is warm."),
          call(3, "One more."), result(3), Message(role="user", content="thanks")]
    for fam in families.values():
        c = fam.fresh()
        for k in range(1, len(ms) + 1):
            ref = fam.reference(ms[:k])
            if isinstance(ref, Exception):
                continue
            assert c.count_messages(ms[:k]) == ref, (fam.name, k)
            if fam.counter.additive:
                assert c.count_messages([]) + int(c.count_array(ms[:k]).sum()) >= ref, (fam.name, k)


def test_call_text_and_final_answers_count_from_segments_exactly(families, monkeypatch):
    """gpt-oss: a call's text is shown while no final answer follows it, so a final answer
    arriving changes what every earlier call with text costs. A hot loop (calls with text,
    a final answer every few turns, the cut moving) is counted exactly every turn and never
    rendered whole; DeepSeek-V3 (costed before a user stand-in: it closes a tool-output
    block in the next assistant turn) likewise, but for a later system message, which it
    joins to the first one's text. A cut that leaves an answer or a call right after the
    system prompt, whose text DeepSeek-V3 prints with nothing between, is costed after the
    real system prompt (``_real_system_pred``), not rendered whole."""
    for name in ("gpt-oss", "deepseek-v3"):
        fam = families[name]
        c = fam.fresh()
        wholes, expected, cuts = [], [], 0
        full = c._full
        monkeypatch.setattr(c, "_full", lambda *a, **k: wholes.append(len(a[0])) or full(*a, **k))
        # (a system prompt ending in whitespace: DeepSeek-V3's indentation before a text merges with it)
        ms = [Message(role="system", content="You are a weather bot.\n"), Message(role="user", content="Weather?")]
        for i in range(14):
            args = json.dumps({"city": f"Paris {i}"})
            ms.append(Message(role="assistant", content=f"Checking {i}." if i % 2 else "", tool_calls=[
                {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
            ms.append(Message(role="tool", content=f"{20 + i} C", tool_call_id=f"c{i}", name="get_weather"))
            if i % 4 == 3:
                ms += [Message(role="assistant", content=f"It is {20 + i} C."), Message(role="user", content="More?")]
            kept = ms if i < 8 else ms[:1] + ms[2 * (i - 7):]  # the cut moves from the 9th turn on
            if kept[1].role == "tool":
                kept = kept[:1] + kept[2:]
            assert c.count_messages(kept) == fam.reference(kept), (name, i)
            cuts += kept[1].role == "assistant"
        assert wholes == expected == [] and cuts > 3, name
        assert c._real_system_pred == (name == "deepseek-v3")
        later = ms + [Message(role="system", content="Be brief"), Message(role="user", content="Now?")]
        assert c.count_messages(later) == fam.reference(later)
        assert wholes == expected + ([len(later)] if name == "deepseek-v3" else []), name


def test_a_new_final_answer_recosts_only_the_units_after_the_previous_one(families, monkeypatch):
    """gpt-oss: when a final answer arrives, the calls with text since the previous final
    answer cost less (their text is no longer shown); the units before the previous one
    already had a final answer after them and keep their costs. Every turn is counted exactly
    (every call has text: reusing one unit too many is off), and the turn that brings a final
    answer costs no unit of the prompt up to the previous final answer again."""
    fam = families["gpt-oss"]
    c = fam.fresh()
    asked: list = []
    unit_cost = c._unit_cost
    monkeypatch.setattr(c, "_unit_cost", lambda keys, *a, **k: asked.append(keys) or unit_cost(keys, *a, **k))
    ms = [Message(role="system", content="You are a weather bot."), Message(role="user", content="Weather?")]
    finals = 0
    for i in range(16):
        ms.append(Message(role="assistant", content=f"Checking {i} now.", tool_calls=[
            {"id": f"c{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": f"Paris {i}"})}}]))
        ms.append(Message(role="tool", content=f"{20 + i} C", tool_call_id=f"c{i}", name="get_weather"))
        kept = ms if i < 9 else ms[:1] + ms[2 * (i - 8):]  # the cut moves from the 10th turn on
        if kept[1].role == "tool":
            kept = kept[:1] + kept[2:]
        assert c.count_messages(kept) == fam.reference(kept), i
        if i % 3 == 2:
            previous = max(j for j, m in enumerate(kept) if m.role == "assistant" and not m.tool_calls) \
                if finals else 0
            before = {c._entry(m, j)[0] for j, m in enumerate(kept[1:previous], 1)}
            ms += [Message(role="assistant", content=f"It is {20 + i} C."), Message(role="user", content="More?")]
            kept = kept + ms[-2:]
            asked.clear()
            assert c.count_messages(kept) == fam.reference(kept), i
            assert asked and not {k for keys in asked for k in keys} & before, i
            finals += 1
    assert finals == 5


def test_hot_loop_counts_incrementally_and_exactly(family):
    """A growing agent loop: each turn is counted exactly, and the cached units are reused."""
    c = family.fresh()
    ms = [Message(role="system", content="You are a weather bot."), Message(role="user", content="Weather in Paris?")]
    for i in range(12):
        args = json.dumps({"city": f"Paris {i}"})
        ms.append(Message(role="assistant", content=None, tool_calls=[
            {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
        ms.append(Message(role="tool", content=f"{20 + i}°C", tool_call_id=f"c{i}", name="get_weather"))
        assert c.count_messages(ms) == family.reference(ms)
        if i % 3 == 2:
            ms.append(Message(role="assistant", content=f"It is {20 + i}°C."))
            ms.append(Message(role="user", content="And now?"))
            assert c.count_messages(ms) == family.reference(ms)


def test_unit_costs_do_not_depend_on_how_results_arrive(family):
    """A call and its results counted in one batch (the agent loop's turn) get the same
    per-message costs as when the results arrive one by one, and a message whose lists were
    not frozen (``model_construct``) is recounted after an in-place change."""
    def unit(i):
        calls = [{"id": f"c{i}_{k}", "type": "function",
                  "function": {"name": "get_weather", "arguments": json.dumps({"city": f"c{i}{k}"})}}
                 for k in range(1 if family.name == "llama3.1" else 2)]
        return [Message(role="assistant", content=None, tool_calls=calls)] + [
            Message(role="tool", content=f"{k} degrees in c{i}", tool_call_id=c["id"], name="get_weather")
            for k, c in enumerate(calls)]

    head = [Message(role="user", content="Weather?")]
    whole, one_by_one = family.fresh(), family.fresh()
    ms = head + unit(0)
    for j in range(1, len(ms) + 1):
        one_by_one.count_array(ms[:j])
    assert whole.count_array(ms).tolist() == one_by_one.count_array(ms).tolist()
    ref = family.reference(ms)
    if not isinstance(ref, Exception):
        assert whole.count_messages(ms) == ref
    calls = [{"id": "d0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "a"}'}}]
    loose = Message.model_construct(role="assistant", content="", tool_calls=calls, name=None, tool_call_id=None,
                                    extra={})
    loose_ms = head + [loose, Message(role="tool", content="r", tool_call_id="d0", name="get_weather")]
    before = whole.count_messages(loose_ms)
    calls[0]["function"]["arguments"] = '{"city": "a much longer city name than before"}'
    after = whole.count_messages(loose_ms)
    assert after == family.fresh().count_messages(loose_ms)
    assert after > before or family.name == "mistral"  # Mistral's count of it does not change here


def test_reasoning_and_final_assistant_fall_back_exactly(families):
    """Qwen3 strips reasoning before the last user query and gives a final assistant message an
    empty think block: those calls are rendered whole, and stay exact."""
    fam = families["qwen3"]
    c = fam.counter
    ms = [Message(role="user", content="2+2?"),
          Message(role="assistant", content="4", extra={"reasoning_content": "two and two"}),
          Message(role="user", content="and 3+3?"),
          Message(role="assistant", content="6", extra={"reasoning_content": "three and three"})]
    for k in range(1, len(ms) + 1):
        assert c.count_messages(ms[:k]) == fam.reference(ms[:k])
    plain = [Message(role="user", content="hi"), Message(role="assistant", content="hello")]
    assert c.count_messages(plain) == fam.reference(plain)
    rendered = c.render(plain)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n")
    assert "<think>\n\n</think>\n\nhello" in rendered


def test_reasoning_a_template_prints_none_of_is_counted_from_segments(families):
    """Llama 3.1, Mistral, Hermes and DeepSeek-V3 print nothing of an assistant message's
    reasoning (``_reads_reasoning``, probed at construction): it is left out of the message's
    template dict, and an agent loop whose assistant messages carry it (what vLLM's reasoning
    parsers and DeepSeek's API return) is counted from cached segments, not rendered whole --
    exactly. Qwen3 keeps reasoning after the last user query only (``_query_rule``: counted
    from segments too, the units after it costed with no user message after them); gpt-oss
    shows a call's while no final answer follows (``_final_reasoning``: counted from segments
    as a call's text is, each unit costed knowing whether a final answer follows it)."""
    reads = {n for n, f in families.items() if "reasoning" in f.counter._sensitive}
    assert reads == {"qwen3", "gpt-oss"}, reads
    assert families["gpt-oss"].counter._final_reasoning and not families["qwen3"].counter._final_reasoning
    think = {"reasoning_content": "The user wants the weather; call the tool."}
    ms = [Message(role="system", content="You are terse."), Message(role="user", content="Weather in Oslo?")]
    for i in range(4):
        args = json.dumps({"city": f"c{i}"})
        ms.append(Message(role="assistant", content=None, extra=think, tool_calls=[
            {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
        ms.append(Message(role="tool", content=f"r{i}", tool_call_id=f"c{i}", name="get_weather"))
        if i == 1:
            ms.append(Message(role="assistant", content="Sunny.", extra={"thinking": "Answer now."}))
            ms.append(Message(role="user", content="And tomorrow?"))
    for name, fam in families.items():
        c = fam.fresh()
        full = c._full
        whole: list = []
        c._full = lambda *a, **k: whole.append(1) or full(*a, **k)
        for k in range(2, len(ms) + 1):
            if ms[k - 1].role in ("user", "tool"):
                assert c.count_messages(ms[:k]) == fam.reference(ms[:k]), (name, k)
        assert whole == [], (name, len(whole))
        # (where it prints none, the template dict leaves it out: the message is a frame's)
        plain = Message(role="assistant", content="Sunny.")
        d_with, d_without = c._entries([plain.model_copy(update={"extra": think}), plain])[1]
        assert (d_with == d_without) == (name not in reads), name


def test_reasoning_after_the_last_query_is_counted_from_segments(families):
    """Qwen3 prints an assistant's reasoning (stripped of newlines at its ends) only after the
    last user query, and nothing of it before. Under ``_query_rule`` an agent loop whose calls
    carry reasoning is counted from segments, exactly: the units after the last user message
    costed with no user message after them; a new user message strips them (costed again); a
    cut that drops the last user message keeps none; a last user message that is no query to
    the template (a ``<tool_response>`` text) renders whole. The reasoning units are assembled
    from frames, not rendered: their reasoning and text are derived slots (``strip('\\n')``,
    ``lstrip('\\n')``)."""
    fam = families["qwen3"]
    assert fam.counter._query_rule
    assert not any(f.counter._query_rule for n, f in families.items() if n != "qwen3")
    c = fam.fresh()
    full = c._full
    whole: list = []
    c._full = lambda *a, **k: whole.append(1) or full(*a, **k)

    def call(i: int, text=None) -> list:
        args = json.dumps({"city": f"c{i}"})
        return [Message(role="assistant", content=text, extra={"reasoning_content": f"\nStep {i}: look it up.\n"},
                        tool_calls=[{"id": f"c{i}", "type": "function",
                                     "function": {"name": "get_weather", "arguments": args}}]),
                Message(role="tool", content=f"r{i}", tool_call_id=f"c{i}", name="get_weather")]

    ms = [Message(role="system", content="You are terse."), Message(role="user", content="Weather in Oslo?")]
    for i in range(8):
        ms += call(i, "Checking." if i % 3 == 1 else None)
        if i == 3:
            ms.append(Message(role="assistant", content="\n\nSunny.", extra={"reasoning_content": "Answer now."}))
            ms.append(Message(role="user", content="And tomorrow?"))
        assert c.count_messages(ms) == fam.reference(ms), i
    # a cut that keeps the system message and the last three units (no user message left)
    cut = ms[:1] + ms[-6:]
    assert c.count_messages(cut) == fam.reference(cut)
    assert c.count_messages(ms) == fam.reference(ms)
    assert whole == []
    # the reasoning frames were learned once: a new conversation's reasoning units assemble
    rendered = c._frames.stats()["rendered"]
    again = [m.model_copy(update={"extra": {"reasoning_content": f"\n{m.extra['reasoning_content']} more\n"}})
             if m.extra else m for m in ms]
    for k in range(2, len(again) + 1):
        if again[k - 1].role in ("user", "tool"):
            assert c.count_messages(again[:k]) == fam.reference(again[:k]), k
    assert c._frames.stats()["rendered"] == rendered
    assert whole == []
    # a last user message Qwen3 does not take for a query: rendered whole, exactly
    wrapped = ms + [Message(role="user", content="<tool_response>late</tool_response>")]
    assert c.count_messages(wrapped) == fam.reference(wrapped)
    assert whole == [1]
    # a unit counted stripped (a user message after it) is not a local unit of one cost: its
    # charge where it is kept still bounds (the hostile test found it charged as stripped)
    d = fam.fresh()
    unit = call(9)
    d.count_messages([ms[1]] + unit + [Message(role="user", content="z")])
    kept = [ms[1]] + unit
    assert d.count_messages([]) + int(d.count_array(kept).sum()) >= d.count_messages(kept) == fam.reference(kept)


def test_a_unit_pattern_every_neighbour_refuses_is_not_local(families):
    """gpt-oss refuses a call with text beside reasoning; its stand-in of that pattern (text
    and reasoning "r") is refused after every neighbour, and the pattern was taken for local
    (no two costs seen): a real call with text beside empty reasoning, hidden by a later final
    answer, was costed in the smallest context, where no final answer follows (8 tokens over).
    Such a pattern proves nothing and is not local; the count is exact."""
    fam = families["gpt-oss"]
    call = Message(role="assistant", content="Checking.", extra={"reasoning_content": ""}, tool_calls=[
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}])
    ms = [Message(role="user", content="Weather?"), call, Message(role="tool", content="r", tool_call_id="c2"),
          Message(role="assistant", content="ok", extra={"reasoning_content": "\nthink\n"}),
          Message(role="user", content="more")]
    c = fam.fresh()
    assert c.count_messages(ms) == fam.reference(ms)
    assert c.count_messages(ms[1:]) == fam.reference(ms[1:])
    keys, dicts = c._entries(ms[1:3])
    assert not c._is_local(dicts, keys)


@st.composite
def hostile_conversations(draw):
    """``conversations()`` with what templates read as something else: a user text wrapped in
    ``<tool_response>`` (Qwen3 does not count it as a query), contents as block lists (Qwen3
    prints none of them, Llama 3.1 each), ``<think>`` in an assistant's text (Qwen3's
    reasoning)."""
    out = []
    for m in draw(conversations()):
        kind = draw(st.sampled_from(["same", "same", "same", "same", "wrap", "blocks", "think"]))
        if kind == "wrap" and m.role == "user" and isinstance(m.content, str):
            m = m.model_copy(update={"content": f"<tool_response>{m.content}</tool_response>"})
        elif kind == "blocks" and m.role in ("user", "assistant", "tool") and isinstance(m.content, str):
            m = m.model_copy(update={"content": [{"type": "text", "text": m.content}]})
        elif kind == "think" and m.role == "assistant" and not m.extra:
            m = m.model_copy(update={"content": f"<think>\nr\n</think>\n\n{m.content or ''}"})
        out.append(m)
    return out


@_SETTINGS
@given(ms=hostile_conversations())
def test_hostile_conversations_count_exactly_and_charges_bound_every_window(family, ms):
    """Every window a trim can keep (from each user or assistant message on): counted as
    transformers counts it, and its charges sum to at least that."""
    c = family.counter
    for k in range(len(ms)):
        if k and ms[k].role not in ("user", "assistant"):
            continue
        w = ms[k:]
        ref = family.reference(w)
        if isinstance(ref, Exception):
            with pytest.raises(MessageValidationError):
                c.count_messages(w)
            continue
        assert c.count_messages(w) == ref, k
        assert c.count_messages([]) + int(c.count_array(w).sum()) >= ref, k


def test_a_call_text_gpt_oss_cannot_print_is_charged_where_a_final_answer_hides_it(families):
    """gpt-oss prints a call's text (as analysis) only while no final answer follows, by
    concatenating it: a text as content blocks is refused where it is printed and renders where
    a final answer hides it. Its unit's charge between stand-ins with no final answer after was
    refused, and ``count_array`` raised on a conversation transformers renders (the hostile test
    found it); it is charged with a final answer after its successor, as the conversation has."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ms = [Message(role="user", content="Weather?"),
          Message(role="assistant", content=[{"type": "text", "text": "Checking."}], tool_calls=[call]),
          Message(role="tool", content="Sunny", tool_call_id="call_1"),
          Message(role="system", content="Be brief."), Message(role="user", content="And?"),
          Message(role="assistant", content="Sunny.")]
    fam = families["gpt-oss"]
    c = fam.fresh()
    ref = fam.reference(ms)
    assert not isinstance(ref, Exception) and c.count_messages(ms) == ref
    assert c.count_messages([]) + int(c.count_array(ms).sum()) >= ref
    assert isinstance(fam.reference(ms[:3]), Exception)  # no final answer after it: the template refuses
    with pytest.raises(MessageValidationError, match="can only concatenate"):
        c.count_array(ms[:3])


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=hostile_conversations(), budget=st.integers(30, 700), name=st.sampled_from(FAMILIES))
def test_budget_filter_keeps_budget_on_hostile_conversations(families, ms, budget, name):
    fam = families[name]
    kept = _trimmed(fam, ms, budget)
    if kept is not None:
        _kept_within(fam, ms, kept, budget)


def test_reasoning_after_an_assistant_message_is_charged_as_kept(families):
    """A reasoning unit right after an assistant message, no user query after it (Qwen3 counts
    only a string content not wrapped in ``<tool_response>`` as a query): Qwen3 keeps its
    reasoning, 12 tokens. Its charge was costed with nothing after it after an assistant
    stand-in, which then lost its final empty think block (4 tokens): charged 8, and the
    charges summed to 40 for an exact 44 (a random draw of the vLLM-format test found it)."""
    think = Message(role="assistant", content="<think>\nhm\n</think>\n\nok")
    u, a = (lambda content, role=role: Message(role=role, content=content) for role in ("user", "assistant"))
    ms = [u("Paris"), a("Paris"), think, u([{"type": "text", "text": "Paris"}]), a("Paris")]
    fam = families["qwen3"]
    c = fam.fresh()
    assert c.count_messages(ms) == fam.reference(ms) == 44
    assert c.count_array(ms).tolist() == [6, 6, 12, 5, 6] and c.count_messages([]) == 9
    wrapped = [u("Paris"), a("Paris"), think, u("<tool_response>x</tool_response>"), a("Paris")]
    reasoning = Message(role="assistant", content="ok", extra={"reasoning_content": "hm"})
    for f in families.values():
        for conv in (ms, wrapped, ms[:3], [u("q"), a("a"), reasoning, u([{"type": "text", "text": "b"}])]):
            ref = f.reference(conv)
            if not isinstance(ref, Exception):
                assert f.counter.count_messages(conv) == ref, f.name
                assert f.counter.count_messages([]) + int(f.counter.count_array(conv).sum()) >= ref, f.name


def test_render_matches_transformers_text(families):
    ms = [Message(role="system", content="Be brief."), Message(role="user", content="Weather?"),
          Message(role="assistant", content=None, tool_calls=[
              {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]),
          Message(role="tool", content="cold", tool_call_id="c1", name="get_weather")]
    for fam in families.values():
        dicts = [message_to_template_dict(m) for m in ms]
        expected = fam.hf.apply_chat_template(dicts, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert fam.counter.render(ms, TOOLS) == expected, fam.name


def test_template_refusal_carries_its_message(families):
    c = families["llama3.1"].counter
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": "{}"}} for i in range(2)]
    ms = [Message(role="user", content="two things"), Message(role="assistant", content=None, tool_calls=calls),
          Message(role="tool", content="a", tool_call_id="c0"), Message(role="tool", content="b", tool_call_id="c1")]
    with pytest.raises(MessageValidationError, match="only supports single tool-calls at once"):
        c.count_messages(ms)
    with pytest.raises(MessageValidationError, match="only supports single tool-calls at once"):
        c.count_array(ms)
    hermes = families["hermes"].counter
    no_name = [Message(role="user", content="q"), Message(role="tool", content="r", tool_call_id="x")]
    with pytest.raises(MessageValidationError, match="require a 'name' key"):
        hermes.count_messages(no_name)


def test_a_unit_the_template_refuses_to_open_a_conversation_is_charged_where_it_stands(model_dirs):
    """A unit whose cost does not depend on its neighbours is costed opening a conversation
    (the smallest rendering). A template that refuses a conversation opening with an assistant
    message accepts it after a user message: per-message charges come from its real
    neighbours then, and the budget filter keeps an answer after the pinned system prompt."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dirs["qwen3"], "tokenizer.json"))
    tpl = ("{% if messages and messages[0].role not in ('system', 'user') %}"
           "{{ raise_exception('the first message must be a system or user message') }}{% endif %}"
           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    c = ChatTemplateTokenCounter(tok, tpl)
    ms = [Message(role="system", content="Be brief."), Message(role="user", content="hi"),
          Message(role="assistant", content="hello there"), Message(role="user", content="and?")]
    exact = len(tok.encode(c.render(ms), add_special_tokens=False).ids)
    assert c.count_messages(ms) == exact == 31
    assert c.count_array(ms).tolist() == [8, 6, 7, 7] and c.count_messages([]) == 3  # (was: refused)
    kept = TokenBudgetFilter(max_tokens=25, counter=c).apply(ms)
    assert kept == [ms[0], ms[2], ms[3]] and c.count_messages(kept) == 25
    with pytest.raises(MessageValidationError, match="the first message must be a system or user message"):
        c.count_messages(ms[2:])


def test_message_dict_is_what_vllm_passes():
    m = Message(role="assistant", content=None, tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": [2]}'}}],
        extra={"reasoning_content": "why"})
    d = message_to_template_dict(m)
    assert d["content"] == ""
    assert d["tool_calls"][0]["function"]["arguments"] == {"b": 1, "a": [2]}
    assert list(d["tool_calls"][0]["function"]["arguments"]) == ["b", "a"]  # order kept
    assert d["thinking"] == d["reasoning_content"] == "why"
    assert "name" not in d and "tool_call_id" not in d
    bad = Message(role="assistant", content=None, tool_calls=[
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}])
    assert message_to_template_dict(bad)["tool_calls"][0]["function"]["arguments"] == "not json"


def test_bad_input_errors(tmp_path, families):
    import shutil

    with pytest.raises(TokenizerLoadError, match="not a model directory"):
        ChatTemplateTokenCounter(str(tmp_path / "missing"))
    with pytest.raises(TokenizerLoadError, match="no tokenizer.json"):
        ChatTemplateTokenCounter(str(tmp_path))
    d = str(tmp_path / "m")
    shutil.copytree(families["hermes"].path, d)
    os.remove(os.path.join(d, "chat_template.jinja"))
    with pytest.raises(TokenizerLoadError, match="no chat template"):
        ChatTemplateTokenCounter(d)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with pytest.raises(ValueError, match="chat_template is required"):
        ChatTemplateTokenCounter(tok)
    with pytest.raises(TypeError, match="path_or_tokenizer"):
        ChatTemplateTokenCounter(42)
    c = ChatTemplateTokenCounter(tok, "{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(MessageValidationError, match=r"messages\[1\]"):
        c.count_messages([Message(role="user", content="a"), 3])


def test_transformers_is_not_imported_by_the_counter():
    import subprocess
    import sys

    code = (
        "import sys, importlib.util, os\n"
        f"spec = importlib.util.spec_from_file_location('mk', {os.path.join(_HERE, 'make_tokenizer.py')!r})\n"
        "mk = importlib.util.module_from_spec(spec); spec.loader.exec_module(mk)\n"
        "import tempfile\n"
        "from jianmu_fast.memory.context import ChatTemplateTokenCounter\n"
        "from jianmu_fast.message import human\n"
        "c = ChatTemplateTokenCounter(mk.model_dir('qwen3', tempfile.mkdtemp()))\n"
        "c.count_messages([human('hi')])\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the filters keep their invariants with this counter --------------------------------------------


def _trimmed(fam, ms, budget):
    """What a budget filter with ``fam``'s counter keeps of ``ms`` within ``budget``; None where
    transformers refuses ``ms`` or nothing fits (``ContextBudgetError``)."""
    if isinstance(fam.reference(ms), Exception):
        return None
    try:
        return TokenBudgetFilter(max_tokens=budget, counter=fam.counter).apply(ms)
    except ContextBudgetError:
        return None


def _kept_within(fam, ms, kept, budget):
    """What a budget filter keeps of ``ms``: within ``budget`` by the exact count of what is
    sent (rendering the whole template), the leading system run pinned, then a contiguous run
    of the newest messages opening on no tool result (whole transactions). Returns the
    pinned run's length and the rest."""
    assert fam.counter.count_request(kept) <= budget
    n_pinned = next((i for i, m in enumerate(ms) if m.role != "system"), len(ms))  # the leading system run
    assert kept[:n_pinned] == ms[:n_pinned]
    rest = kept[n_pinned:]
    assert rest == ms[len(ms) - len(rest):]  # a contiguous run of the newest messages
    if rest:
        assert rest[0].role != "tool"  # whole tool-call transactions
    return n_pinned, rest


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), budget=st.integers(30, 700), name=st.sampled_from(FAMILIES))
def test_budget_filter_keeps_budget_by_exact_rendering(families, ms, budget, name):
    fam = families[name]
    kept = _trimmed(fam, ms, budget)
    if kept is None:
        return
    n_pinned, rest = _kept_within(fam, ms, kept, budget)
    reasoning = any(m.extra for m in ms) or _looks_ahead(fam.counter, ms)
    # exact counts, the longest run is kept (a system message after the pinned run is charged
    # the most it costs over its neighbours: gpt-oss drops it, but not where it comes first)
    if name in LOCAL and not reasoning and ms[-1].role != "assistant" and all(m.role != "system" for m in ms[1:]):
        start = len(ms) - len(rest)
        while start > n_pinned and ms[start - 1].role == "tool":
            start -= 1
        prev = start - 1
        while prev > n_pinned and ms[prev].role == "tool":
            prev -= 1
        slack = fam.counter.count_messages([]) - fam.counter._end_cost(ms[-1].role)
        if prev >= n_pinned and prev < start:
            assert fam.counter.count_request(ms[:n_pinned] + ms[prev:]) > budget - slack


#: system prompts whose text may merge with what a template prints after them (DeepSeek-V3
#: prints an answer's text right after the system prompt's), and the openings of those texts
_SYSTEM_ENDS = ["You are a weather bot.\n", "Be brief. ", "Rules:\n- a\n- b\n\n", "Answer in 中文。\n",
                "Use tools  ", "x\t", "End with digits 123\n", "Note  \n  ", "Be concise.\r\n", "You are helpful."]
_OPENINGS = ["Checking", " spaced", "\nnewline first", "123 items", "中文回答", "。句号", "...", "  two spaces",
             "\tTab", "'s quote", "Hello\n\nworld", "", "-", "\n\n", " 12", "?!", "\u00a0nbsp", "Ünïcode"]


def test_a_tool_output_is_tokenized_once_however_often_its_unit_is_costed(families):
    """A coding agent's loop trimmed every turn: the unit a moved cut leaves first after the
    system prompt is costed again between new neighbours (after the system prompt, before a
    final answer: other plans, whose value runs equal the first costing's). Every plan holds
    one object per distinct value run, so the caches keyed by identity (a long run's text, a
    huge piece's count) find it: no tool output is tokenized twice (gpt-oss escapes each with
    ``tojson``: ~1 ns a character, then tokenizes it); DeepSeek-V3's first text after the
    real system message, at most once more (merged with the system prompt's). Every count exact; every family. (A first loop learns the template's
    frames, which renders and tokenizes whole conversations; the second, on a fresh counter
    and new outputs, is the one checked.)"""
    from jianmu_fast._template_base import NOT_YET

    for name, fam in families.items():
        for rnd in range(2):
            c = fam.fresh()
            tokenized: list = []
            encode = c._encode_lengths
            c._encode_lengths = lambda texts, encode=encode, tokenized=tokenized: tokenized.extend(texts) or encode(texts)
            if c._fast is not None:  # (fastokens: encode_lengths calls its encoder, wrapped here)
                fast = c._fast

                class Seen:
                    def encode_ordinary(self, t, fast=fast, tokenized=tokenized):
                        tokenized.append(t)
                        return fast.encode_ordinary(t)

                    def encode(self, t, fast=fast, tokenized=tokenized, **kw):
                        tokenized.append(t)
                        return fast.encode(t, **kw)

                    def __getattr__(self, attr, fast=fast):
                        return getattr(fast, attr)

                c._fast = Seen()
            flt = TokenBudgetFilter(5000, counter=c)
            ms = [Message(role="system", content="You are a coding agent."), Message(role="user", content="Fix the bug.")]
            for i in range(14):
                ms.append(Message(role="assistant", content="" if i % 2 else f"Reading part {i}.", tool_calls=[
                    {"id": f"c{i}", "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{i}.py"})}}]))
                body = "\n".join(f'    value_{i}_{k} = compute("{k}", [{k}, {k + rnd}])  # step {k}' for k in range(60))
                ms.append(Message(role="tool", content=f"def f{i}():\n{body}", tool_call_id=f"c{i}", name="read_file"))
                if i % 4 == 3:
                    ms += [Message(role="assistant", content=f"Part {i} is fine."), Message(role="user", content="Go on.")]
                kept = flt.apply(ms)
                assert c.count_messages(kept) == fam.reference(kept), (name, rnd, i)
        assert len(kept) < len(ms), name  # (the cut moved)
        long = [t for t in tokenized if len(t) > 2048]
        # (DeepSeek-V3 costs the first unit after a moved cut after the real system message, by
        # the plan of the two as a conversation's first messages: the unit's first text may merge
        # with the system prompt's, a run of both counted anew)
        most = 2 if c._real_system_pred else 1
        assert long and max(long.count(t) for t in long) <= most, (name, [len(t) for t in long])
        # (the plans, not plan_groups' entries beside them: keyed by a tuple opening with "groups")
        runs = [r for k, p in c._plans.items() if k[0] != "groups" and p is not None and p is not NOT_YET for r in p[1]]
        assert len({id(r) for r in runs}) == len(set(runs)), name


def test_charges_bound_every_cut_after_a_system_prompt(families):
    """Wherever the trimming cuts, the kept prompt (the system prompt, then the newest units)
    costs at most what the filter charges for it: its fixed cost plus the per-message charges
    of the messages it keeps (``count_array``), also where the system prompt ends in
    whitespace and the first kept message's text (an answer, a call's text: DeepSeek-V3 prints
    it right after the system prompt's) opens with whitespace, digits, punctuation or CJK --
    the two texts may merge into other tokens than the stand-ins' (every cut checked against
    transformers). A unit charged only what it costs where it stands, not the most over the
    neighbours a kept prompt may give it, fails here (gpt-oss's calls with text). The budget
    filter's own charges too, turn by turn: with the system prompt pinned, no unit is charged
    as a conversation's first (none stands first in a kept prompt); with nothing pinned, each
    is (the system prompt may go)."""
    for name, fam in families.items():
        checked = 0
        for s in _SYSTEM_ENDS:
            c, pinned, loose = fam.fresh(), fam.fresh(), fam.fresh()
            ms = [Message(role="system", content=s), Message(role="user", content="Hi")]
            for i, o in enumerate(_OPENINGS):
                if i % 3 == 0:
                    ms += [Message(role="assistant", content=o or "ok"), Message(role="user", content="more")]
                else:
                    ms.append(Message(role="assistant", content=o, tool_calls=[{
                        "id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": i})}}]))
                    ms.append(Message(role="tool", content=f"r{i}", tool_call_id=f"c{i}", name="f"))
            ms.append(Message(role="user", content="end"))
            charges = {"count_array": c.count_array(ms).tolist()}
            for label, counter, roles in (("pinned", pinned, ("system",)), ("loose", loose, ())):
                opened: list = []
                asked: list = []  # (how many messages each call charged)
                charge = counter._count_list  # (what the filter asks its charges with: opened)
                counter._count_list = lambda *a, charge=charge, opened=opened, asked=asked: (
                    opened.append(a[3]) or asked.append(len(a[0])) or charge(*a))
                flt = TokenBudgetFilter(10**6, counter=counter, pinned_roles=roles)
                for j in range(2, len(ms) + 1):
                    if ms[j - 1].role in ("user", "tool"):
                        assert flt.apply(ms[:j]) == ms[:j]
                charges[label] = flt._rec.counts.tolist()
                # (every turn's new messages charged by the counter's own _count_list -- a
                # subclass's override is asked on every turn --, opened exactly where the
                # system prompt is pinned)
                assert opened and set(opened) == {label == "pinned"}, (name, label)
                assert sum(asked) >= len(ms), (name, label, asked)
            if name in ("gpt-oss", "deepseek-v3"):  # unpinned later: charged as a first too from then on
                flt.pinned_roles = ("system",)
                assert flt.apply(ms) == ms and flt._rec.counts.tolist() == charges["pinned"]
                opened.clear()
                flt.pinned_roles = ()
                assert flt.apply(ms) == ms and opened and not any(opened), name
            fixed = c.count_messages([])
            for lo in range(1, len(ms)):
                if ms[lo].role == "tool":
                    continue
                kept = ms[:1] + ms[lo:]
                exact = fam.reference(kept)
                if isinstance(exact, Exception):
                    continue
                assert c.count_messages(kept) == exact, (name, s, lo)
                for label, got in charges.items():
                    assert exact <= fixed + got[0] + sum(got[lo:]), (name, s, lo, label)
                checked += 1
        assert checked > 200, name


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), budget=st.integers(30, 700), name=st.sampled_from(FAMILIES))
def test_budget_filter_with_tools_keeps_budget_by_exact_rendering(families, ms, budget, name):
    """The request's tools inside the budget: what is sent, rendered whole with the tools,
    fits (DeepSeek-V3's tools cost one token more after a system message than after a lone
    user message: ``count_tools(tools)`` takes the larger), Mistral's too, whose template prints
    the tools before every user message equal to the last one (``tools_surplus``)."""
    fam = families[name]
    if isinstance(fam.reference(ms, TOOLS), Exception):
        return
    flt = TokenBudgetFilter(max_tokens=budget + fam.counter.count_tools(TOOLS), counter=fam.counter)
    try:
        kept = flt.apply(ms, tools_schema=TOOLS)
    except ContextBudgetError:
        return
    c = fam.counter
    assert c.count_messages(kept) + flt.tools_cost(TOOLS, kept) <= flt.max_tokens  # the budget as documented
    assert c.count_request(kept, TOOLS) <= flt.max_tokens


def test_a_system_message_opening_a_turn_is_not_charged_as_the_first(families):
    """A turn that appends a system message and a user message: the filter counts the new
    messages alone, and the system message opening them is not the conversation's first
    (Llama 3.1 prints the first system message's text in its opening header, 5 tokens less
    than a later one costs): every prompt kept in the hot loop fits, at every budget near the
    boundary (before the fix, a 65-token budget got a 70-token prompt on Llama 3.1)."""
    history = [Message(role="system", content="You are terse."), Message(role="user", content="hi"),
               Message(role="assistant", content="hello there"), Message(role="user", content="more")]
    turn = [Message(role="system", content="Note: be careful with the user's files."),
            Message(role="user", content="and then?")]
    for name, fam in families.items():
        exact = fam.counter.count_messages(history + turn)
        for budget in range(exact - 12, exact + 1):
            counter = fam.fresh()
            flt = TokenBudgetFilter(max_tokens=budget, counter=counter)
            try:
                flt.apply(history)
            except ContextBudgetError:
                pass
            try:
                kept = flt.apply(history + turn)
            except ContextBudgetError:
                continue
            assert counter.count_request(kept) <= budget, (name, budget)
            assert kept == TokenBudgetFilter(max_tokens=budget, counter=fam.fresh()).apply(history + turn)


def test_a_hot_loop_keeps_what_a_fresh_filter_keeps_one_message_a_turn(families):
    """A conversation fed to one filter a message at a time -- a call's results arriving over
    several turns, a system message after the first, a tool round closed by an answer -- keeps,
    at every budget near each prompt's exact count, what a fresh filter and counter keep from
    the same messages, on every template (before: DeepSeek-V3 charged a unit counted last, or
    first, in a turn of its own more than in the whole conversation, one token; Qwen3 charged a
    result arriving after its sibling for the closing of their block again, and so did every
    template that wraps results in one block)."""
    calls = [{"id": f"call_{k}", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
             for k, c in enumerate(["Paris", "Rome"])]
    ms = [Message(role="system", content="You are terse."), Message(role="user", content="Weather in Paris and Rome?"),
          Message(role="assistant", content="", tool_calls=calls),
          Message(role="tool", content='{"temp": 21}', tool_call_id="call_0", name="get_weather"),
          Message(role="tool", content='{"temp": 25}', tool_call_id="call_1", name="get_weather"),
          Message(role="assistant", content="Paris 21, Rome 25."),
          Message(role="system", content="Note: the user prefers Fahrenheit."),
          Message(role="user", content="And in Fahrenheit?"),
          Message(role="assistant", content="", tool_calls=calls[:1]),
          Message(role="tool", content='{"temp_f": 70}', tool_call_id="call_0", name="get_weather")]
    checked = 0
    for name, fam in families.items():
        if isinstance(fam.reference(ms[:5]), Exception):  # (Llama 3.1: no parallel calls)
            ms_f = ms[:2] + [ms[2].model_copy(update={"tool_calls": calls[:1]}), ms[3]] + ms[5:]
        else:
            ms_f = ms
        ends = [i for i in range(2, len(ms_f) + 1) if ms_f[i - 1].role in ("user", "tool")]
        counter, reference = fam.fresh(), fam.fresh()  # (the hot loop's, the fresh filters')
        for budget_at in ends:
            exact = fam.counter.count_messages(ms_f[:budget_at])
            for budget in range(max(1, exact - 30), exact + 1, 3):
                flt = TokenBudgetFilter(max_tokens=budget, counter=counter)
                for cut in range(1, len(ms_f) + 1):
                    prompt = ms_f[:cut]
                    if prompt[-1].role not in ("user", "tool") or isinstance(fam.reference(prompt), Exception):
                        continue
                    try:
                        kept = flt.apply(prompt)
                    except ContextBudgetError:
                        continue
                    assert counter.count_request(kept) <= budget, (name, budget, cut)
                    assert kept == TokenBudgetFilter(max_tokens=budget, counter=reference).apply(prompt), (
                        name, budget, cut)
                    checked += 1
    assert checked > 100


def test_a_budget_filter_on_the_counter_is_freed_without_the_garbage_collector(families):
    """An eval run builds a filter a conversation on one counter: each must go when it is
    dropped, by reference counting. Until session 34 the filter kept its own bound
    ``_template_counts`` as an attribute -- a reference cycle -- and every filter lived on,
    with its records and messages, until the collector's next pass over its generation
    (the eval regime's young generations held 40 filters after 40 conversations)."""
    counter = families["qwen3"].counter
    ms = [Message(role="system", content="You are terse."), Message(role="user", content="Weather in Paris?"),
          Message(role="assistant", content="Sunny."), Message(role="user", content="And tomorrow?")]
    was = gc.isenabled()
    gc.disable()
    try:
        refs = []
        for budget in (40, 10_000):
            flt = TokenBudgetFilter(budget, counter=counter)
            kept = flt.apply(ms[:2])
            kept = flt.apply(ms)
            assert counter.count_messages(kept) <= budget and kept[-1] is ms[-1]
            refs.append(weakref.ref(flt))
            del flt
        assert [r() for r in refs] == [None, None]
    finally:
        if was:
            gc.enable()


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "gpt-oss"])
def test_the_key_caches_stay_within_max_key_chars_and_the_counts_stay_exact(families, name):
    """An eval run's conversations end and are not seen again: what the counter caches by
    message key is thinned out (the oldest quarter of each such cache, the memo entries of
    messages that are gone) once its keys pass ``MAX_KEY_CHARS`` characters, where it grew
    until ``cache_size`` entries before (~100 MB behind 4,000 customer-service conversations).
    Thinned out every few conversations here: every prompt's count is still a fresh counter's,
    the filter keeps the same prompts, and the keys held stay near the bound."""
    fam = families[name]
    small = type("SmallKeys", (type(fam.counter),), {"MAX_KEY_CHARS": 3_000})(fam.path, engine=fam.engine)
    reference = type(fam.counter)(fam.path, engine=fam.engine)
    calls = [{"id": "call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    seen = 0
    for k in range(30):
        call = [{**calls[0], "id": f"call_{k}"}]
        ms = [Message(role="system", content="You are terse. " * 4),
              Message(role="user", content=f"Weather in Paris, take {k}? " * 3),
              Message(role="assistant", content="", tool_calls=call),
              Message(role="tool", content=f'{{"temp": {k}, "sky": "clear"}}' * 3, tool_call_id=f"call_{k}"),
              Message(role="assistant", content=f"It is {k} degrees. " * 4),
              Message(role="user", content=f"And tomorrow, {k}?")]
        budget = reference.count_messages(ms) - (20 if k % 2 else 0)
        flt, ref_flt = TokenBudgetFilter(budget, counter=small), TokenBudgetFilter(budget, counter=reference)
        for n in (2, 4, 5, 6):
            kept = flt.apply(ms[:n])
            assert kept == ref_flt.apply(ms[:n])
            assert small.count_messages(kept) == reference.count_messages(kept)
        seen += len(ms)
        # the same conversation as chat-completions dicts (validated into Messages of the
        # counter's own, memoized by no one's identity): its keys count toward the bound too
        dicts = [{"role": m.role, "content": m.content, **({"tool_calls": list(m.tool_calls)} if m.tool_calls else {}),
                  **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})} for m in ms]
        dicts[1]["content"] += " (again)"
        assert small.count_messages(dicts) == reference.count_messages(dicts)
        assert any(key.endswith(" (again)") for key in small._by_key)  # (kept, and counted, as the newest)
        assert small._key_chars == sum(len(key) for key in small._by_key)
        assert small._key_chars <= 3_000 + 400, small._key_chars
    assert len(small._by_key) < seen // 2 and len(small._memo) < seen // 2
    assert len(reference._by_key) > seen * 2 // 3


def test_the_batch_path_keeps_what_apply_keeps_where_messages_stand_after_different_ones(families):
    """The batch path counts each distinct message once, where it first stands; a chat template
    charges a message by where it stands, so when one message object stands after different
    messages in different prompts (a result after its sibling in one prompt, right after the
    call in another; a reused "continue" message) each prompt is trimmed as ``apply`` trims it.
    Either way the outputs are ``apply``'s, at every budget near the prompts' counts."""
    from jianmu_fast.memory.context._batch_plan import _one_context, trim_many
    from jianmu_fast import _backend

    calls = [{"id": f"call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
             for k in range(2)]
    s, u1, u2 = (Message(role="system", content="Be brief."), Message(role="user", content="Weather?"),
                 Message(role="user", content="continue"))
    call, call1 = Message(role="assistant", content="", tool_calls=calls), Message(
        role="assistant", content="", tool_calls=calls[1:])
    t0, t1 = (Message(role="tool", content=f'{{"temp": {20 + k}}}', tool_call_id=f"call_{k}", name="get_weather")
              for k in range(2))
    a = Message(role="assistant", content="It is 21 and 22.")
    prefixes = [[s, u1, call, t0, t1], [s, u1, call, t0, t1, a, u2]]  # one conversation's prompts
    mixed = prefixes + [[s, u2, call1, t1], [u2, a, u2]]  # t1 after call1, u2 after a and first
    rows, off, distinct, _ = _backend.intern_rows(prefixes, Message)
    assert _one_context(rows, off, len(distinct))
    rows, off, distinct, _ = _backend.intern_rows(mixed, Message)
    assert not _one_context(rows, off, len(distinct))
    for name, fam in families.items():
        if name == "llama3.1":  # (no parallel calls)
            continue
        batch_counter, reference = fam.fresh(), fam.fresh()
        for prompts in (prefixes, mixed):
            counts = [fam.counter.count_messages(p) for p in prompts]
            for budget in range(max(1, min(counts) - 20), max(counts) + 1, 4):
                outs, _ = trim_many(TokenBudgetFilter(max_tokens=budget, counter=batch_counter), prompts, None, False)
                for p, out in zip(prompts, outs):
                    try:
                        want = TokenBudgetFilter(max_tokens=budget, counter=reference).apply(p)
                    except ContextBudgetError:
                        assert type(out) is ContextBudgetError, (name, budget)
                        continue
                    assert out == want, (name, budget)


def test_results_arriving_later_recharge_their_unit_where_it_changes_kind(families):
    """A template whose unit of a call and its results is charged otherwise once a second
    result arrives (none of the bundled ones: simulated by a counter that charges a call 40
    tokens more in a unit of two results or more): the hot loop's records of the call take the
    longer unit's charge when the second result arrives in a turn of its own, so the filter
    keeps what a fresh one keeps, and its records add up to the longer unit's charges."""
    fam = families["qwen3"]
    calls = [{"id": f"call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
             for k in range(2)]
    ms = [Message(role="system", content="s"), Message(role="user", content="Weather?")] + [
        m for i in range(4) for m in (
            Message(role="assistant", content="", tool_calls=calls),
            Message(role="tool", content=f"r{i}a", tool_call_id="call_0", name="get_weather"),
            Message(role="tool", content=f"r{i}b", tool_call_id="call_1", name="get_weather"),
            Message(role="assistant", content=f"Step {i}."), Message(role="user", content="more"))]

    def counter_of():
        c = fam.fresh()
        plain = c._count_list

        def count_list(messages, start=True, pred=None, opened=False):
            out = list(plain(messages, start, pred, opened))
            for i, m in enumerate(messages):  # a call followed by two results or more
                if m.tool_calls and sum(1 for x in messages[i + 1:i + 3] if x.role == "tool") == 2:
                    out[i] += 40
            return out

        c._count_list = count_list
        return c

    exact = fam.counter.count_messages(ms)
    counter, reference = counter_of(), counter_of()
    for budget in range(exact // 2, exact + 60, 7):
        flt = TokenBudgetFilter(max_tokens=budget, counter=counter)
        for cut in range(2, len(ms) + 1):
            prompt = ms[:cut]
            if prompt[-1].role not in ("user", "tool"):
                continue
            try:
                kept = flt.apply(prompt)
            except ContextBudgetError:
                continue
            assert kept == TokenBudgetFilter(max_tokens=budget, counter=reference).apply(prompt), (budget, cut)
            charges = reference._count_list(prompt)
            # (records the plan did not need may be uncounted)
            assert all(c in (-1, x) for c, x in zip(flt._rec.counts.tolist(), charges)), (budget, cut)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), budget=st.integers(30, 700), name=st.sampled_from(FAMILIES), data=st.data())
def test_budget_filter_in_a_hot_loop_keeps_budget_and_answers_as_a_fresh_one(families, ms, budget, name, data):
    """An agent loop: one filter and one counter see the conversation grow (cut anywhere, a
    system message now and then among the new messages, an old tool result cleared in place
    now and then, the counter warmed by earlier prompts); each prompt stays within the budget
    by exact rendering, and it is what a fresh filter with a fresh counter keeps from the same
    messages, and what the batch path keeps, for every family: where charges are upper bounds
    (a unit whose rendering depends on its neighbours, reasoning, a later system message) they
    are the same wherever the unit stands, in a turn of its own or in a whole conversation, and
    results of one call that arrive over several turns are charged what they add to the call
    and the results before them. Also with user messages pinned (a kept unit may then follow
    a pinned user message, whatever stood before it)."""
    fam = families[name]
    opening = [i for i in range(1, len(ms)) if ms[i].role == "system" and ms[i - 1].role != "system"]
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(ms)), min_size=1, max_size=4)) + opening + [len(ms)]))
    counter = fam.fresh()
    pinned = data.draw(st.sampled_from([("system",), ("system",), ("system", "user")]))
    flt = TokenBudgetFilter(max_tokens=budget, counter=counter, pinned_roles=pinned)
    ms = list(ms)
    prompts = []
    for cut in cuts:
        results = [i for i in range(cut) if ms[i].role == "tool"]
        if results and data.draw(st.booleans()):  # an old result cleared in place (context editing)
            i = data.draw(st.sampled_from(results))
            ms[i] = ms[i].model_copy(update={"content": "[cleared]"})
        prompt = ms[:cut]
        if isinstance(fam.reference(prompt), Exception):
            continue
        fresh = TokenBudgetFilter(max_tokens=budget, counter=fam.fresh(), pinned_roles=pinned)
        try:
            kept = flt.apply(prompt)
        except ContextBudgetError:
            with pytest.raises(ContextBudgetError):
                fresh.apply(prompt)
            continue
        assert counter.count_request(kept) <= budget
        assert kept == fresh.apply(prompt)
        prompts.append((prompt, kept))
    if prompts:  # the batch path: one filter, every prompt, the same outputs
        from jianmu_fast.memory.context._batch_plan import trim_many

        outs, _ = trim_many(TokenBudgetFilter(max_tokens=budget, counter=fam.fresh(), pinned_roles=pinned),
                            [p for p, _ in prompts], None, False)
        assert outs == [k for _, k in prompts]


@st.composite
def reasoning_loops(draw):
    """Agent loops whose model returns reasoning (vLLM's reasoning parsers): a system prompt,
    a user query, then turns of calls (one at a time: every template takes them), most with
    reasoning (opened and closed by a newline at times), now and then an answer with
    reasoning and the user's next message."""
    ms = [Message(role="system", content=draw(_content)), Message(role="user", content=draw(_text))]
    for i in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["call", "call", "call", "answer"]))
        extra = {"reasoning_content": draw(st.sampled_from(["", "hm", "\nLook it up.\n", "x" * 40]))} \
            if draw(st.integers(0, 3)) else {}
        if kind == "call":
            args = json.dumps({"city": draw(_text)})
            ms.append(Message(role="assistant", content=None, extra=extra, tool_calls=[
                {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
            ms.append(Message(role="tool", content=draw(_content), tool_call_id=f"c{i}", name="get_weather"))
        else:
            ms.append(Message(role="assistant", content=draw(_text), extra=extra))
            ms.append(Message(role="user", content=draw(_text)))
    return ms


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=st.one_of(conversations(end_on_assistant=False), reasoning_loops()), budget=st.integers(60, 900),
       name=st.sampled_from(list(FAMILIES) + ["qwen3"] * 4))
def test_a_hot_loop_counts_each_kept_prompt_and_its_history_exactly(families, ms, budget, name):
    """One counter sees an agent loop grow turn by turn (each call ends on a user or tool
    message), trimmed by a budget filter: each kept prompt, and the whole history after it,
    is counted as transformers counts it -- from the previous call's segments where they still
    hold. Reasoning included: under Qwen3's ``_query_rule`` a unit after the last user message
    is costed with its reasoning kept, and again stripped once a user message follows it or
    kept again when a cut drops every user message after it."""
    fam = families[name]
    counter = fam.fresh()
    flt = TokenBudgetFilter(max_tokens=budget, counter=counter)
    for cut in range(1, len(ms) + 1):
        if ms[cut - 1].role not in ("user", "tool") or (cut < len(ms) and ms[cut].role == "tool"):
            continue
        prompt = ms[:cut]
        if isinstance(fam.reference(prompt), Exception):
            continue
        try:
            kept = flt.apply(prompt)
        except ContextBudgetError:
            continue
        for p in (kept, prompt):
            want = fam.reference(p)
            if not isinstance(want, Exception):
                assert counter.count_messages(p) == want, (cut, len(p))


def test_mistral_repeating_the_last_user_message_stays_within_the_budget_with_tools(families):
    """Mistral's template prints the tools before every user message equal to the last one:
    a prompt repeating its last user message pays for them twice, and the budget filter trims
    it further by that surplus (``tools_surplus``), on every path: apply, a hot-loop turn, the
    batch and the builder."""
    c = families["mistral"].counter
    ms = [Message(role="user", content="continue"), Message(role="assistant", content="Done."),
          Message(role="user", content="continue")]
    budget = c.count_messages(ms) + c.count_tools(TOOLS)
    tools = c.count_tools(TOOLS)
    assert c.tools_surplus(TOOLS, ms) == c.count_tools(TOOLS, ms) - tools == tools  # twice
    assert c.tools_surplus(TOOLS, ms[1:]) == 0 and c.tools_surplus(None, ms) == 0
    flt = TokenBudgetFilter(max_tokens=budget, counter=c)
    kept = flt.apply(ms, tools_schema=TOOLS)
    assert kept == ms[1:]  # the first "continue" goes: no repeat left
    assert c.count_request(kept, TOOLS) <= budget
    assert flt.tools_cost(TOOLS, ms) == 2 * tools and flt.tools_cost(TOOLS, kept) == tools
    # a hot loop: the prompt grows; every output fits, whatever the turn's path
    history = list(ms)
    for i in range(6):
        history += [Message(role="assistant", content=f"Step {i}."), Message(role="user", content="continue")]
        kept = flt.apply(history, tools_schema=TOOLS)
        assert c.count_request(kept, TOOLS) <= budget, i
        assert kept == history[-len(kept):]
    # the batch: the same outputs as apply
    from jianmu_fast.memory.context._batch_plan import trim_many

    prompts = [ms, ms[1:], history, [Message(role="user", content="x")]]
    outs, _ = trim_many(TokenBudgetFilter(max_tokens=budget, counter=c), prompts, TOOLS, False)
    assert outs == [TokenBudgetFilter(max_tokens=budget, counter=c).apply(p, tools_schema=TOOLS) for p in prompts]
    for out in outs:
        assert c.count_request(out, TOOLS) <= budget
    # a repeat that the budget cannot drop (both pinned): its error counts the tools twice
    with pytest.raises(ContextBudgetError, match=f"{2 * tools} the request's tools"):
        TokenBudgetFilter(max_tokens=budget, counter=c, pinned_roles=("user",)).apply(
            [ms[0], ms[2]], tools_schema=TOOLS)


@st.composite
def repeating_loops(draw):
    """An agent loop whose users often repeat themselves ("continue" ...), with tool calls
    between; a system message first now and then."""
    ms: list[Message] = []
    if _sometimes(draw, 2):
        ms.append(Message(role="system", content="Be brief."))
    for i in range(draw(st.integers(1, 7))):
        ms.append(Message(role="user", content=draw(st.sampled_from(["continue", "continue", "go on", "Why?"]))))
        if _sometimes(draw, 3):
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            ms.append(Message(role="assistant", content="", tool_calls=[call]))
            ms.append(Message(role="tool", content='{"temp": 21}', tool_call_id=f"c{i}"))
        ms.append(Message(role="assistant", content=draw(st.sampled_from(["Done.", "On it, step two."]))))
    if _sometimes(draw, 4):
        ms.pop()  # ends on the assistant's answer or the user's request
    return ms


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=repeating_loops(), room=st.integers(0, 400))
def test_mistral_budget_with_repeated_user_messages_is_exact_and_maximal(families, ms, room):
    """Mistral's template pays for the tools again for every user message equal to the last
    one: the budget filter's output, with the tools, fits the budget rendered whole; it keeps
    the longest run that does (one more unit would be over, by the filter's own accounting:
    its per-message counts, the fixed cost, the tools and their surplus); the batch path gives
    the same outputs."""
    from jianmu_fast.memory.context._batch_plan import trim_many

    c = families["mistral"].counter
    if isinstance(families["mistral"].reference(ms, TOOLS), Exception):
        return
    tools = c.count_tools(TOOLS)
    budget = c.count_messages([]) + tools + room
    flt = TokenBudgetFilter(max_tokens=budget, counter=c)
    try:
        kept = flt.apply(ms, tools_schema=TOOLS)
    except ContextBudgetError:
        kept = None
    outs, _ = trim_many(TokenBudgetFilter(max_tokens=budget, counter=c), [ms, ms[:-1] or ms], TOOLS, False)
    if kept is None:
        assert isinstance(outs[0], ContextBudgetError)
        return
    assert outs[0] == kept
    assert c.count_request(kept, TOOLS) <= budget
    n_pinned = 1 if ms[0].role == "system" else 0
    rest = kept[n_pinned:]
    assert kept[:n_pinned] == ms[:n_pinned] and rest == ms[len(ms) - len(rest):]
    start = len(ms) - len(rest)
    prev = start - 1
    while prev > n_pinned and ms[prev].role == "tool":
        prev -= 1
    if prev >= n_pinned:  # one more unit: over the budget, as the filter charges it (the tools'
        # cost without messages, an upper bound, and the surplus of tools printed again; not
        # tools_cost(TOOLS, longer), exact: 0 where no user message is left to print them before)
        longer = ms[:n_pinned] + ms[prev:]
        charged = int(c.count_array(longer).sum()) + c.count_messages([]) + tools + c.tools_surplus(TOOLS, longer)
        assert charged > budget


def test_builder_and_summarizing_keep_mistral_repeats_within_the_budget(families):
    """The builder's paths (a hot loop of builds, clearing before the budget, the final
    re-budget) and the summarizing budget keep a repeating prompt within the budget with
    the tools; ``build_report`` charges the tools as often as they are printed."""
    from jianmu_fast.memory.context import (
        ClearToolResultsFilter, ContextBuilder, StateHistoryProvider, StaticPromptProvider,
        SummarizingBudgetFilter,
    )

    c = families["mistral"].counter
    tools = c.count_tools(TOOLS)
    budget = c.count_messages([]) + tools + 120

    def builders():
        yield ContextBuilder(providers=[StaticPromptProvider("Be brief."), StateHistoryProvider()],
                             filters=[TokenBudgetFilter(budget, counter=c)])
        yield ContextBuilder(providers=[StaticPromptProvider("Be brief."), StateHistoryProvider()],
                             filters=[ClearToolResultsFilter(budget // 2, counter=c, keep=1),
                                      TokenBudgetFilter(budget, counter=c)])
        yield ContextBuilder(providers=[StaticPromptProvider("Be brief."), StateHistoryProvider()],
                             filters=[SummarizingBudgetFilter(budget, c, summarize=lambda text: "Earlier: steps.",
                                                              summary_max_tokens=20)])

    for b in builders():
        history: list[Message] = []
        for i in range(12):
            history.append(Message(role="user", content="continue" if i % 3 else "Plan the trip."))
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            history.append(Message(role="assistant", content="", tool_calls=[call]))
            history.append(Message(role="tool", content='{"temp": 21, "sky": "clear"}', tool_call_id=f"c{i}"))
            history.append(Message(role="assistant", content=f"Step {i} done."))
            out = b.build({"messages": history}, tools_schema=TOOLS)
            assert c.count_request(out, TOOLS) <= budget, (b.filters, i)
        report = b.build_report({"messages": history}, tools_schema=TOOLS)
        assert report.total_tokens == c.count_request(report.messages, TOOLS)


def test_clearing_triggers_on_the_tools_mistral_prints_again(families):
    """``ClearToolResultsFilter``'s trigger charges the tools as often as the template prints
    them: a Mistral prompt that repeats its last user message is over a trigger that it
    would stay under with the tools charged once, and its tool results are cleared."""
    from jianmu_fast.memory.context import ClearToolResultsFilter

    c = families["mistral"].fresh()
    result = json.dumps({"rows": [{"id": i, "city": "Paris", "temp": 20 + i % 7} for i in range(12)]})
    history: list[Message] = []
    for i in range(3):
        history.append(Message(role="user", content="continue" if i else "Plan the trip."))
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
        history.append(Message(role="assistant", content="", tool_calls=[call]))
        history.append(Message(role="tool", content=result, tool_call_id=f"c{i}"))
        history.append(Message(role="assistant", content=f"Step {i} done."))
    history.append(Message(role="user", content="continue"))
    sent = c.count_request(history, TOOLS)
    charged_once = c.count_messages([]) + int(c.count_array(history).sum()) + c.count_tools(TOOLS)
    assert charged_once < sent - 1  # (the tools are printed twice: before both "continue")
    flt = ClearToolResultsFilter(sent - 1, counter=c, keep=1)
    assert flt.cleared_results(history, tools_schema=TOOLS) == [2, 6]
    out = flt.apply(history, tools_schema=TOOLS)
    assert c.count_request(out, TOOLS) < sent
    # under a trigger the whole prompt fits, nothing is cleared
    assert ClearToolResultsFilter(sent, counter=c, keep=1).cleared_results(history, tools_schema=TOOLS) == []


def test_tools_surplus_is_zero_where_the_template_prints_the_tools_once(families):
    """Only Mistral's template prints the tools again for a repeated user message; for the
    others ``tools_surplus`` is 0 and the filter never asks it about a prompt."""
    ms = [Message(role="user", content="continue"), Message(role="assistant", content="Done."),
          Message(role="user", content="continue")]
    for name, fam in families.items():
        c = fam.fresh()
        assert c._repeats_tools(TOOLS) == (name == "mistral"), name
        if name != "mistral" and not isinstance(fam.reference(ms, TOOLS), Exception):
            assert c.tools_surplus(TOOLS, ms) == 0, name
            assert c.count_tools(TOOLS, ms) <= c.count_tools(TOOLS), name
        flt = TokenBudgetFilter(max_tokens=10_000, counter=c)
        flt.apply(ms[:1], tools_schema=TOOLS)
        assert flt._vary == (name == "mistral"), name


def test_count_tools_without_messages_is_the_larger_of_two_shapes(families):
    """``count_tools(tools)``: the tools' marginal cost after a lone user message or after a
    system and a user message, whichever is larger (templates place the tools differently
    when a system message leads)."""
    user = Message(role="user", content=".")
    system = Message(role="system", content=".")
    for name, fam in families.items():
        c = fam.fresh()
        shapes = [c.count_tools(TOOLS, [user]), c.count_tools(TOOLS, [system, user])]
        assert c.count_tools(TOOLS) == max(shapes), name
        if name == "deepseek-v3":
            assert shapes[1] == shapes[0] + 1  # the case this covers


def test_cli_tokenizer_accepts_a_model_directory(families):
    from jianmu_fast import cli

    c = cli.make_counter(families["qwen3"].path)
    assert isinstance(c, ChatTemplateTokenCounter)
    assert c.engine == "auto" and c.engine_in_use == "tokenizers"  # fastokens only past AUTO_FASTOKENS_CHARS
    ms = [Message(role="system", content="Be brief."), Message(role="user", content="Hi")]
    assert c.count_messages(ms) == families["qwen3"].reference(ms)
    assert any(form == "a model directory" for form, _ in cli.TOKENIZER_FORMS)


def test_build_report_shows_the_template_overhead(families):
    from jianmu_fast.memory.context import ContextBuilder, StaticPromptProvider

    fam = families["llama3.1"]
    b = ContextBuilder(providers=[StaticPromptProvider("Be brief.")], filters=[TokenBudgetFilter(500, counter=fam.counter)])
    r = b.build_report({})
    ms = r.messages + [Message(role="user", content="Hi")]
    r2 = ContextBuilder(providers=[StaticPromptProvider("Be brief.")]).build_report({}, counter=fam.counter)
    assert r2.total_tokens == fam.counter.count_messages(r2.messages)
    assert r2.overhead_tokens == r2.total_tokens - sum(fam.counter.count_message(m) for m in r2.messages)
    row = [line for line in str(r2).splitlines() if line.startswith("request overhead (template)")]
    assert row and row[0].split()[-1] == str(r2.overhead_tokens)
    assert fam.counter.count_messages(ms) == fam.reference(ms)


def test_pickles_by_model_folder(families):
    import pickle

    fam = families["gpt-oss"]
    ms = [Message(role="user", content="Weather?")]
    clone = pickle.loads(pickle.dumps(fam.counter))
    assert clone.path == fam.counter.path and clone.count_messages(ms) == fam.counter.count_messages(ms)
    assert clone.engine == fam.engine and clone.engine_in_use == fam.engine
    assert repr(clone) == f"ChatTemplateTokenCounter({fam.path!r}, engine={fam.engine!r})"
    auto = pickle.loads(pickle.dumps(ChatTemplateTokenCounter(fam.path)))
    assert auto.engine == "auto" and repr(auto) == f"ChatTemplateTokenCounter({fam.path!r})"
    flt = pickle.loads(pickle.dumps(TokenBudgetFilter(400, counter=fam.counter)))
    assert flt.apply(ms) == ms
    from tokenizers import Tokenizer

    bare = ChatTemplateTokenCounter(Tokenizer.from_file(os.path.join(fam.path, "tokenizer.json")), "{{ messages }}")
    with pytest.raises(pickle.PicklingError, match="model folder"):
        pickle.dumps(bare)


_SANDBOX_TEMPLATES = [
    "{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[0].get('name', 'none') }}",
    "{{ messages[0].items() | list | length }}{{ messages[0].missing is defined }}{{ messages[0].missing }}",
    "{{ messages[0].content.upper() }}{{ messages[0].content.split(' ') }}{{ messages[0].content.startswith('h') }}",
    "{{ 'x{}y'.format(messages[0].role) }}{{ '{r}'.format_map({'r': 1}) }}",
    "{% if tools %}{{ tools[0].items is callable }}{{ tools[0].keys() | list }}{{ tools[0].function.name }}{% endif %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + loop.index %}{% endfor %}{{ ns.n }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'a': 1}) }}",
    "{{ messages[0].__class__ }}",
    "{{ messages[0].content.__class__.__mro__ }}",
    "{{ ''.format.__globals__ }}",
    "{{ dict(a=1).pop('a') }}",
    "{{ raise_exception('no') if messages | length > 1 else 'ok' }}",
]


@pytest.mark.parametrize("template", _SANDBOX_TEMPLATES)
def test_sandbox_fast_paths_match_transformers(families, template):
    """The renderer's sandbox shortcuts (attribute verdicts cached per type and name, dict/str
    lookups, builtin-method calls) give transformers' outcome: the same text, or a refusal."""
    fam = families["hermes"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(fam.path, "tokenizer.json"))
    ms = [Message(role="user", content="hello there"), Message(role="assistant", content="hi")]
    dicts = [message_to_template_dict(m) for m in ms]
    try:
        expected = fam.hf.apply_chat_template(dicts, tools=TOOLS, chat_template=template, tokenize=False,
                                              add_generation_prompt=True)
    except Exception:  # a template refusing every conversation cannot even be loaded
        with pytest.raises(MessageValidationError, match="chat template"):
            ChatTemplateTokenCounter(tok, template).render(ms, TOOLS)
        return
    c = ChatTemplateTokenCounter(tok, template)
    assert c.render(ms, TOOLS) == expected
    assert c.count_request(ms, TOOLS) == len(fam.hf(expected, add_special_tokens=False)["input_ids"])


def test_message_keys_name_their_dicts_exactly(families):
    """A message key (str content outside the JSON, after a NUL) parses back to the very dict
    it names, key order and tricky contents included, so a counter whose dict cache was
    evicted renders the same text and counts the same."""
    from jianmu_fast.memory.context.chat_template import _message_key, _parse_key

    call = [{"id": "k1", "type": "function", "function": {"name": "search", "arguments": '{"query": "a\\u0000b"}'}}]
    ms = [Message(role="system", content='quote " and NUL \x00 and {"json": 1}'),
          Message(role="user", content=[{"type": "text", "text": "block \x00"}]),
          Message(role="assistant", content=None, tool_calls=call),
          Message(role="tool", content="\x00\x00 数据 \\n", tool_call_id="k1", name="search"),
          Message(role="user", content="")]
    for m in ms:
        d = message_to_template_dict(m)
        back = _parse_key(_message_key(d))
        assert back == d and list(back) == list(d)
    assert len({_message_key(message_to_template_dict(m)) for m in ms}) == len(ms)
    fam = families["qwen3"]
    c = fam.fresh()
    want = c.render(ms)
    n = c.count_messages(ms)
    c._by_key.clear()  # as after eviction: every dict comes from its key
    c._texts.clear()
    c._units.clear()
    c._local_units.clear()
    c._last = None
    assert c._dicts_of([c._entry(m, i)[0] for i, m in enumerate(ms)]) == [message_to_template_dict(m) for m in ms]
    assert c.render(ms) == want and c.count_messages(ms) == n == fam.reference(ms)



# -- tool calls as frame slots ------------------------------------------------------------------

_odd = st.one_of(
    st.sampled_from(['q"uo\\te', "数据 é 🙂", "  padded ", "a\nb", "<tool_call>", "{\"x\": 1}", "call_0", "x" * 20]),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_odd, inner, max_size=3),
    max_leaves=8,
)
_arguments = st.one_of(
    st.dictionaries(_odd, _json_value, max_size=4).map(json.dumps),  # nested JSON, {} included
    st.just("{}"), st.just(""), st.just("not json {"), _json_value.map(json.dumps),  # not an object
)


@st.composite
def odd_call_conversations(draw):
    """An agent loop whose calls have odd ids, names and arguments (quotes, unicode, nested
    JSON, empty, not JSON), parallel calls, with or without text beside them."""
    ms = [Message(role="user", content=draw(_text))]
    for _ in range(draw(st.integers(1, 3))):
        calls, results = [], []
        for _ in range(draw(st.integers(1, 3))):
            cid, name = draw(_odd), draw(_odd)
            calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": draw(_arguments)}})
            results.append(Message(role="tool", content=draw(_text), tool_call_id=cid, name=name))
        text = draw(st.one_of(st.none(), st.just(""), _text))
        ms.append(Message(role="assistant", content=text, tool_calls=calls))
        ms.extend(results)
        if draw(st.booleans()):
            ms.append(Message(role="assistant", content=draw(_text)))
            ms.append(Message(role="user", content=draw(_text)))
    return ms


@_SETTINGS
@given(ms=odd_call_conversations(), with_tools=st.booleans())
def test_odd_tool_calls_count_exactly(family, ms, with_tools):
    """Tool calls assembled from frames (ids, names, arguments as slots) count as transformers
    counts them, whole requests and per-message sums; frames on and off agree."""
    tools = TOOLS if with_tools else None
    ref = family.reference(ms, tools)
    c = family.counter
    if isinstance(ref, Exception):
        with pytest.raises(MessageValidationError, match="chat template refused"):
            c.count_messages(ms) + c.count_tools(tools, ms)
        return
    assert c.count_messages(ms) + c.count_tools(tools, ms) == ref
    off = family.fresh()
    off._RENDER_FREE = False
    assert c.count_array(ms).tolist() == off.count_array(ms).tolist()
    plain = family.reference(ms)
    assert c.count_messages(ms) == plain
    if family.name in LOCAL and not _looks_ahead(c, ms):
        assert c.count_messages([]) + int(c.count_array(ms).sum()) - plain == c.count_messages([]) - c._end_cost(ms[-1].role)



@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(reasoning=False), order=st.randoms(use_true_random=False), with_tools=st.booleans())
def test_messages_out_of_order_count_as_transformers_or_refuse(family, ms, order, with_tools):
    """Hostile order (a tool result after a later user message, a result before its call, a
    system message in the middle): the count is transformers' own, or the template's refusal
    raised as MessageValidationError when transformers refuses too; a unit that the template
    refuses between stand-ins but accepts where it stands is counted by the whole rendering."""
    ms = list(ms)
    order.shuffle(ms)
    tools = TOOLS if with_tools else None
    ref = family.reference(ms, tools)
    c = family.fresh()
    if isinstance(ref, Exception):
        with pytest.raises(MessageValidationError, match="chat template refused"):
            c.count_request(ms, tools)
        return
    assert c.count_request(ms, tools) == ref
    # the sum, where the template takes the messages without tools too (with tools, Llama 3.1
    # takes the first message's text into its tools block whatever its role: a parallel call
    # there is never rendered, so never refused, and count_messages alone does refuse it)
    if not isinstance(family.reference(ms), Exception):
        assert c.count_messages(ms) + c.count_tools(tools, ms) == ref


def test_a_tool_result_after_a_later_user_message_counts_as_transformers(families):
    """gpt-oss accepts [user, call, user, result] (its check looks at the last call made),
    which a stand-in before the result's unit would refuse: counted by the whole rendering."""
    call = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "x"}'}}]
    ms = [Message(role="user", content="hi"), Message(role="assistant", content=None, tool_calls=call),
          Message(role="user", content="more"), Message(role="tool", content="r", tool_call_id="c1", name="search")]
    for fam in families.values():
        ref = fam.reference(ms)
        if isinstance(ref, Exception):
            with pytest.raises(MessageValidationError, match="chat template refused"):
                fam.fresh().count_messages(ms)
        else:
            assert fam.fresh().count_messages(ms) == ref, fam.name

@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(reasoning=False, end_on_assistant=False), data=st.data())
def test_moving_windows_reuse_the_last_call_exactly(family, ms, data):
    """Successive calls over windows of one history (extended, cut moved after a pinned first
    message or not, shrunk, unrelated) reuse the previous call's unit costs only where exact:
    every count equals a full rendering of its window."""
    c = family.fresh()
    for _ in range(6):
        lo = data.draw(st.integers(0, len(ms) - 1))
        hi = data.draw(st.integers(lo + 1, len(ms)))
        window = ms[lo:hi]
        if lo > 0 and data.draw(st.booleans()):
            window = ms[:1] + window  # the pinned first message, then the moved cut
        ref = family.reference(window)
        if isinstance(ref, Exception):
            continue
        assert c.count_messages(window) == ref, (lo, hi)


def test_a_first_unit_of_several_messages_before_a_system_message_counts_exactly(families):
    """A window that opens on a unit of several messages (a system message with orphan tool
    results, a call with its results) followed by a system message: without the unit, the
    system stand-in after it would open the conversation (Llama 3.1 prints a first system
    message in its header), so the unit is priced by its prefixes (``_first_before_system``).
    Found by hypothesis: Llama 3.1 counted 71 for 66."""
    call = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    windows = [
        [Message(role="system", content="Paris"), Message(role="tool", content="Paris", tool_call_id="call_7"),
         Message(role="tool", content="Paris", tool_call_id="call_8"), Message(role="system", content=""),
         Message(role="user", content="Paris")],
        [Message(role="system", content="Paris"), Message(role="tool", content="Paris", tool_call_id="call_7"),
         Message(role="system", content="Be brief."), Message(role="user", content="Hi")],
        [Message(role="assistant", content="", tool_calls=[call]),
         Message(role="tool", content="Paris", tool_call_id="call_7"),
         Message(role="system", content="Be brief."), Message(role="user", content="Hi")],
    ]
    for name, fam in families.items():
        for i, w in enumerate(windows):
            ref = fam.reference(w)
            if isinstance(ref, Exception):
                continue
            c = fam.fresh()
            assert c.count_messages(w) == ref, (name, i)
            assert c.count_messages([]) + int(c.count_array(w).sum()) >= ref, (name, i)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(reasoning=False, end_on_assistant=False), data=st.data())
def test_a_list_changed_in_place_between_calls_counts_exactly(family, ms, data):
    """The caller's one list, changed in place between calls: a message replaced by another
    (the same length, the same last message) or by an equal copy, dropped or inserted in the
    middle, the list shrunk or extended, a message twice. The previous call's messages are
    matched by identity, message by message, never by the list or its length: every count
    equals a counter's without a previous call and the full rendering, and what the counter
    keeps for the next call is the counted list's keys, dicts and unit starts."""
    c = family.fresh()
    probe = family.fresh()
    buf = list(ms)
    for _ in range(8):
        op = data.draw(st.sampled_from(["replace", "copy", "drop", "insert", "shrink", "extend", "same"]))
        i = data.draw(st.integers(0, len(buf) - 1))
        if op == "replace":
            buf[i] = data.draw(st.sampled_from(ms))
        elif op == "copy":
            buf[i] = buf[i].model_copy()
        elif op == "drop" and len(buf) > 1:
            del buf[i]
        elif op == "insert":
            buf.insert(i, data.draw(st.sampled_from(ms)))
        elif op == "shrink":
            del buf[i + 1:]
        elif op == "extend":
            buf.extend(data.draw(st.lists(st.sampled_from(ms), max_size=3)))
        probe._last = probe._last_ms = None  # (no previous call)
        got, want = [], []
        for counter, out in ((c, got), (probe, want)):
            try:
                out.append(counter.count_messages(buf))
            except MessageValidationError as exc:  # the template refuses: the same error
                out.append(str(exc))
        assert got == want, op
        # (in place changes make tool results that follow no call and system messages after
        # the leading run: transformers' count is compared where neither occurs)
        if all((m.role != "tool" or (j and (buf[j - 1].role == "tool" or buf[j - 1].tool_calls)))
               and (m.role != "system" or all(x.role == "system" for x in buf[:j])) for j, m in enumerate(buf)):
            ref = family.reference(buf)
            assert got == [ref if not isinstance(ref, Exception) else got[0]], op
        state = c._last_ms
        if state is not None:
            assert state[0] == buf and state[0] is not buf
            keys, dicts = probe._entries(buf)
            assert state[1] == keys and state[2] == dicts
            if c._last is not None and c._last[0] is state[1]:
                assert c._last[1] == [j for j, d in enumerate(dicts) if j == 0 or d["role"] != "tool"]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), repeat=st.booleans(), name=st.sampled_from(FAMILIES))
def test_tools_cost_by_prompt_signature_equals_transformers(families, ms, repeat, name):
    """``count_tools(tools, ms)`` is looked up by the prompt's signature (``tools_signature``:
    what the probes found the tools' cost depends on) once a prompt of that signature was
    rendered: exact on the prompts trimming makes of a conversation behind one system prompt,
    cut ever later (opening with an assistant's call, its results or text: Llama 3.1 prints
    the tools into that message, in place of it), with the last user message repeated earlier
    (Mistral prints them before each), one counter throughout (its cache), and as the budget
    filter reports it."""
    fam = families[name]
    c = fam.counter
    flt = TokenBudgetFilter(10 ** 6, counter=c)
    rest = [m for m in ms if m.role != "system"]
    for cut in range(min(len(rest), 6)):
        p = [Message(role="system", content="You are terse.")] + rest[cut:]
        users = [m for m in p if m.role == "user"]
        if repeat and users:
            p = p[:1] + [users[-1], Message(role="assistant", content="ok")] + p[1:]
        ref = fam.reference(p, TOOLS)
        if isinstance(ref, Exception):
            continue
        if isinstance(fam.reference(p), Exception):  # (Llama 3.1 refuses parallel calls, unless the tools take them)
            assert c.count_request(p, TOOLS) == ref
            continue
        assert c.count_messages(p) + c.count_tools(TOOLS, p) == ref, cut
        assert c.count_messages(p) + flt.tools_cost(TOOLS, p) == ref, cut


def test_tools_cost_of_prompts_without_a_user_message_is_looked_up_and_exact(families):
    """A coding agent's prompt, trimmed, often keeps no user message (one request, then tool
    rounds): the probes find its tools' cost depends on nothing but its signature on every
    bundled template (``no_user``), so the windows sliding over the rounds are looked up, not
    rendered (where the opening message is not in the signature: all but Llama 3.1), and
    exact, with and without a system message first, ending on a result or an answer."""
    rounds: list[Message] = []
    for i in range(8):
        args = json.dumps({"city": ["Oslo", "  Paris\n", "数据"][i % 3]})
        rounds.append(Message(role="assistant", content=None, tool_calls=[
            {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
        rounds.append(Message(role="tool", content=["sunny", "\n\n{\"t\": 21}\n", ""][i % 3], tool_call_id=f"c{i}",
                              name="get_weather"))
        if i % 3 == 2:
            rounds.append(Message(role="assistant", content=["Done.", "Next step."][i % 2]))
    system = Message(role="system", content="You are a coding agent.")
    for name, fam in families.items():
        c = fam.fresh()
        key, tools = c._tools_entry(TOOLS)
        assert c._tools_parts(key, tools)[3], name
        looked_up = 0
        for lead in ([system], []):
            for start in range(0, len(rounds) - 2):
                if rounds[start].role == "tool":
                    continue
                p = lead + rounds[start:]
                ref = fam.reference(p, TOOLS)
                if isinstance(ref, Exception):
                    continue
                sig = c._tools_signature(p, *c._tools_parts(key, tools))
                looked_up += sig is not None and (key, *sig) in c._marginals  # (no rendering)
                assert c.count_messages(p) + c.count_tools(TOOLS, p) == ref, (name, start, bool(lead))
                assert sig is not None and (key, *sig) in c._marginals
        if name != "llama3.1":
            assert looked_up >= 6, name


def test_a_new_tools_signature_is_costed_on_a_short_prompt_with_that_signature(families):
    """A long prompt whose tools signature is new (a new conversation, a cut moved past a user
    message: Llama 3.1 prints the tools into the first message after the system prompt) gets
    its tools' marginal cost from a short prompt of the same signature (its first units, those
    around the last user message, its last unit), not from rendering it whole: exact against
    transformers on every family, and taken on Llama 3.1, with the messages the counter was
    asked about before and after (its incremental state) unchanged."""
    rest: list[Message] = []
    for i in range(5):
        rest.append(Message(role="user", content=["Fix the build.", " And the docs\n", "数据?"][i % 3]))
        for j in range(2):
            cid = f"c{i}_{j}"
            rest.append(Message(role="assistant", content=None, tool_calls=[
                {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]))
            rest.append(Message(role="tool", content=f"result {i} {j}\n", tool_call_id=cid, name="get_weather"))
        rest.append(Message(role="assistant", content=f"Step {i} done."))
    system = Message(role="system", content="You are a coding agent.")
    for name, fam in families.items():
        c = fam.fresh()
        c._marginals.clear()  # (shared by the counters of a template: no signature seen yet)
        got: list = []
        short = c._short_marginal
        c._short_marginal = lambda *a, **k: got.append(short(*a, **k)) or got[-1]
        checked = 0
        for cut in range(0, len(rest) - 8):
            if rest[cut].role == "tool":
                continue
            p = [system] + rest[cut:]
            ref = fam.reference(p, TOOLS)
            if isinstance(ref, Exception):
                continue
            n = c.count_messages(p)
            assert n + c.count_tools(TOOLS, p) == ref, (name, cut)
            assert c._last_ms is None or c._last_ms[0] == p, name  # (the short prompt's signature left no trace)
            assert n + c.count_tools(TOOLS, p) == ref, (name, cut)  # (now looked up)
            checked += 1
        assert checked >= 10, name
        if name == "llama3.1":
            assert sum(x is not None for x in got) >= 5, got


def test_tools_whose_cost_depends_on_more_than_the_signature_are_rendered_whole(model_dirs):
    """A template printing the tools with something of every message (here a mark per
    message) fails the probes: its tools are never looked up by signature, and every count is
    the whole rendering's."""
    template = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                "{%- if tools %}{{ 'x ' * (messages | length) }}{{ tools | tojson }}{%- endif %}"
                "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    c = ChatTemplateTokenCounter(model_dirs["qwen3"], chat_template=template)
    key, tools = c._tools_entry(TOOLS)
    assert c._tools_parts(key, tools) is None
    ms = [Message(role="system", content="s"), Message(role="user", content="u")]
    costs = []
    for n in range(3):
        costs.append(c.count_tools(TOOLS, ms))
        assert costs[-1] == c.count_request(ms, TOOLS) - c.count_messages(ms)
        ms = ms + [Message(role="assistant", content="a"), Message(role="user", content="u")]
    assert costs[0] < costs[1] < costs[2]  # (what a signature lookup would have missed)
    qwen = ChatTemplateTokenCounter(model_dirs["qwen3"])
    key, tools = qwen._tools_entry(TOOLS)
    assert qwen._tools_parts(key, tools) == (False, False, False, True)  # (the real one: the system block)
    # a template that refuses the probes' conversations (all longer than two messages) proves
    # nothing either: rendered whole
    short = ("{%- if messages | length > 2 %}{{ raise_exception('two messages at most') }}{%- endif %}"
             + template)
    c = ChatTemplateTokenCounter(model_dirs["qwen3"], chat_template=short)
    key, tools = c._tools_entry(TOOLS)
    assert c._tools_parts(key, tools) is None
    ms = [Message(role="system", content="s"), Message(role="user", content="u")]
    assert c.count_tools(TOOLS, ms) == c.count_request(ms, TOOLS) - c.count_messages(ms) > 0


def test_the_tools_are_serialized_again_only_where_they_print_otherwise(families):
    """The counter keeps the last tool list's JSON (its caches' key): the same list, a new
    list of the same tool dicts, or an equal new list (printed alike) reuse it -- the equal
    list is then the one kept, so passing it again is the identity path --, while a list
    changed in place, a dict edited in place, an int that became a float (equal, printed
    otherwise; in a new list, or edited into the kept one in place, which ``==`` against the
    copy passed until session 32) or reordered keys are serialized again and counted as
    transformers counts them."""
    fam = families["qwen3"]
    c = fam.fresh()
    ms = [Message(role="system", content="Be brief."), Message(role="user", content="Weather in Oslo?")]
    tools = json.loads(json.dumps(TOOLS))
    tools[1]["function"]["parameters"]["properties"]["top_k"]["default"] = 3
    first = c._tools_entry(tools)
    assert c._tools_entry(tools) is first and c._tools_entry(list(tools)) is first
    fresh = json.loads(json.dumps(tools))
    assert c._tools_entry(fresh) is first and c._tools_seen[2] is fresh
    assert c._tools_seen[3] is None  # (a list built anew is compared, not snapshot: ~28 us)
    assert c._tools_entry(fresh) is first and c._tools_seen[3] is not None  # (passed again: snapshot)
    assert c._tools_entry(fresh) is first
    cost = c.count_tools(fresh, ms)
    assert c.count_messages(ms) + cost == fam.reference(ms, fresh)

    def changed(tool_list, how):
        got = c._tools_entry(tool_list)
        assert got is not first and got[0] != first[0], how
        assert got[0] == json.dumps(tool_list) and got[1] == tool_list
        assert c.count_messages(ms) + c.count_tools(tool_list, ms) == fam.reference(ms, tool_list), how
        c._tools_entry(fresh)  # (back to the first list for the next case)

    retyped = json.loads(json.dumps(tools))
    retyped[1]["function"]["parameters"]["properties"]["top_k"]["default"] = 3.0
    assert retyped == tools
    changed(retyped, "an int printed as a float")
    reordered = json.loads(json.dumps(tools))
    reordered[0]["function"] = dict(reversed(list(reordered[0]["function"].items())))
    changed(reordered, "keys in another order")
    same_dicts = list(fresh)
    same_dicts[0]["function"]["description"] = "Weather now."  # (a dict of the kept list, edited in place)
    changed(same_dicts, "a tool dict edited in place")
    fresh.append({"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}})
    changed(fresh, "the kept list grown in place")
    kept = json.loads(json.dumps(tools))
    first = c._tools_entry(kept)
    assert c._tools_entry(kept) is first and c._tools_seen[2] is kept
    kept[1]["function"]["parameters"]["properties"]["top_k"]["default"] = 3.0  # (still == to the copy)
    changed(kept, "an int of the kept list made an equal float in place")


def test_budget_filter_charges_tools_that_print_otherwise_anew(families):
    """A filter that budgeted a tool list, then gets one equal to it (``==``) but printed
    otherwise by the template -- an int now a float, keys in another order --, charges the new
    list's own cost: it keeps what a fresh filter keeps, within the budget (it reused the
    first list's cost before: a window one unit longer than a fresh filter's)."""
    fam = families["qwen3"]
    c = fam.fresh()
    tools = [{"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object", "properties": {"top_k": {"type": "integer", "default": 3}}}}}]
    retyped = json.loads(json.dumps(tools))
    retyped[0]["function"]["parameters"]["properties"]["top_k"]["default"] = 3.0
    reordered = [{"function": dict(reversed(list(tools[0]["function"].items()))), "type": "function"}]
    assert retyped == tools == reordered
    ms = [Message(role="system", content="Be brief.")]
    for i in range(6):
        ms += [Message(role="user", content=f"question {i} " * 5), Message(role="assistant", content=f"answer {i} " * 5)]
    ms.append(Message(role="user", content="last"))
    for other in (retyped, reordered):
        full = fam.reference(ms, other)
        assert full != fam.reference(ms, tools)
        for budget in range(fam.reference(ms[:3], other), full + 3):
            hot = TokenBudgetFilter(budget, counter=c)
            hot.apply(ms, tools_schema=tools)
            out = hot.apply(ms, tools_schema=other)
            assert out == TokenBudgetFilter(budget, counter=c).apply(ms, tools_schema=other), budget
            assert c.count_messages(out) + hot.tools_cost(other, out) == fam.reference(out, other) <= budget


def test_a_memo_entry_is_taken_only_by_its_own_message(families):
    """The counter memoizes a message's entry by its id, with a weak reference to it: an
    object that takes a dead message's id -- another message, a chat-completions dict, a copy
    of the message itself -- is not given that entry (simulated here by filing the entry under
    its id), and counts as transformers counts it."""
    fam = families["qwen3"]
    c = fam.fresh()
    a = Message(role="user", content="What is the weather in Oslo?")
    c.count_messages([a])
    entry = c._memo[id(a)]
    for other in (Message(role="user", content="Thanks."), {"role": "user", "content": "Thanks, bye."},
                  a.model_copy(update={"content": "What is the weather in Bergen?"})):
        c._memo[id(other)] = entry
        want = fam.reference([other if isinstance(other, Message) else Message(**other)])
        assert c.count_messages([other]) == want
        assert c.count_messages([a, other]) == fam.reference(
            [a, other if isinstance(other, Message) else Message(**other)])


def test_clear_cache_forgets_costs_and_counts_the_same_after(families):
    """``clear_cache`` drops what the counter learned (renderings, unit costs, the tools'
    costs by prompt signature) and counts the same afterwards."""
    c = families["llama3.1"].fresh()
    ms = [Message(role="system", content="Be brief."), Message(role="user", content="Weather in Oslo?")]
    before = (c.count_messages(ms), c.count_tools(TOOLS, ms), c.count_request(ms, TOOLS))
    assert c._marginals and c._texts and c._tools_seen is not None
    c.clear_cache()
    assert not c._marginals and not c._texts and not c._units and c._tools_seen is None
    assert (c.count_messages(ms), c.count_tools(TOOLS, ms), c.count_request(ms, TOOLS)) == before
    assert before[0] + before[1] == before[2] == families["llama3.1"].reference(ms, TOOLS)


# -- named templates: a "tool_use" template beside the default (Hermes 2 Pro, Command R) -----


@pytest.fixture(scope="module", params=["config", "files"])
def named(request, tmp_path_factory):
    """A model folder naming a "tool_use" template beside its default, in either layout
    transformers reads (a list in tokenizer_config.json; additional_chat_templates/), with
    transformers' tokenizer of it."""
    path = mk.named_model_dir(str(tmp_path_factory.mktemp("named")), request.param)
    return path, transformers.AutoTokenizer.from_pretrained(path)


def _named_reference(hf, ms, tools):
    try:
        return len(hf.apply_chat_template([message_to_template_dict(m) for m in ms], tools=tools,
                                          add_generation_prompt=True, tokenize=True, return_dict=False))
    except Exception as exc:  # the template refused
        return exc


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), tools=st.sampled_from([None, TOOLS, TOOLS[:1], []]))
def test_a_request_with_tools_counts_by_the_tool_use_template(named, ms, tools):
    """transformers renders a request with tools (an empty list too) by the "tool_use"
    template and one without by the default: ``count_messages + count_tools`` and
    ``count_request`` equal its counts either way, and ``render`` its text."""
    path, hf = named
    c = ChatTemplateTokenCounter(path)
    assert c._tool_use_template is not None and c.chat_template == mk.CHATML
    ref = _named_reference(hf, ms, tools)
    if isinstance(ref, Exception):
        with pytest.raises(MessageValidationError, match="chat template refused"):
            c.count_messages(ms) + c.count_tools(tools, ms)
        return
    assert c.count_messages(ms) + c.count_tools(tools, ms) == ref
    assert c.count_request(ms, tools) == ref
    if tools:
        text = hf.apply_chat_template([message_to_template_dict(m) for m in ms], tools=tools,
                                      add_generation_prompt=True, tokenize=False)
        assert c.render(ms, tools) == text


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=conversations(), budget=st.integers(150, 900), data=st.data())
def test_budget_filter_budgets_a_request_with_tools_by_the_tool_use_template(named, ms, budget, data):
    """The filter trims a request with tools by the "tool_use" template (whose tools block
    the default template does not print at all) and one without by the default, turn after
    turn on one filter: what it keeps fits ``max_tokens`` by transformers' exact count, and
    ``counter`` stays the user's."""
    path, hf = named
    c = ChatTemplateTokenCounter(path)
    flt = TokenBudgetFilter(max_tokens=budget, counter=c)
    for _ in range(3):
        tools = data.draw(st.sampled_from([None, TOOLS]))
        if isinstance(_named_reference(hf, ms, tools), Exception):
            return
        try:
            kept = flt.apply(ms, tools_schema=tools)
        except ContextBudgetError:
            continue
        assert flt.counter is c
        exact = _named_reference(hf, kept, tools)
        assert exact <= budget
        assert c.count_messages(kept) + flt.tools_cost(tools, kept) == exact


def test_tool_use_template_is_named_kept_and_required_where_named(named, tmp_path):
    import pickle

    path, hf = named
    ms = [Message(role="user", content="Weather in Paris?")]
    # by name, as apply_chat_template(chat_template="tool_use"): that template for every request
    by_name = ChatTemplateTokenCounter(path, chat_template="tool_use")
    assert by_name._tool_use_template is None and by_name.count_tools(TOOLS, ms) > 0
    assert by_name.count_messages(ms) == len(hf.apply_chat_template(
        [message_to_template_dict(m) for m in ms], chat_template="tool_use", add_generation_prompt=True,
        return_dict=False))
    # pickles by folder, the tool_use template included; a filter pickles with the user's counter
    c = ChatTemplateTokenCounter(path)
    flt = TokenBudgetFilter(2000, counter=c)
    flt.apply(ms, tools_schema=TOOLS)
    assert flt._counter is not c  # (the tool_use template's counter, not pickled)
    clone = pickle.loads(pickle.dumps(c))
    assert clone._tool_use_template == c._tool_use_template
    assert clone.count_tools(TOOLS, ms) == c.count_tools(TOOLS, ms) == _named_reference(hf, ms, TOOLS) - c.count_messages(ms)
    f2 = pickle.loads(pickle.dumps(flt))
    assert f2.counter.path == path and f2._counter is f2.counter
    assert f2.apply(ms, tools_schema=TOOLS) == ms and f2.tools_cost(TOOLS, ms) == c.count_tools(TOOLS, ms)
    # a transformers tokenizer holding the named templates (a dict) counts the same
    from_hf = ChatTemplateTokenCounter(hf)
    assert from_hf._tool_use_template == c._tool_use_template and from_hf.chat_template == c.chat_template
    assert from_hf.count_tools(TOOLS, ms) == c.count_tools(TOOLS, ms)
    # named templates without a default: transformers asks for a name, so do we
    import shutil

    bare = str(tmp_path / "no_default")
    shutil.copytree(path, bare)
    cfg = os.path.join(bare, "tokenizer_config.json")
    with open(cfg, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = [{"name": "tool_use", "template": mk.CHATML}, {"name": "rag", "template": mk.CHATML}]
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump(config, f)
    for p in (os.path.join(bare, "chat_template.jinja"), os.path.join(bare, "additional_chat_templates")):
        shutil.rmtree(p) if os.path.isdir(p) else (os.remove(p) if os.path.exists(p) else None)
    with pytest.raises(TokenizerLoadError, match=r"\['rag', 'tool_use'\] without a 'default'"):
        ChatTemplateTokenCounter(bare)
    assert ChatTemplateTokenCounter(bare, chat_template="rag").count_messages(ms) > 0


@pytest.mark.parametrize("mode", ["plain", "clear", "summarize"])
def test_presets_budget_requests_with_and_without_tools_by_their_templates(named, mode):
    """A ReAct builder (with clearing or summarizing) on a model naming a "tool_use" template,
    tools sent on some turns only: every prompt fits by transformers' count of the request
    actually sent (tools rendered by "tool_use", none by the default template)."""
    from jianmu_fast.memory.context.presets import for_react

    path, hf = named
    opts = {"clear": {"clear_tool_results": 2}, "summarize": {"summarize": lambda ms: f"summary of {len(ms)}"}}
    budget = 1200
    b = for_react("You are terse.", max_tokens=budget, token_counter=ChatTemplateTokenCounter(path),
                  **opts.get(mode, {}))
    state: dict = {"messages": []}
    sent = trimmed = 0
    for i in range(14):
        state["messages"].append(Message(role="user", content=f"Question {i}: " + "Paris " * (5 + 7 * (i % 4))))
        cid = f"c{i}"
        call = {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris" * (i % 3 + 1)})}}
        tools = TOOLS if i % 3 else None
        out = b.build(state, tools_schema=tools)
        assert _named_reference(hf, out, tools) <= budget
        sent += 1
        state["messages"] += [Message(role="assistant", content=None, tool_calls=[call]),
                              Message(role="tool", content="sunny " * (10 + 9 * (i % 5)), tool_call_id=cid, name="get_weather")]
        out = b.build(state, tools_schema=tools)
        assert _named_reference(hf, out, tools) <= budget
        trimmed += len([m for m in out if m.role != "system"]) < len(state["messages"])
        state["messages"].append(Message(role="assistant", content="It is sunny. " * (1 + i % 3)))
    assert sent == 14 and trimmed >= 5  # (the budget bites: most later prompts are trimmed)
