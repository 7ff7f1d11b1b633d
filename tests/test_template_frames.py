"""Render-free frames (``_template_frames``): a conversation assembled from a cached frame is
the very text the template renders, for every bundled template and for templates that read
their messages' fields; a template that transforms or measures a field is never assembled."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.memory.context import ChatTemplateTokenCounter
from jianmu_fast.memory.context._template_frames import Frames, Probe, remember_json, tojson
from jianmu_fast.message import Message

_HERE = os.path.join(os.path.dirname(__file__), "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(_HERE, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def counters(tmp_path_factory):
    return {f: ChatTemplateTokenCounter(mk.model_dir(f, str(tmp_path_factory.mktemp(f))), engine="tokenizers")
            for f in mk.FAMILIES}


@pytest.fixture(scope="module")
def tok(counters):
    return counters["qwen3"]._tok


_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "x", "  padded  ", "a\nb", '"q" \\ <b>&', "</think>", "<think>\nhm\n</think>\n\nok",
                     "<|im_start|>", "<tool_response>", "<|channel|>final<|message|>", "数据 é 🙂", "X" * 40]),
)


_args = st.one_of(
    st.dictionaries(_text, st.recursive(st.none() | st.integers() | st.floats(allow_nan=False) | _text,
                                        lambda x: st.lists(x, max_size=2) | st.dictionaries(_text, x, max_size=2),
                                        max_leaves=5), max_size=3),
    st.just({}), st.just("not json {"), st.just([1, "a"]),
)


@st.composite
def dialogues(draw):
    out = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(_text)})
    n = 0
    for _ in range(draw(st.integers(1, 3))):
        out.append({"role": "user", "content": draw(_text)})
        if draw(st.booleans()):
            calls = []
            for _ in range(draw(st.integers(1, 3))):  # parallel calls, odd ids, names and arguments
                n += 1
                cid = draw(st.one_of(st.just(f"c{n}"), _text.filter(bool)))
                name = draw(st.one_of(st.just("get"), _text.filter(bool)))
                calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": draw(_args)}})
            out.append({"role": "assistant", "content": draw(st.one_of(st.just(""), _text)), "tool_calls": calls})
            for call in calls:
                out.append({"role": "tool", "content": draw(_text), "tool_call_id": call["id"],
                            "name": call["function"]["name"]})
        if draw(st.booleans()):
            out.append({"role": "assistant", "content": draw(_text)})
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=dialogues(), name=st.sampled_from(mk.FAMILIES))
def test_frames_give_the_rendered_text_on_every_bundled_template(counters, ms, name):
    """Any conversation: the frame-assembled text equals the template's rendering (or the
    template's refusal), with every real message's fields probed."""
    c = counters[name]
    frames = Frames(c._render_plain)
    try:
        want = c._render_plain(ms)
    except Exception as exc:
        with pytest.raises(type(exc)):
            frames.render(ms)
        return
    assert frames.render(ms) == want
    assert frames.render(ms) == want  # now from the learned frame, when it was kept


_TEMPLATES = {
    # the answer of a predicate is replayed on each content: assembled only when it agrees
    "in": "{% for m in messages %}{% if 'x' in m.content %}X{% endif %}<{{ m.role }}>{{ m.content }}\n{% endfor %}",
    "startswith": "{% for m in messages %}{% if m.content.startswith('<t') %}T{% endif %}[{{ m.content }}]{% endfor %}",
    "truth": "{% for m in messages %}{% if m.content %}({{ m.content }}){% else %}-{% endif %}{% endfor %}",
    "tojson": "{% for m in messages %}{{ {'role': m.role, 'content': m.content} | tojson }}\n{% endfor %}",
    # a field stripped: the stripped value assembled (a derived slot), something to strip or not
    "trim": "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n{% endfor %}",
    "strip_chars": "{% for m in messages %}<{{ m.content.strip('\\n ') }}>{% if m.content.lstrip('x') %}L{% endif %}{% endfor %}",
    "rstrip_tojson": "{% for m in messages %}{{ m.content.rstrip() | tojson }}|{{ m.content }}{% endfor %}",
    # a field transformed or measured: never assembled
    "tojson_ascii": "{% for m in messages %}{{ m.content | tojson(ensure_ascii=True) }}{% endfor %}",
    "length": "{% for m in messages %}{{ m.content | length }}:{{ m.content }}{% endfor %}",
    "slice": "{% for m in messages %}{{ m.content[:5] }}{% endfor %}",
    "split": "{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}",
    "upper": "{% for m in messages %}{{ m.content | upper }}{% endfor %}",
    "concat_trim": "{% for m in messages %}{{ ('<' + m.content) | trim }}{% endfor %}",
    "join_trim": "{% for m in messages %}{{ (m.role ~ m.content) | trim }}{% endfor %}",
    "replace": "{% for m in messages %}{{ m.content | replace('<', '[') }}{% endfor %}",
    "escape": "{% for m in messages %}{{ m.content | e }}{% endfor %}",
    "compare_two": "{% for m in messages %}{% if m.content == messages[0].content %}same{% endif %}{{ m.content }}{% endfor %}",
    "wordcount": "{% for m in messages %}{{ m.content | wordcount }}{{ m.content }}{% endfor %}",
    "in_dict": "{% for m in messages %}{% if m.content in {'a': 1} %}A{% endif %}{{ m.content }}{% endfor %}",
    "strip_twice": "{% for m in messages %}{{ m.content.strip().lstrip('x') }}{% endfor %}",
}
_NEVER = {"strip_twice", "join_trim", "tojson_ascii", "length", "slice", "split", "upper", "concat_trim", "replace", "escape",
          "compare_two", "wordcount", "in_dict"}


@pytest.mark.parametrize("name", sorted(_TEMPLATES))
def test_templates_that_read_a_field(tok, name):
    """Counts equal the rendering's on contents that do and do not change the template's
    path; a template that transforms or measures a field is never assembled from a frame."""
    c = ChatTemplateTokenCounter(tok, _TEMPLATES[name], engine="tokenizers")
    ref = ChatTemplateTokenCounter(tok, _TEMPLATES[name], engine="tokenizers")
    ref._RENDER_FREE = False
    contents = ["hello", "x marks", "<think>ok", "  spaced  ", "", 'q"uo\\te\n<b>&', "数据 é", "a b c d e f",
                "\n lined \n", "xx"]
    for first in ("hi", "x"):
        for content in contents:
            ms = [Message(role="user", content=first), Message(role="assistant", content=content),
                  Message(role="user", content=content + " again")]
            assert c.count_array(ms).tolist() == ref.count_array(ms).tolist(), (name, content)
            assert c.count_messages(ms) == ref.count_messages(ms) == ref.count_request(ms), (name, content)
    stats = c._frames.stats()
    # a frame with a content slot (the field these templates read) is never kept; frames of
    # tool-call messages (content "", the call's id, name and arguments as slots these
    # templates never read) may be
    kept = [key for key, entry in c._frames._frames.items() if entry is not None]
    with_content = [key for key in kept if any(("content", None) in shape for shape in key if type(shape) is tuple)]
    if name in _NEVER:
        assert with_content == [], with_content
    else:
        assert stats["fast"] > 0 and with_content, stats


def test_a_predicate_answer_that_differs_renders():
    f = Frames(lambda ds: "".join(("X" if "x" in d["content"] else "") + d["content"] for d in ds))
    assert f.render([{"role": "user", "content": "abc"}]) == "abc"
    assert f.render([{"role": "user", "content": "xyz"}]) == "Xxyz"  # 'x' in: answer differs -> rendered
    assert f.render([{"role": "user", "content": "def"}]) == "def"
    assert f.stats() == {"frames": 1, "fast": 2, "rendered": 1}


def test_probe_records_reads():
    log: list = []
    p = Probe("ab", log, 0)
    assert str(p) is p and isinstance(f"{p}", Probe) and log == []  # printing is not reading
    assert ("a" in p) and p.startswith("a") and p
    assert log == [(0, "__contains__", ("a",), True), (0, "startswith", ("a",), True), (0, "__bool__", (), True)]
    assert isinstance("<" + p, Probe) and isinstance(p + ">", Probe)
    len(p)
    assert log[-1] == ("reject",)


def test_counter_counts_equal_with_and_without_frames(counters):
    """The hot loop's counts, frames on and off, equal (and equal full renderings)."""
    for name, c in counters.items():
        off = ChatTemplateTokenCounter(c.path, engine="tokenizers")
        off._RENDER_FREE = False
        ms = [Message(role="system", content="Be brief."), Message(role="user", content="Weather in Paris?")]
        for i in range(6):
            args = json.dumps({"city": f"Paris {i}"})
            ms.append(Message(role="assistant", content=None, tool_calls=[
                {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]))
            ms.append(Message(role="tool", content=f'{{"t": "{20 + i}°C"}}\n', tool_call_id=f"c{i}", name="get_weather"))
            ms.append(Message(role="assistant", content=f"It is {20 + i}°C <b>."))
            ms.append(Message(role="user", content=f"And now {i}?"))
            assert c.count_array(ms).tolist() == off.count_array(ms).tolist(), name
            assert c.count_messages(ms) == off.count_messages(ms) == off.count_request(ms), name


def _call_message(i: int, args: dict) -> Message:
    return Message(role="assistant", content=None, tool_calls=[
        {"id": f"call_{i}", "type": "function", "function": {"name": f"get_{i}", "arguments": json.dumps(args)}}])


@pytest.mark.parametrize("name", ["qwen3", "hermes", "llama3.1", "mistral"])
def test_a_tool_call_only_message_is_assembled_not_rendered(counters, name):
    """Once its frame is learned, an assistant message that only calls tools (new id, name and
    arguments each turn) is assembled from the frame: no Jinja rendering, the same count."""
    c = ChatTemplateTokenCounter(counters[name].path, engine="tokenizers")
    renders = []
    render = c._render
    c._render = lambda *a: renders.append(1) or render(*a)  # type: ignore[method-assign]
    ms = [Message(role="user", content="Weather?")]
    for i in range(4):
        ms = ms + [_call_message(i, {"city": f"Paris {i}", "days": [i, {"u": "°C"}]}),
                   Message(role="tool", content=f"{20 + i}°C", tool_call_id=f"call_{i}", name=f"get_{i}")]
        before = len(renders)
        n = c.count_messages(ms)
        if i >= 2:  # the unit's frames were learned on the first calls
            assert len(renders) == before, (name, i)
        assert n == c.count_request(ms)


_CALL_TEMPLATES = {
    # printed verbatim / as tojson with default options: assembled
    "verbatim": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% for tc in m.tool_calls or [] %}"
                "[{{ tc.id }}:{{ tc.function.name }}:{{ tc.function.arguments | tojson }}]{% endfor %}\n{% endfor %}",
    "whole_call_tojson": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                         "{{ tc | tojson }}{% endfor %}\n{% endfor %}",
    # read any other way (a truth test on the arguments, the printed arguments sliced): rendered
    "args_truth": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}{% if tc.function.arguments %}"
                  "A{{ tc.function.arguments | tojson }}{% else %}none{% endif %}{% endfor %}\n{% endfor %}",
    "args_slice": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                  "{{ (tc.function.arguments | tojson)[:2] }}{% endfor %}\n{% endfor %}",
    "name_upper": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                  "{{ tc.function.name | upper }}{{ tc.function.arguments | tojson }}{% endfor %}\n{% endfor %}",
    "args_indent": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                   "{{ tc.function.arguments | tojson(indent=2) }}{% endfor %}\n{% endfor %}",
    "args_sorted": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                   "{{ tc.function.arguments | tojson(sort_keys=True) }}{% endfor %}\n{% endfor %}",
    "args_items": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                  "{% for k, v in tc.function.arguments.items() %}{{ k }}={{ v }};{% endfor %}{% endfor %}\n{% endfor %}",
    "args_length": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                   "{{ tc.function.arguments | length }}{% endfor %}\n{% endfor %}",
    "args_str": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                "{{ tc.function.arguments }}{% endfor %}\n{% endfor %}",
    "args_key": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                "{{ tc.function.arguments.city }}{% endfor %}\n{% endfor %}",
    "id_length": "{% for m in messages %}{{ m.content }}{% for tc in m.tool_calls or [] %}"
                 "{% if tc.id | length != 9 %}{{ raise_exception('bad id') }}{% endif %}{{ tc.id }}{% endfor %}\n{% endfor %}",
}
_CALLS_ASSEMBLED = {"verbatim", "whole_call_tojson"}


