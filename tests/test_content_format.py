"""``ChatTemplateTokenCounter(content_format=...)``: counts of what vLLM's OpenAI server renders.

vLLM (and SGLang after it) normalizes a message's content before rendering the template, by
the template's content format: "string" (text blocks joined by newlines) or "openai" (a list
of text blocks, a string content as one), detected from the template's syntax tree with
"auto". transformers passes the content as given (``content_format=None``, the default). The
reference here is independent of the library: ``vllm_conversation`` below rebuilds what vLLM's
``parse_chat_messages`` gives the template (vllm/entrypoints/chat_utils.py:
``_parse_chat_message_content``, ``_postprocess_messages``), and transformers renders and
tokenizes it with the counter's own template.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.errors import MessageValidationError
from jianmu_fast.memory.context import ChatTemplateTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context._content_format import content_format_of
from jianmu_fast.memory.context.chat_template import message_to_template_dict
from jianmu_fast.message import Message, ai, human, system, tool

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from test_chat_template_counter import TOOLS, conversations, mk  # noqa: E402  (the bundled templates)

FAMILIES = mk.FAMILIES
_TEXT_KEY = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def vllm_conversation(messages, fmt):
    """The conversation vLLM's OpenAI server renders for these messages under ``fmt``."""
    out = []
    for m in messages:
        o = m.to_openai()
        content = o.get("content")
        blocks = [] if content is None else [{"type": "text", "text": content}] if isinstance(content, str) else content
        items = []
        for b in blocks:
            t = b.get(_TEXT_KEY[b["type"]])
            if t is None and b["type"] in ("text", "refusal"):
                continue  # (vLLM skips these with a warning)
            item = {"type": "text", "text": t} if fmt == "openai" else t
            if item:  # (vLLM keeps only truthy parts: an empty text is dropped under "string")
                items.append(item)
        d = {"role": o["role"], "content": items if fmt == "openai" else "\n".join(items)}
        if o["role"] == "assistant" and o.get("tool_calls") is not None:
            d["tool_calls"] = []
            for call in o["tool_calls"]:
                call = json.loads(json.dumps(call))
                args = call["function"].get("arguments")
                call["function"]["arguments"] = json.loads(args) if args else {}
                d["tool_calls"].append(call)
        if o["role"] == "tool" and "tool_call_id" in o:
            d["tool_call_id"] = o["tool_call_id"]
        if isinstance(o.get("name"), str):
            d["name"] = o["name"]
        out.append(d)
    return out


_REFS: dict = {}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return {f: mk.model_dir(f, str(tmp_path_factory.mktemp(f))) for f in FAMILIES}


def _hf(family, path):
    if family not in _REFS:
        _REFS[family] = transformers.AutoTokenizer.from_pretrained(path)
    return _REFS[family]


def reference(hf, counter, messages, tools, fmt):
    """transformers' count of vLLM's conversation, rendered by ``counter``'s template (its
    "tool_use" one for a request with tools where it has one), or the exception raised."""
    template = counter._tool_use_template if tools is not None and counter._tool_use_template else counter.chat_template
    try:
        conv = [message_to_template_dict(m) for m in messages] if fmt is None else vllm_conversation(messages, fmt)
        return len(hf.apply_chat_template(conv, tools=tools, chat_template=template, add_generation_prompt=True,
                                          tokenize=True, return_dict=False))
    except Exception as exc:
        return exc


# -- detection ----------------------------------------------------------------------------------

_LOOP = "{%- for message in messages %}"


@pytest.mark.parametrize("template, expected", [
    (_LOOP + "{{ message['content'] }}{% endfor %}", "string"),
    (_LOOP + "{% for c in message['content'] %}{{ c['text'] }}{% endfor %}{% endfor %}", "openai"),
    (_LOOP + "{% for c in message.content %}{{ c.text }}{% endfor %}{% endfor %}", "openai"),
    # through a filter, a slice, a variable set from messages (Llama 3's loop_messages), a chain of them
    (_LOOP + "{% for c in message.content | selectattr('type', 'equalto', 'text') %}{{ c.text }}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% for m in messages[1:] %}{% for c in m['content'][:2] %}{{ c.text }}{% endfor %}{% endfor %}", "openai"),
    ("{% set loop_messages = messages[1:] %}{% set rest = loop_messages %}{% for m in rest %}"
     "{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}", "openai"),
    # a loop over something else's content, or over an element picked by index: not followed
    ("{% for c in tools[0].content %}{{ c }}{% endfor %}" + _LOOP + "{{ message.content }}{% endfor %}", "string"),
    ("{% set first = messages[0] %}{% for c in first.content %}{{ c.text }}{% endfor %}", "string"),
    (_LOOP + "{% for c in message['text'] %}{{ c }}{% endfor %}{% endfor %}", "string"),
    # what vLLM cannot follow (a tuple target, a template that does not parse): its default, "string"
    ("{% for i, m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}", "string"),
    (_LOOP + "{% for c in message.content %}{{ c }}", "string"),
    ("no loops at all", "string"),
])
def test_content_format_is_detected_as_vllm_detects_it(template, expected):
    assert content_format_of(template) == expected


