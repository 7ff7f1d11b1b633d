"""Issue 13 item 4: ``TiktokenTokenCounter(engine="fastokens")`` counts exactly like tiktoken's
``encode_ordinary`` on o200k_base and cl100k_base (special-token text is ordinary text), both
through one text (``count_text``) and through a batch of cache misses (``count_array``);
``engine="auto"`` moves to fastokens past its threshold and falls back silently without it;
``engine="fastokens"`` without the package raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jianmu_fast.memory.context import TiktokenTokenCounter
from jianmu_fast.memory.context import _encodings
from jianmu_fast.message import Message

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
ENCODINGS = ["o200k_base", "cl100k_base"]
ROOT = Path(__file__).resolve().parents[1]

try:
    import fastokens  # noqa: F401

    HAVE_FASTOKENS = True
except ImportError:  # pragma: no cover - the [fast] extra is installed for the tests
    HAVE_FASTOKENS = False

needs_fastokens = pytest.mark.skipif(not HAVE_FASTOKENS, reason="pip install 'jianmu_fast[fast]'")


def _specials() -> list[str]:
    out: set[str] = set()
    for name in ENCODINGS:
        out.update(_encodings.load_tiktoken_encoding(name)._special_tokens)
    return sorted(out)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_piece = st.one_of(
    st.text(max_size=40),
    st.sampled_from(_specials()),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=20),  # Chinese
    st.text(alphabet="，。！？：；“”（）、", max_size=6),
    st.text(alphabet=st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=6),  # emoji
    st.sampled_from(["👍🏽", "👨‍👩‍👧", "🇨🇳", "❤️", "\u200d", "\ufe0f"]),
    st.text(alphabet=" \t\n\r\u00a0\u3000", max_size=30),  # whitespace runs
    _json.map(lambda v: json.dumps(v, ensure_ascii=False)),
    _json.map(lambda v: json.dumps(v, indent=2)),
    st.integers(min_value=0, max_value=10 ** 30).map(str),
)
texts = st.lists(_piece, max_size=8).map("".join)


def _reference(name: str):
    return _encodings.load_tiktoken_encoding(name).encode_ordinary


@needs_fastokens
@pytest.mark.parametrize("name", ENCODINGS)
@settings(deadline=None, max_examples=MAX_EXAMPLES)
@given(text=texts)
def test_count_text_equals_encode_ordinary(name, text):
    counter = TiktokenTokenCounter(name, engine="fastokens")
    assert counter.count_text(text) == len(_reference(name)(text))


@needs_fastokens
@pytest.mark.parametrize("name", ENCODINGS)
@settings(deadline=None, max_examples=max(1, MAX_EXAMPLES // 3))
@given(batch=st.lists(texts, min_size=2, max_size=30))
def test_count_array_equals_tiktoken_engine(name, batch):
    """A batch of misses goes through fastokens' flat batch call: same counts as tiktoken."""
    messages = [Message(role="user", content=t) for t in batch]
    fast = TiktokenTokenCounter(name, engine="fastokens")
    slow = TiktokenTokenCounter(name, engine="tiktoken")
    encode = _reference(name)
    assert fast.count_array(messages).tolist() == slow.count_array(messages).tolist()
    assert fast.count_array(messages).tolist() == [3 + len(encode("user")) + len(encode(t)) for t in batch]


@needs_fastokens
@pytest.mark.parametrize("name", ENCODINGS)
def test_real_files_equal(name):
    """Every line and every whole file of the package's sources and the README, as one batch."""
    files = sorted((ROOT / "jianmu_fast").rglob("*.py")) + [ROOT / "README.md"]
    corpus = [p.read_text(encoding="utf-8") for p in files]
    corpus += [line for text in corpus for line in text.splitlines()]
    corpus = list(dict.fromkeys(corpus))
    fast = TiktokenTokenCounter(name, engine="fastokens")
    encode = _reference(name)
    got = fast._encode_counts(corpus)
    assert got == [len(encode(t)) for t in corpus]


