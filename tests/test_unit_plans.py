"""Unit plans (``ChatTemplateTokenCounter._plan``): a new unit's costs from its field values.

A unit whose frames are known is costed from the text runs between added tokens that hold its
field values, without assembling its renderings. These tests hold plan-costed counts to the
rendered ones (``_RENDER_FREE`` off: every unit rendered by Jinja and tokenized whole-piece),
on every bundled template, with texts made of the tokenizer's added tokens and their halves
(a value that holds an added token, or that could run into the next one, must leave the plan).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from jianmu_fast.memory.context import ChatTemplateTokenCounter, TokenBudgetFilter
from jianmu_fast.message import Message

_HERE = os.path.join(os.path.dirname(__file__), "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data_plans", os.path.join(_HERE, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]

#: the families whose units are costed by plans (every bundled template)
FAMILIES = ["qwen3", "hermes", "llama3.1", "mistral", "gpt-oss", "deepseek-v3"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Per family: (counter with plans, counter that renders every unit)."""
    out = {}
    for f in FAMILIES:
        path = mk.model_dir(f, str(tmp_path_factory.mktemp(f)))
        ref = ChatTemplateTokenCounter(path, engine="tokenizers")
        ref._RENDER_FREE = False
        out[f] = (path, ref)
    return out


def _fragments(counter: ChatTemplateTokenCounter) -> list[str]:
    tokens = sorted(t.content for t in counter._tok.get_added_tokens_decoder().values())[:12]
    return tokens + [t[: len(t) // 2] for t in tokens] + [t[len(t) // 2:] for t in tokens]


@st.composite
def _turns(draw, fragments: list[str]):
    word = st.one_of(st.sampled_from(["Paris", "sunny, 21°C", " x ", "\n", "数据", '"q"', "\\", "{}", "ok"]),
                     st.sampled_from(fragments), st.text(max_size=8))
    text = st.lists(word, min_size=1, max_size=5).map("".join)
    ms = [Message(role="system", content=draw(text))] if draw(st.booleans()) else []
    ms.append(Message(role="user", content=draw(text)))
    n = 0
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            calls, results = [], []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                calls.append({"id": f"call_{n}", "type": "function",
                              "function": {"name": "get_weather", "arguments": json.dumps({"city": draw(text)})}})
                results.append(Message(role="tool", content=draw(text), tool_call_id=f"call_{n}", name="get_weather"))
            ms.append(Message(role="assistant", content=None, tool_calls=calls))
            ms.extend(results)
        else:
            ms.append(Message(role="assistant", content=draw(text)))
            ms.append(Message(role="user", content=draw(text)))
    return ms


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_plan_costs_equal_rendered_costs(pairs, family, data):
    """Per-message costs and prompt counts equal those of rendering every unit, turn by turn
    along a growing history (the hot loop's calls), and on the whole conversation at once."""
    path, ref = pairs[family]
    c = ChatTemplateTokenCounter(path, engine="tokenizers")
    ms = data.draw(_turns(_fragments(c)))
    flt = TokenBudgetFilter(10_000, counter=c)
    history: list[Message] = []
    for m in ms:
        history.append(m)
        if m.role in ("user", "tool"):
            try:
                want = ref.count_request(history)
            except Exception:  # the template refuses (Llama 3.1: parallel calls)
                return
            kept = flt.apply(history)
            assert kept == history
            assert c.count_messages(kept) == want
    assert c.count_array(ms).tolist() == ref.count_array(ms).tolist()


def test_plans_are_used(pairs):
    """The hot loop's units follow their plans (a test that plans work at all)."""
    for family in FAMILIES:
        path, ref = pairs[family]
        c = ChatTemplateTokenCounter(path, engine="tokenizers")
        c._plans.clear()
        ms = [Message(role="system", content="s"), Message(role="user", content="u0")]
        for i in range(4):
            calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"i": i})}}]
            ms += [Message(role="assistant", content=None, tool_calls=calls),
                   Message(role="tool", content=f"r{i}", tool_call_id=f"c{i}", name="f"),
                   Message(role="assistant", content=f"a{i}"), Message(role="user", content=f"u{i + 1}")]
        for k in range(1, len(ms) + 1):  # one unit at a time: frames learned, then plans
            c.count_array(ms[k - 1:k])
        c._units.clear()
        c._local_units.clear()
        assert c.count_array(ms).tolist() == ref.count_array(ms).tolist()
        assert c.count_messages(ms) == ref.count_request(ms)
        assert any(p is not None for k, p in c._plans.items() if k[0] != "groups"), family