def test_bundled_templates_have_the_formats_vllm_gives_them(dirs):
    """Llama 3.1 loops over a message's content blocks (vLLM gives it block lists); the others
    print a string."""
    got = {f: ChatTemplateTokenCounter(dirs[f], content_format="auto").content_format for f in FAMILIES}
    assert got == {f: "openai" if f == "llama3.1" else "string" for f in FAMILIES}
    assert ChatTemplateTokenCounter(dirs["qwen3"]).content_format is None


# -- exactness ----------------------------------------------------------------------------------

_block_types = st.sampled_from(["text", "text", "text", "input_text", "output_text", "refusal", "thinking"])


@st.composite
def with_blocks(draw, fmt_free: bool = True):
    """``conversations()`` (no reasoning fields), some contents as block lists (split at random,
    empty texts, text-like blocks of every type), some None, some ""."""
    ms = draw(conversations(reasoning=False))
    out = []
    for m in ms:
        kind = draw(st.sampled_from(["same", "same", "blocks", "blocks", "none", "empty"]))
        if kind == "blocks" and isinstance(m.content, str):
            text = m.content
            cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=2)))
            pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
            blocks = []
            for p in pieces:
                t = draw(_block_types)
                blocks.append({"type": t, _TEXT_KEY[t]: p})
            m = m.model_copy(update={"content": blocks})
        elif kind == "none" and m.role in ("assistant", "tool", "user"):
            m = m.model_copy(update={"content": None})
        elif kind == "empty":
            m = m.model_copy(update={"content": ""})
        out.append(m)
    return out


@pytest.mark.parametrize("fmt", [None, "string", "auto"])
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_counts_equal_what_vllm_renders(dirs, family, fmt, data):
    """Every bundled template, as given (transformers: the blocks passed as they are, their
    texts a frame's slots), "string" and its own format ("auto": "openai" for Llama 3.1):
    ``count_messages + count_tools`` equals transformers' count of the conversation vLLM
    builds, and the per-message charges bound it; a refusal there is our
    ``MessageValidationError``. One counter per case, its caches carried over examples.
    ("openai" forced on a template that concatenates the content refuses every system
    message, the stand-ins' too: a misconfiguration vLLM's detection never picks.)"""
    counter = _counter(dirs, family, fmt)
    hf = _hf(family, dirs[family])
    ms = data.draw(with_blocks())
    tools = TOOLS if data.draw(st.booleans()) else None
    ref = reference(hf, counter, ms, tools, counter.content_format)
    if isinstance(ref, Exception):
        with pytest.raises(MessageValidationError):
            counter.count_messages(ms) + counter.count_tools(tools, ms)
        return
    assert counter.count_messages(ms) + counter.count_tools(tools, ms) == ref
    assert counter.count_request(ms, tools) == ref
    assert counter.count_messages([]) + int(counter.count_array(ms).sum()) >= ref - counter.count_tools(tools, ms)


_COUNTERS: dict = {}


def _counter(dirs, family, fmt):
    """One counter per family and format for the module (its caches carry over examples, as a
    long-lived counter's do)."""
    if (family, fmt) not in _COUNTERS:
        _COUNTERS[family, fmt] = ChatTemplateTokenCounter(dirs[family], content_format=fmt)
    return _COUNTERS[family, fmt]


