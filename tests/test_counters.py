"""The exact counters: construction, chat-format formula, worked examples, additivity, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from tokenizers import Tokenizer

from jianmu_fast.errors import MessageValidationError, TokenizerLoadError
from jianmu_fast.memory.context import HFTokenCounter, SimpleTokenCounter, TiktokenTokenCounter
from jianmu_fast.memory.context._encodings import load_tiktoken_encoding
from jianmu_fast.message import Message, ai, human, system, tool

DATA = Path(__file__).parent / "data"
MINILM = DATA / "all-MiniLM-L6-v2.tokenizer.json"


def raw_hf() -> Tokenizer:
    tok = Tokenizer.from_file(str(MINILM))
    tok.no_truncation()
    tok.no_padding()
    return tok


# -- the OpenAI cookbook's worked examples ("How to count tokens with tiktoken") ------------

COOKBOOK_MESSAGES = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."},
]

COOKBOOK_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "description": "The unit of temperature to return",
                         "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}]
COOKBOOK_TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


@pytest.mark.parametrize("model, expected", [("gpt-4", 129), ("gpt-3.5-turbo", 129), ("gpt-4o", 124),
                                             ("gpt-4o-mini", 124)])
def test_cookbook_chat_example(model, expected):
    """The cookbook prints these prompt_tokens from the API for its 6-message example."""
    c = TiktokenTokenCounter(model)
    assert c.count_messages(COOKBOOK_MESSAGES) == expected
    assert c.count_messages([Message.from_openai(d) for d in COOKBOOK_MESSAGES]) == expected


@pytest.mark.parametrize("model, expected", [("gpt-4", 105), ("gpt-4o", 101)])
def test_cookbook_tools_example(model, expected):
    c = TiktokenTokenCounter(model)
    assert c.count_messages(COOKBOOK_TOOL_MESSAGES) + c.count_tools(COOKBOOK_TOOLS) == expected


def test_measured_tool_call_request():
    """A request measured against the API (gpt-4: 35 prompt tokens, reported in
    forestwanglin/openai-java#5): an assistant tool call and its result. Counting the
    18-token tool_call_id would give 53."""
    call_id = "call_Id8ycVMsW8gdsf7kSXfgAcf1"
    msgs = [
        ai(None, tool_calls=[{"id": call_id, "type": "function", "function": {
            "name": "get_current_weather", "arguments": "{\n  \"location\": \"Boston, MA\"\n}"}}]),
        tool("29 degree celcius", name="get_current_weather", tool_call_id=call_id),
    ]
    c = TiktokenTokenCounter("gpt-4")
    assert c.count_messages(msgs) == 35
    assert c.count_text(call_id) == 18


# -- the formula, piece by piece ---------------------------------------------------------------


def test_tiktoken_formula_pieces():
    c = TiktokenTokenCounter("o200k_base", image_tokens=100)
    enc = load_tiktoken_encoding("o200k_base")
    n = lambda s: len(enc.encode_ordinary(s))  # noqa: E731
    assert c.count_message(human("hello there")) == 3 + n("user") + n("hello there")
    assert c.count_message(human("hi", name="bob")) == 3 + n("user") + n("hi") + n("bob") + 1
    blocks = [{"type": "text", "text": "look at"}, {"type": "image_url", "image_url": {"url": "x"}},
              {"type": "text", "text": "this picture"}]
    assert c.count_message(human(blocks)) == 3 + n("user") + n("look at") + 100 + n("this picture")
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
             {"id": "c2", "type": "function", "function": {"name": "calc", "arguments": ""}}]
    assert c.count_message(ai("ok", tool_calls=calls)) == (
        3 + n("assistant") + n("ok") + 1 + n("search") + n('{"q": "x"}') + 1 + n("calc"))
    assert c.count_message(tool("4", tool_call_id="call_abcdef")) == 3 + n("tool") + n("4")
    assert c.count_messages([]) == 3


def test_hf_formula_pieces():
    c = HFTokenCounter(MINILM, image_tokens=50)
    tok = raw_hf()
    n = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    assert c.count_message(human("hello there")) == 4 + n("user") + n("hello there")
    assert c.count_message(tool("4", name="calc", tool_call_id="call_9")) == (
        4 + n("tool") + n("4") + n("calc") + 1 + n("call_9"))
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": 1}'}}]
    assert c.count_message(ai(None, tool_calls=calls)) == 4 + n("assistant") + 12 + n("search") + n('{"q": 1}')
    assert c.count_message(human([{"type": "image_url", "image_url": {"url": "u"}}])) == 4 + n("user") + 50
    assert c.count_messages([]) == 3


def test_special_token_text_is_ordinary_text():
    for name in ("o200k_base", "cl100k_base"):
        c = TiktokenTokenCounter(name)
        enc = load_tiktoken_encoding(name)
        for text in ("<|endoftext|>", "a <|endofprompt|> b", "<|fim_prefix|><|im_start|>"):
            assert c.count_text(text) == len(enc.encode_ordinary(text)) > 1
        assert c.count_message(human("<|endoftext|>")) == 3 + 1 + c.count_text("<|endoftext|>")


def test_hf_counts_are_not_truncated():
    """The shipped tokenizer.json truncates and pads to 128; the counter must not."""
    raw = Tokenizer.from_file(str(MINILM))
    assert len(raw.encode("word " * 300).ids) == 128
    c = HFTokenCounter(MINILM)
    assert c.count_text("word " * 300) == 300
    assert c.count_text("") == 0


def test_hf_accepts_tokenizer_object_and_transformers_like():
    tok = Tokenizer.from_file(str(MINILM))  # truncation on: the counter copies and disables it

    class FastTokenizerLike:
        backend_tokenizer = tok

    for arg in (tok, FastTokenizerLike(), str(MINILM), MINILM):
        assert HFTokenCounter(arg).count_text("word " * 200) == 200
    assert tok.truncation is not None, "the user's tokenizer was modified"


# -- additivity: count_messages(ms) == count_messages([]) + sum(count_message(m)) --------------


def _random_conversation(rng: random.Random, n: int) -> list[Message]:
    out: list[Message] = [system("You are terse. 你好 🙂")]
    words = ["alpha", "beta", "γάμμα", "数据", "🙂", "<|endoftext|>", "{", '"k":', "1,", "\n", "  "]
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        kind = rng.randrange(5)
        if kind == 0:
            out.append(human(text, name=rng.choice([None, "ann"])))
        elif kind == 1:
            out.append(ai(text))
        elif kind == 2:
            calls = [{"id": f"c{i}_{k}", "type": "function",
                      "function": {"name": rng.choice(["search", "calc"]), "arguments": json.dumps({"q": text})}}
                     for k in range(rng.randint(1, 3))]
            out.append(ai(rng.choice([None, text]), tool_calls=calls))
            out.extend(tool(text[:20], name="search", tool_call_id=c["id"]) for c in calls)
        elif kind == 3:
            out.append(human([{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "u"}}]))
        else:
            out.append(human(text))
    return out


@pytest.mark.parametrize("make", [lambda: TiktokenTokenCounter("o200k_base"),
                                  lambda: TiktokenTokenCounter("cl100k_base"),
                                  lambda: HFTokenCounter(MINILM), SimpleTokenCounter],
                         ids=["o200k", "cl100k", "hf", "simple"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_additivity(make, seed):
    msgs = _random_conversation(random.Random(seed), 60)
    c = make()
    arr = c.count_array(msgs)
    assert arr.dtype == np.int64 and arr.shape == (len(msgs),)
    singles = [c.count_message(m) for m in msgs]
    assert arr.tolist() == singles
    assert c.count_messages(msgs) == c.count_messages([]) + sum(singles)
    fresh = make()  # a cold counter agrees with a warm one, message by message
    assert [fresh.count_message(m) for m in reversed(msgs)] == singles[::-1]
    for lo in range(0, len(msgs), 7):  # slices, as TokenBudgetFilter asks for them
        assert c.count_array(msgs[lo:lo + 9]).tolist() == singles[lo:lo + 9]


def test_count_array_of_nothing_and_of_dicts():
    c = TiktokenTokenCounter()
    assert c.count_array([]).dtype == np.int64 and c.count_array([]).shape == (0,)
    assert c.count_array([{"role": "user", "content": "hi"}]).tolist() == [c.count_message(human("hi"))]
    assert c.count_messages(iter([human("hi")])) == 3 + c.count_message(human("hi"))


# -- errors ----------------------------------------------------------------------------------------


def test_bad_encoding_arguments():
    with pytest.raises(TypeError, match="encoding: expected an encoding name.*got int"):
        TiktokenTokenCounter(42)
    with pytest.raises(ValueError, match="encoding: 'no-such-model' is neither"):
        TiktokenTokenCounter("no-such-model")
    with pytest.raises(ValueError, match="encoding: expected an encoding or model name"):
        TiktokenTokenCounter("")
    with pytest.raises(ValueError, match="cache_size must be a positive int, got 0"):
        TiktokenTokenCounter(cache_size=0)
    with pytest.raises(ValueError, match="image_tokens must be a non-negative int"):
        HFTokenCounter(MINILM, image_tokens=-1)


def test_bad_tokenizer_arguments(tmp_path):
    with pytest.raises(TypeError, match="tokenizer: expected a path to a tokenizer.json.*got int"):
        HFTokenCounter(3)
    missing = tmp_path / "nope.json"
    with pytest.raises(TokenizerLoadError, match="nope.json") as info:
        HFTokenCounter(missing)
    assert isinstance(info.value, OSError)
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\n[UNK]\n")
    with pytest.raises(TokenizerLoadError, match=r"vocab.txt.*not a valid tokenizer.json"):
        HFTokenCounter(bad)


def test_bad_messages_name_the_index():
    c = TiktokenTokenCounter()
    with pytest.raises(MessageValidationError, match=r"messages\[1\]"):
        c.count_array([human("ok"), 42])
    with pytest.raises(MessageValidationError, match=r"messages\[2\]\.role"):
        c.count_messages([human("a"), human("b"), {"role": "robot", "content": "x"}])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        c.count_text(b"abc")


def test_count_tools_errors_and_empty():
    c = TiktokenTokenCounter()
    h = HFTokenCounter(MINILM)
    for counter in (c, h):
        assert counter.count_tools(None) == 0 and counter.count_tools([]) == 0
        with pytest.raises(TypeError, match=r"tools_schema\[1\]: expected a tool dict, got str"):
            counter.count_tools([COOKBOOK_TOOLS[0], "search"])
        with pytest.raises(ValueError, match=r"tools_schema\[0\]\.function\.name"):
            counter.count_tools([{"type": "function", "function": {"description": "no name"}}])
        with pytest.raises(TypeError, match="tools_schema: expected a list"):
            counter.count_tools({"name": "f"})
    with pytest.raises(TypeError, match=r"tools_schema\[0\]\.function\.parameters\.properties\.x"):
        c.count_tools([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": 1}}}}])


def test_count_tools_nested_schema_counts_more():
    """Nested properties (beyond the cookbook) add the compact JSON of their sub-schema."""
    c = TiktokenTokenCounter()
    flat = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "object", "description": "a point"}}}}}
    nested = json.loads(json.dumps(flat))
    nested["function"]["parameters"]["properties"]["x"]["properties"] = {"lat": {"type": "number"}}
    extra = c.count_text(json.dumps({"properties": {"lat": {"type": "number"}}}, separators=(",", ":")))
    assert c.count_tools([nested]) == c.count_tools([flat]) + extra
    h = HFTokenCounter(MINILM)
    assert h.count_tools([flat]) == 1 + h.count_text(json.dumps(flat, ensure_ascii=False))


def test_tiktoken_accepts_an_encoding_object():
    enc = load_tiktoken_encoding("cl100k_base")
    c = TiktokenTokenCounter(enc)
    assert c.encoding_name == "cl100k_base"
    assert c.count_text("hello world") == 2
    assert repr(c) == "TiktokenTokenCounter('cl100k_base')"
    assert isinstance(enc, tiktoken.Encoding)


def test_repr():
    assert repr(HFTokenCounter(MINILM)).startswith("HFTokenCounter('")
    assert repr(HFTokenCounter(raw_hf())) == "HFTokenCounter(<tokenizers.Tokenizer>)"


def test_exported_and_protocol_conforming():
    import jianmu_fast.memory.context as ctx
    from jianmu_fast.memory.context import TokenCounterProtocol

    assert {"SimpleTokenCounter", "TiktokenTokenCounter", "HFTokenCounter"} <= set(ctx.__all__)
    assert isinstance(TiktokenTokenCounter(), TokenCounterProtocol)
    assert isinstance(HFTokenCounter(MINILM), TokenCounterProtocol)