@pytest.mark.parametrize("name", sorted(_CALL_TEMPLATES))
def test_templates_that_read_a_tool_call(tok, name):
    """A tool call's slots are assembled only where the template prints them verbatim or via
    default tojson (truth tests replayed); counts equal the rendering's either way."""
    c = ChatTemplateTokenCounter(tok, _CALL_TEMPLATES[name], engine="tokenizers")
    ref = ChatTemplateTokenCounter(tok, _CALL_TEMPLATES[name], engine="tokenizers")
    ref._RENDER_FREE = False
    for i, args in enumerate([{"city": "Paris", "n": [1, {"a": None}]}, {}, {"city": 'q"é 数据\n'}, {"b": 1, "a": 2}]):
        ms = [Message(role="user", content="hi"), _call_message(i, args),
              Message(role="tool", content="ok", tool_call_id=f"call_{i}", name=f"get_{i}"),
              Message(role="user", content="more")]
        try:
            want = ref.count_request(ms)
        except Exception:
            with pytest.raises(Exception, match="refused"):
                c.count_messages(ms)
            continue
        assert c.count_messages(ms) == want and c.count_array(ms).tolist() == ref.count_array(ms).tolist(), (name, args)
    kept = [key for key, entry in c._frames._frames.items() if entry is not None]
    with_calls = [key for key in kept if any(type(shape) is tuple and any(
        type(f) is tuple and f[0] == "tool_calls" for f in shape) for shape in key)]
    assert bool(with_calls) == (name in _CALLS_ASSEMBLED), with_calls


def test_tojson_keeps_its_outputs_only_for_the_objects_registered():
    """``remember_json``: a registered object's ``tojson`` output is kept per options (the
    same text as ``json.dumps`` for each, a list of separators too); an object not registered
    is printed each time (a change to it shows)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"x": [1, "数"]}}}
    remember_json([tool])
    for opts in ({}, {"indent": 4}, {"indent": 2, "separators": [",", ": "]}, {"sort_keys": True}):
        want = json.dumps(tool, ensure_ascii=False, **opts)
        assert tojson(tool, **opts) == want and tojson(tool, **opts) == want, opts
    free = {"a": 1}
    assert tojson(free, indent=4) == json.dumps(free, indent=4)
    free["a"] = 2
    assert tojson(free, indent=4) == json.dumps(free, indent=4)