def test_block_contents_count_by_the_format(dirs):
    """The same conversation, three ways on Qwen3 (a "string" template that prints only string
    content): transformers passes the blocks and Qwen3 prints nothing for them; vLLM joins their
    texts (one more line, "Hello\\nthere"); "openai" gives every content as blocks, and Qwen3
    prints none of them."""
    ms = [system("Be brief."), human([{"type": "text", "text": "Hello"}, {"type": "text", "text": ""},
                                      {"type": "text", "text": "there"}]), ai("Hi."), human("ok?")]
    hf = _hf("qwen3", dirs["qwen3"])
    as_given = ChatTemplateTokenCounter(dirs["qwen3"])
    string = ChatTemplateTokenCounter(dirs["qwen3"], content_format="string")
    openai = ChatTemplateTokenCounter(dirs["qwen3"], content_format="openai")
    assert as_given.count_messages(ms) == 32 == len(hf.apply_chat_template(
        [m.to_openai() for m in ms], add_generation_prompt=True, tokenize=True, return_dict=False))
    assert "Hello\nthere<|im_end|>" in string.render(ms) and "Hello" not in as_given.render(ms)
    assert string.count_messages(ms) == 35 == reference(hf, string, ms, None, "string")
    # (forced on Qwen3, "openai" gives its system header a list to concatenate: refused, as
    # vLLM forced so would refuse it; without one, no content is printed at all)
    with pytest.raises(MessageValidationError, match="can only concatenate str"):
        openai.count_messages(ms)
    assert openai.count_messages(ms[1:]) == reference(hf, openai, ms[1:], None, "openai") == 20
    assert "ok?" not in openai.render(ms[1:])
    # Llama 3.1 loops over blocks and trims each: "auto" is "openai" there, and counts as vLLM does
    llama = ChatTemplateTokenCounter(dirs["llama3.1"], content_format="auto")
    assert llama.count_messages(ms) == reference(_hf("llama3.1", dirs["llama3.1"]), llama, ms, None, "openai")