@needs_fastokens
@pytest.mark.parametrize("text", ["<|endoftext|>", "a <|endoftext|> b <|fim_prefix|>", "<|im_start|>user",
                                  "<|endofprompt|>", "\ud800", "x\udfffy 你好", "", " ", "\n\n\n", "🎉" * 50])
@pytest.mark.parametrize("name", ENCODINGS)
def test_edge_cases(name, text):
    """Special-token text counts as ordinary text; lone surrogates get tiktoken's repair."""
    fast = TiktokenTokenCounter(name, engine="fastokens")
    want = len(_reference(name)(text))
    assert fast.count_text(text) == want
    both = [Message(role="user", content=text), Message(role="user", content=text + "!")]
    assert fast.count_array(both).tolist() == TiktokenTokenCounter(name, engine="tiktoken").count_array(both).tolist()


@needs_fastokens
def test_pickles_with_its_engine_and_cache_behaviour_is_unchanged():
    c = TiktokenTokenCounter("cl100k_base", engine="fastokens")
    msgs = [Message(role="user", content="hello <|endoftext|>"), Message(role="assistant", content="你好 🎉")]
    counts = c.count_array(msgs).tolist()
    copy = pickle.loads(pickle.dumps(c))
    assert copy.engine == "fastokens" and copy.encoding_name == "cl100k_base"
    assert copy.count_array(msgs).tolist() == counts
    ref = TiktokenTokenCounter("cl100k_base", engine="tiktoken")
    assert ref.count_array(msgs).tolist() == counts
    assert c.cache_info() == ref.cache_info()
    assert c.cache_info()["messages"] == 2
    assert repr(c) == "TiktokenTokenCounter('cl100k_base', engine='fastokens')"
    assert pickle.loads(pickle.dumps(TiktokenTokenCounter("o200k_base"))).engine == "auto"


@needs_fastokens
def test_auto_moves_to_fastokens_past_its_threshold(monkeypatch):
    monkeypatch.setattr(TiktokenTokenCounter, "AUTO_FASTOKENS_CHARS", 100)
    c = TiktokenTokenCounter("o200k_base")
    assert c.engine == "auto" and c.engine_in_use == "tiktoken"
    assert c.count_text("short") == 1
    assert c.engine_in_use == "tiktoken"
    text = "word " * 30 + "<|endoftext|>"
    assert c.count_text(text) == len(_reference("o200k_base")(text))
    assert c.engine_in_use == "fastokens"
    assert TiktokenTokenCounter("o200k_base", engine="tiktoken").engine_in_use == "tiktoken"


def test_auto_falls_back_silently_without_fastokens(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fastokens", None)  # import fastokens -> ImportError
    monkeypatch.setattr(_encodings, "_fast", {})
    monkeypatch.setattr(TiktokenTokenCounter, "AUTO_FASTOKENS_CHARS", 10)
    c = TiktokenTokenCounter("o200k_base")
    text = "hello world, " * 20
    assert c.count_text(text) == len(_reference("o200k_base")(text))
    assert c.engine_in_use == "tiktoken"


def test_fastokens_engine_without_the_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fastokens", None)
    monkeypatch.setattr(_encodings, "_fast", {})
    with pytest.raises(ImportError, match=r"pip install 'jianmu_fast\[fast\]'"):
        TiktokenTokenCounter("o200k_base", engine="fastokens")


def test_bad_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="engine: expected 'auto', 'tiktoken' or 'fastokens', got 'rust'"):
        TiktokenTokenCounter("o200k_base", engine="rust")


@needs_fastokens
def test_fastokens_engine_refuses_an_unproven_encoding():
    import tiktoken

    base = _encodings.load_tiktoken_encoding("cl100k_base")
    custom = tiktoken.Encoding(name="my_cl100k", pat_str=base._pat_str, mergeable_ranks=base._mergeable_ranks,
                               special_tokens={})
    with pytest.raises(ValueError, match="proven exact for the shipped .* not for this 'my_cl100k'"):
        TiktokenTokenCounter(custom, engine="fastokens")
    auto = TiktokenTokenCounter(custom)
    auto.AUTO_FASTOKENS_CHARS = 1
    assert auto.count_text("hello world") == 2 and auto.engine_in_use == "tiktoken"