def test_a_value_running_into_an_added_token_leaves_the_plan():
    """A field value that ends with the start of an added token that runs into the template's
    next one (``...b`` + ``<s>``: the token ``b<s`` comes first) is off its plan and counted
    as rendered; so is one that holds an added token."""
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False),
                            AddedToken("b<s", special=True, normalized=False)])
    tpl = "{% for m in messages %}<s>{{ m.role }} {{ m.content }}{% endfor %}<s>"
    c = ChatTemplateTokenCounter(tok, tpl)
    ref = ChatTemplateTokenCounter(tok, tpl)
    ref._RENDER_FREE = False
    for content in ["a b", "b a", "x ab", "a <s> b", "b<s", "ab", "b"]:
        ms = [Message(role="user", content="a"), Message(role="assistant", content=content),
              Message(role="user", content=content)]
        c.count_array(ms)  # (frames learned, then plans)
        c._units.clear()
        c._local_units.clear()
        assert c.count_array(ms).tolist() == ref.count_array(ms).tolist(), content
        assert c.count_messages(ms) == ref.count_request(ms), content
    assert any(p is not None for k, p in c._plans.items() if k[0] != "groups")  # (plans, not plan groups)


_odd = st.one_of(st.sampled_from(['q"uo\\te', "数据 é 🙂", "", "a\nb", "<tool_call>", "\x00", "call_0"]),
                 st.text(max_size=8))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | _odd,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_odd, inner, max_size=3), max_leaves=6)


@st.composite
def _call_messages(draw):
    calls = []
    args = st.one_of(st.dictionaries(_odd, _json, max_size=3).map(json.dumps), _json.map(json.dumps),
                     st.just("not json {"), st.just(" {} "), st.just("\ufeff{}"))
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 2)) == 0:  # the usual call (call_entry's fast path)
            calls.append({"id": draw(_odd.filter(bool)), "type": "function",
                          "function": {"name": draw(_odd.filter(bool)), "arguments": draw(args)}})
            continue
        fn: dict = {}
        for k in draw(st.one_of(st.just(["name", "arguments"]), st.permutations(["name", "arguments"]))):
            if k == "arguments" and draw(st.integers(0, 5)) == 0:
                continue
            if k == "name":
                fn[k] = draw(_odd.filter(bool))
            else:
                fn[k] = draw(args)
        call: dict = {}
        # (the usual call's key order and type half of the time: call_entry's fast path)
        for k in draw(st.one_of(st.just(["id", "type", "function", "index"]),
                                st.permutations(["id", "type", "function", "index"]))):
            if k == "function":
                call[k] = fn
            elif k == "index":
                if draw(st.booleans()):
                    call[k] = draw(st.integers(0, 3))
            elif draw(st.integers(0, 4)):
                call[k] = draw(st.one_of(st.just("function"), _odd, st.none()) if k == "type" else st.one_of(_odd, st.none()))
        calls.append(call)
    content = draw(st.one_of(st.none(), _odd))
    return Message(role="assistant", content=content, tool_calls=calls or None,
                   name=draw(st.one_of(st.none(), st.just("bot"))))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=_call_messages())
def test_call_entry_is_the_general_path(pairs, m):
    """The one-pass entry of a tool-call message (template dict, key, frame part) equals the
    general path's, or declines."""
    from jianmu_fast.memory.context.chat_template import _call_entry, _message_key, message_to_template_dict

    path, ref = pairs["qwen3"]
    got = _call_entry(m) if m.tool_calls else None
    if got is None:
        return
    d = message_to_template_dict(m)
    assert got[0] == d and list(got[0]) == list(d)
    assert json.dumps(got[0]) == json.dumps(d)  # key order inside the calls too
    assert got[1] == _message_key(d)
    assert got[2] == ref._frames.frame_of(d)


#: every neighbour pair a unit is costed between (the final-answer contexts are gpt-oss's)
_PAIRS = tuple((p, s) for p in ("first", "system", "user", "assistant", "tool", "call")
               for s in ("user", "assistant", "system", "call", "user_final", "call_final", "system_final"))


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_planned_costs_equal_each_pairs_planned_cost(pairs, family, data):
    """``planned_costs`` (a unit's plans between many neighbours at once, value runs shared)
    gives each pair what ``planned_cost`` gives it alone, on both builds; and what rendering
    the unit there gives, where it has a plan."""
    from jianmu_fast import _template_core, _template_core_py

    path, ref = pairs[family]
    c = ChatTemplateTokenCounter(path, engine="tokenizers")
    ms = data.draw(_turns(_fragments(c)))
    try:
        c.count_array(ms)  # (frames learned where the hot loop renders)
        c.count_messages(ms)
    except Exception:  # the template refuses (Llama 3.1: parallel calls)
        return
    keys, dicts, _ = c._entries_stable(ms)
    starts = [i for i, d in enumerate(dicts) if i == 0 or d["role"] != "tool"] + [len(ms)]
    for a, b in zip(starts, starts[1:]):
        ukeys = tuple(keys[a:b])
        want = [c._planned_cost(ukeys, p, s) for p, s in _PAIRS]
        # (the compiled build takes a counter of its own CounterCore: not in the pure-Python run)
        for core in (_template_core, _template_core_py):
            if core is _template_core_py or isinstance(c, core.CounterCore):
                assert core.planned_costs(c, ukeys, _PAIRS) == want
        blind, ref._succ_blind = ref._succ_blind, False  # (rendered between these very stand-ins)
        try:
            for (p, s), got in zip(_PAIRS, want):
                if got is not None and not (p == "first" and s.startswith("system")):  # (costed otherwise)
                    assert got == list(ref._unit_cost(ukeys, p, s)), (p, s)
        finally:
            ref._succ_blind = blind