def test_an_empty_content_and_none_differ_under_openai(dirs):
    """vLLM gives an explicit "" as one empty text block and no content as ``[]``: a template
    that tests the list's truth tells them apart, and so does the count."""
    tpl = ("{% for m in messages %}<{{ m.role }}>{% if m.content %}[{% for c in m.content %}{{ c.text }}"
           "{% endfor %}]{% endif %}{% endfor %}")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(dirs["qwen3"], "tokenizer.json"))
    c = ChatTemplateTokenCounter(tok, tpl, content_format="auto")
    assert c.content_format == "openai"
    assert c.render([ai(""), ai(None), human("x")]) == "<assistant>[]<assistant><user>[x]"
    assert c.render([ai(None, tool_calls=[{"id": "c1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}])]) == "<assistant>"


def test_media_blocks_are_a_clear_error_under_a_vllm_format(dirs):
    ms = [human([{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x.png"}}])]
    for fmt in ("string", "openai"):
        c = ChatTemplateTokenCounter(dirs["hermes"], content_format=fmt)
        with pytest.raises(MessageValidationError, match=r"messages\[0\]\.content\[1\]: a media block \('image_url'\)"):
            c.count_messages(ms)
    c = ChatTemplateTokenCounter(dirs["qwen3"], content_format="string")
    with pytest.raises(MessageValidationError, match=r"messages\[1\]\.content\[0\]: .*'video_frame'"):
        c.count_messages([human("a"), human([{"type": "video_frame", "text": "x"}])])


def test_content_format_is_checked_kept_and_pickled(dirs):
    with pytest.raises(ValueError, match="content_format must be None, 'string', 'openai' or 'auto'"):
        ChatTemplateTokenCounter(dirs["qwen3"], content_format="vllm")
    c = ChatTemplateTokenCounter(dirs["llama3.1"], content_format="auto")
    assert "content_format='auto'" in repr(c)
    back = pickle.loads(pickle.dumps(c))
    assert back.content_format == "openai" and back._content_format_arg == "auto"
    ms = [human([{"type": "text", "text": " padded "}]), ai("ok"), human("next")]
    assert back.count_messages(ms) == c.count_messages(ms)
    # counters of one template in different formats share no learned frames
    plain = ChatTemplateTokenCounter(dirs["llama3.1"])
    assert plain._frames._frames is not c._frames._frames
    assert plain._frames._frames is ChatTemplateTokenCounter(dirs["llama3.1"])._frames._frames


def test_named_tool_use_template_decides_its_own_format(tmp_path):
    """A request with tools renders by the model's "tool_use" template, whose own format vLLM
    detects for it (here a block-looping one beside a string default)."""
    path = mk.named_model_dir(str(tmp_path / "named"), "files")
    tool_use = os.path.join(path, "additional_chat_templates", "tool_use.jinja")
    with open(tool_use, "w", encoding="utf-8") as f:
        f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{% for c in m.content %}{{ c.text }}{% endfor %}"
                "<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}<|im_start|>assistant\n")
    c = ChatTemplateTokenCounter(path, content_format="auto")
    assert c.content_format == "string" and c._tools_counter().content_format == "openai"
    hf = transformers.AutoTokenizer.from_pretrained(path)
    ms = [human([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]), ai("c"), human("d")]
    assert c.count_request(ms, TOOLS) == reference(hf, c, ms, TOOLS, "openai")
    assert c.count_messages(ms) == reference(hf, c, ms, None, "string")


def _weather_loop(counter, blocks, budget=260, turns=12):
    """A hot loop (a question, a call, its result per turn) under a budget filter: each turn's
    kept prompt and its count."""
    flt = TokenBudgetFilter(max_tokens=budget, counter=counter)
    history = [system("You answer questions about the weather.")]
    for i in range(turns):
        history.append(human([{"type": "text", "text": f"Weather in city {i}?"}]) if blocks and i % 2 else human(f"City {i}?"))
        call = {"id": f"c{i}", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": json.dumps({"city": f"c{i}"})}}
        history.append(ai(None, tool_calls=[call]))
        history.append(tool(f"sunny, {i} degrees", tool_call_id=f"c{i}", name="get_weather"))
        kept = flt.apply(history)
        assert kept[0] is history[0] and kept[-1] is history[-1]
        yield history, kept, counter.count_messages(kept)


def test_budget_filter_with_a_vllm_format_keeps_whole_units_within_budget(dirs):
    """A hot loop on Llama 3.1 under "auto" ("openai": block lists), some questions sent as
    blocks: each turn's kept prompt, counted as vLLM renders it, is within the budget and
    starts on a whole unit. Turns are assembled from frames, not rendered, block contents
    included (their texts are a frame's slots), with or without the format."""
    counter = ChatTemplateTokenCounter(dirs["llama3.1"], content_format="auto")
    hf = _hf("llama3.1", dirs["llama3.1"])
    for history, kept, n in _weather_loop(counter, blocks=True):
        assert n == reference(hf, counter, kept, None, "openai") <= 260
        assert kept[1].role in ("system", "user") or (kept[1].role == "assistant" and kept[1].tool_calls)
    assert len(kept) < len(history)
    plain = ChatTemplateTokenCounter(dirs["llama3.1"])
    wrapped = ChatTemplateTokenCounter(dirs["llama3.1"], content_format="openai")
    renders = {}
    for c in (plain, wrapped):
        c._template = _Counted(c._template)
        counts = []
        for i, (_, _, n) in enumerate(_weather_loop(c, blocks=True, turns=16)):
            counts.append(n)
            if i == 7:
                c._template.calls = 0
        renders[c.content_format] = (counts, c._template.calls)
    assert renders["openai"] == renders[None]  # (Llama 3.1 trims a block's text as it trims a string)
    assert renders["openai"][1] == 0  # the last 8 turns: no rendering


class _Counted:
    """A compiled template that counts its renderings."""

    def __init__(self, template):
        self.template = template
        self.calls = 0

    def render(self, *args, **kwargs):
        self.calls += 1
        return self.template.render(*args, **kwargs)


def test_cli_content_format_counts_block_contents_as_vllm(dirs, tmp_path, capsys):
    """``build --tokenizer MODEL_DIR --content-format auto`` counts block contents as vLLM renders
    them (Qwen3: "string", the texts joined); transformers' default leaves them out. The flag
    is refused for a tokenizer without a chat template."""
    from jianmu_fast import cli

    row = {"messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris"},
                                                     {"type": "text", "text": "and in Rome?"}]}]}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(row) + "\n", encoding="utf-8")
    got = {}
    for fmt in ("transformers", "auto"):
        out = tmp_path / f"{fmt}.jsonl"
        assert cli.main(["build", str(src), "-o", str(out), "--tokenizer", dirs["qwen3"], "--content-format", fmt]) == 0
        got[fmt] = json.loads(out.read_text(encoding="utf-8"))
    prompt = [Message.from_openai(m) for m in got["auto"]["messages"]]
    hf = _hf("qwen3", dirs["qwen3"])
    counter = ChatTemplateTokenCounter(dirs["qwen3"], content_format="string")
    assert got["auto"]["prompt_tokens"] == reference(hf, counter, prompt, None, "string") == 26
    assert got["transformers"]["prompt_tokens"] == ChatTemplateTokenCounter(dirs["qwen3"]).count_messages(prompt) == 18
    assert cli.main(["build", str(src), "--tokenizer", "simple", "--content-format", "string"]) == 2
    assert "--content-format string: --tokenizer 'simple' has no chat template" in capsys.readouterr().err