def _hot_loop(c: ChatTemplateTokenCounter, ref: ChatTemplateTokenCounter, ms: list[Message]) -> None:
    """Replay ``ms`` as an agent loop (an unbounded budget filter, a count before each model
    call) and hold each count of ``c`` to the rendered one of ``ref``."""
    flt = TokenBudgetFilter(10**6, counter=c)
    history: list[Message] = []
    for m in ms:
        history.append(m)
        if m.role in ("user", "tool"):
            assert c.count_messages(flt.apply(history)) == ref.count_request(history)


@pytest.mark.parametrize("family", FAMILIES)
def test_long_values_count_as_rendered_each_time_they_are_costed(pairs, family):
    """Value runs holding a long value (a tool output, past ``_UNCACHED_RUN``) are kept built
    and checked (``_run_texts``); a unit costed between many neighbours, and again by the
    exact count, counts what rendering it gives, also where the value holds an added token or
    half of one (off the plan, remembered as such)."""
    path, ref = pairs[family]
    c = ChatTemplateTokenCounter(path, engine="tokenizers")
    frags = _fragments(c)
    outputs = [json.dumps({"rows": list(range(120))}), "x" * 300 + frags[0] + "y" * 40,
               "数据 " * 90 + frags[-1], "Oslo: -3°C, snow. " * 20 + frags[len(frags) // 2]]
    ms = [Message(role="system", content="s"), Message(role="user", content="u")]
    for i, out in enumerate(outputs * 2):
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": out[:30]})}}]
        ms += [Message(role="assistant", content=None, tool_calls=calls),
               Message(role="tool", content=out, tool_call_id=f"c{i}", name="f"),
               Message(role="assistant", content=out[-280:]), Message(role="user", content=out)]
    for _ in range(2):  # the second time with the frames and plans of the first
        c = ChatTemplateTokenCounter(path, engine="tokenizers")
        _hot_loop(c, ref, ms)
        assert c.count_array(ms).tolist() == ref.count_array(ms).tolist()
    assert c._run_texts


@pytest.mark.parametrize("family", FAMILIES)
def test_a_long_tool_output_is_tokenized_once(pairs, family):
    """A tool output past ``_HUGE_PIECE`` characters is tokenized once, in the turn that
    brings it, though its unit is costed between several neighbours and the exact count asks
    for it again, and not again in the turns after it: its run's text is kept by the
    identities of its values, the piece by its own (no hashing pass over either). The counts
    stay the rendered ones."""
    from jianmu_fast import _backend

    path, ref = pairs[family]

    def conversation(tag: str) -> list[Message]:
        ms = [Message(role="system", content="s"), Message(role="user", content="u")]
        for i in range(3):
            out = json.dumps({"tag": f"{tag}{i}", "rows": [f"line {k} of {tag}{i}" for k in range(160)]})
            assert len(out) > _backend.template_core()._HUGE_PIECE
            calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": i})}}]
            ms += [Message(role="assistant", content=None, tool_calls=calls),
                   Message(role="tool", content=out, tool_call_id=f"c{i}", name="f")]
        return ms + [Message(role="assistant", content="done"), Message(role="user", content="next")]

    def replay(ms: list[Message], tag: str) -> dict[str, int]:
        c = ChatTemplateTokenCounter(path, engine="tokenizers")
        encoded: dict[str, int] = {}
        plain = c._encode_lengths

        def spy(texts):
            for t in texts:
                for i in range(3):
                    if f'{tag}{i}' in t:
                        encoded[f"{tag}{i}"] = encoded.get(f"{tag}{i}", 0) + 1
            return plain(texts)

        c._encode_lengths = spy
        _hot_loop(c, ref, ms)
        return encoded

    replay(conversation("warm"), "warm")  # (the template's frames and plans learned)
    assert replay(conversation("seen"), "seen") == {"seen0": 1, "seen1": 1, "seen2": 1}
