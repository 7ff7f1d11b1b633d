"""``engine=`` of the HuggingFace-tokenizer counters (``HFTokenCounter``,
``ChatTemplateTokenCounter``): fastokens loads the same ``tokenizer.json`` and must give the
very ids HuggingFace ``tokenizers`` gives, on every bundled tokenizer (the six chat-template
families' and the shared cl100k ``tokenizer.json``), for any text: unicode, whitespace runs,
digits, JSON, the tokenizer's added and special tokens embedded anywhere. ``"auto"`` starts on
tokenizers and moves to fastokens once the counter has tokenized ``AUTO_FASTOKENS_CHARS``
characters (cache misses), only where it loads and passes the load-time check; ``"fastokens"`` refuses a
tokenizer it cannot load or that fails the check, and names the extra when fastokens is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jianmu_fast.memory.context import ChatTemplateTokenCounter, HFTokenCounter
from jianmu_fast.memory.context import _encodings
from jianmu_fast.message import Message

MAX_EXAMPLES = int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "300"))
HERE = os.path.join(os.path.dirname(__file__), "data", "chat_templates")
MINILM = os.path.join(os.path.dirname(__file__), "data", "all-MiniLM-L6-v2.tokenizer.json")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(HERE, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]

HAVE_FASTOKENS = importlib.util.find_spec("fastokens") is not None
needs_fastokens = pytest.mark.skipif(not HAVE_FASTOKENS, reason="pip install 'jianmu_fast[fast]'")
TOKENIZERS = [*mk.FAMILIES, "cl100k"]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """tokenizer.json of each bundled tokenizer (family model folders, and the shared cl100k one)."""
    out = {f: os.path.join(mk.model_dir(f, str(tmp_path_factory.mktemp(f))), "tokenizer.json") for f in mk.FAMILIES}
    base = tmp_path_factory.mktemp("cl100k") / "tokenizer.json"
    base.write_text(mk.base_tokenizer_json(), encoding="utf-8")
    out["cl100k"] = str(base)
    return out


_pairs: dict[str, tuple] = {}


def _pair(paths, name):
    """(tokenizers.Tokenizer, fastokens twin, added-token contents) of a bundled tokenizer."""
    if name not in _pairs:
        tok, _, digest = _encodings.load_hf_tokenizer(paths[name])
        fast = _encodings.hf_fastokens(tok, "fastokens", digest)
        added = sorted(t.content for t in tok.get_added_tokens_decoder().values())
        _pairs[name] = (tok, fast, added)
    return _pairs[name]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_common = [
    st.text(max_size=40),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=20),  # CJK
    st.text(alphabet="，。！？：；“”（）、", max_size=6),
    st.text(alphabet=st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=6),  # emoji
    st.sampled_from(["👍🏽", "👨‍👩‍👧", "🇨🇳", "❤️", "\u200d", "\ufe0f", "é", "e\u0301", "ﬁ", "Ⅻ", "ß"]),
    st.text(alphabet=" \t\n\r\u00a0\u3000\u2028\x0b\x0c", max_size=30),  # whitespace runs
    st.sampled_from(["'s", "'S", "'ll", "'re", "n't", "'ve", "'d", "'m", "'"]),  # contractions
    _json.map(lambda v: json.dumps(v, ensure_ascii=False)),
    _json.map(lambda v: json.dumps(v, indent=2)),
    st.integers(min_value=0, max_value=10 ** 30).map(str),
    st.from_regex(r"[0-9 .,\-]{1,25}", fullmatch=True),
]


def _texts(added: list[str]):
    pieces = st.one_of(*_common, st.sampled_from(added)) if added else st.one_of(*_common)
    return st.lists(pieces, max_size=10).map("".join)


_SETTINGS = settings(deadline=None, max_examples=MAX_EXAMPLES, suppress_health_check=list(HealthCheck))


@needs_fastokens
@pytest.mark.parametrize("name", TOKENIZERS)
def test_fastokens_ids_equal_tokenizers_ids(paths, name):
    tok, fast, added = _pair(paths, name)

    @_SETTINGS
    @given(text=_texts(added))
    def check(text):
        assert fast.encode(text, add_special_tokens=False).ids == tok.encode(text, add_special_tokens=False).ids

    check()


@needs_fastokens
@pytest.mark.parametrize("name", TOKENIZERS)
def test_counters_count_the_same_with_both_engines(paths, name):
    """Through the counters: one text (``count_text``), and batches of misses (``count_array``:
    fastokens' flat batch), equal to tokenizers' counts."""
    _, _, added = _pair(paths, name)
    fast, ref = HFTokenCounter(paths[name], engine="fastokens"), HFTokenCounter(paths[name], engine="tokenizers")
    assert fast.engine_in_use == "fastokens" and ref.engine_in_use == "tokenizers"

    @settings(deadline=None, max_examples=max(1, MAX_EXAMPLES // 3), suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(_texts(added), min_size=1, max_size=12))
    def check(batch):
        fast.clear_cache()
        ms = [Message(role="user", content=t) for t in batch]
        assert fast.count_array(ms).tolist() == ref.count_array(ms).tolist()
        assert [fast.count_text(t) for t in batch] == [ref.count_text(t) for t in batch]

    check()


@needs_fastokens
def test_chat_template_counter_engines_count_the_same(paths):
    """Added tokens next to text, in messages (the template's own are counted either way)."""
    folder = os.path.dirname(paths["qwen3"])
    fast = ChatTemplateTokenCounter(folder, engine="fastokens")
    ref = ChatTemplateTokenCounter(folder, engine="tokenizers")
    auto = ChatTemplateTokenCounter(folder)
    assert (fast.engine_in_use, ref.engine_in_use, auto.engine_in_use) == ("fastokens", "tokenizers", "tokenizers")
    ms = [Message(role="system", content="<|im_start|>sys<|im_end|>  \n"), Message(role="user", content="数据 {\"a\": 1}<think>x")]
    assert fast.count_messages(ms) == ref.count_messages(ms) == auto.count_messages(ms)
    assert fast.count_array(ms).tolist() == ref.count_array(ms).tolist()
    assert fast.count_text("<tool_call>\n{}\n</tool_call>  12345") == ref.count_text("<tool_call>\n{}\n</tool_call>  12345")


@needs_fastokens
def test_a_tokenizer_fastokens_cannot_load_stays_on_tokenizers():
    """fastokens has no BertNormalizer: "auto" counts with tokenizers (past its threshold
    too), "fastokens" says why."""
    auto = HFTokenCounter(MINILM)
    auto.AUTO_FASTOKENS_CHARS = 5
    assert auto.count_text("hello world") == 2 and auto._auto_chars == -1  # decided
    assert auto.engine_in_use == "tokenizers" and auto.count_text("hello there world") == 3
    with pytest.raises(ValueError, match=r"engine='fastokens'\): fastokens cannot load this tokenizer .*BertNormalizer"):
        HFTokenCounter(MINILM, engine="fastokens")


@needs_fastokens
def test_a_twin_that_tokenizes_differently_is_rejected(paths, monkeypatch):
    """The load-time check: a fastokens tokenizer that differs (here: the family's vocabulary
    without its added tokens, a real tokenizer) is never used by "auto", refused by "fastokens"."""
    import fastokens

    base = mk.base_tokenizer_json()
    real = fastokens.Tokenizer.from_json_str
    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", staticmethod(lambda s: real(base)))
    monkeypatch.setattr(_encodings, "_hf_fast", {})
    monkeypatch.setattr(ChatTemplateTokenCounter, "AUTO_FASTOKENS_CHARS", 1)  # decides at once
    folder = os.path.dirname(paths["hermes"])
    auto = ChatTemplateTokenCounter(folder)
    assert auto.engine_in_use == "tokenizers" and auto._auto_chars == -1
    ref = ChatTemplateTokenCounter(folder, engine="tokenizers")
    ms = [Message(role="user", content="hi")]
    assert auto.count_messages(ms) == ref.count_messages(ms)
    with pytest.raises(ValueError, match="tokenizes .* differently from tokenizers"):
        HFTokenCounter(paths["hermes"], engine="fastokens")


def test_fastokens_engine_without_the_package_names_the_extra(paths, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fastokens -> ImportError
    monkeypatch.setattr(_encodings, "_hf_fast", {})
    with pytest.raises(ImportError, match=r"HFTokenCounter\(engine='fastokens'\) .*pip install 'jianmu_fast\[fast\]'"):
        HFTokenCounter(paths["cl100k"], engine="fastokens")
    folder = os.path.dirname(paths["mistral"])
    with pytest.raises(ImportError, match=r"ChatTemplateTokenCounter\(engine='fastokens'\) .*jianmu_fast\[fast\]"):
        ChatTemplateTokenCounter(folder, engine="fastokens")
    monkeypatch.setattr(HFTokenCounter, "AUTO_FASTOKENS_CHARS", 1)  # "auto" decides at its first miss
    monkeypatch.setattr(ChatTemplateTokenCounter, "AUTO_FASTOKENS_CHARS", 1)
    auto = HFTokenCounter(paths["cl100k"])
    assert auto.count_text("hello world") == 2 and auto._auto_chars == -1 and auto.engine_in_use == "tokenizers"
    ct = ChatTemplateTokenCounter(folder)
    assert ct._auto_chars == -1 and ct.engine_in_use == "tokenizers"


def test_bad_engine_is_a_clear_error(paths):
    with pytest.raises(ValueError, match="engine: expected 'auto', 'tokenizers' or 'fastokens', got 'rust'"):
        HFTokenCounter(paths["cl100k"], engine="rust")
    with pytest.raises(ValueError, match="engine: expected 'auto', 'tokenizers' or 'fastokens', got 'tiktoken'"):
        ChatTemplateTokenCounter(os.path.dirname(paths["qwen3"]), engine="tiktoken")


@pytest.mark.parametrize("engine", ["auto", "tokenizers"] + (["fastokens"] if HAVE_FASTOKENS else []))
def test_pickle_and_repr_keep_the_engine(paths, engine):
    c = HFTokenCounter(paths["llama3.1"], engine=engine)
    clone = pickle.loads(pickle.dumps(c))
    assert clone.engine == engine and clone.engine_in_use == c.engine_in_use
    assert clone.count_text("hello <|eot_id|> world") == c.count_text("hello <|eot_id|> world")
    tail = "" if engine == "auto" else f", engine={engine!r}"
    assert repr(c) == repr(clone) == f"HFTokenCounter({c.path!r}{tail})"


@needs_fastokens
def test_lone_surrogates_give_the_reference_outcome(paths):
    """fastokens raises UnicodeEncodeError where tokenizers raises TypeError: the counter
    falls back to tokenizers, so either engine gives tokenizers' outcome."""
    text = "abc\ud800def"
    outcomes = []
    for engine in ("tokenizers", "fastokens"):
        c = HFTokenCounter(paths["qwen3"], engine=engine)
        try:
            outcomes.append(c.count_text(text))
        except Exception as exc:
            outcomes.append(type(exc))
    assert outcomes[0] == outcomes[1]


def test_auto_below_its_threshold_never_loads_fastokens(paths, monkeypatch):
    """A counter that has tokenized fewer than ``AUTO_FASTOKENS_CHARS`` characters has not
    built the twin (nor imported fastokens' tokenizer): short runs never pay its load."""
    monkeypatch.setattr(_encodings, "_hf_fast", {})
    c = HFTokenCounter(paths["qwen3"])
    ct = ChatTemplateTokenCounter(os.path.dirname(paths["qwen3"]))
    ms = [Message(role="user", content=f"question {i} " * 50) for i in range(20)]
    c.count_array(ms)
    ct.count_messages(ms)
    assert c.engine_in_use == ct.engine_in_use == "tokenizers"
    assert 0 < c._auto_chars < HFTokenCounter.AUTO_FASTOKENS_CHARS
    assert 0 < ct._auto_chars < ChatTemplateTokenCounter.AUTO_FASTOKENS_CHARS
    assert _encodings._hf_fast == {}  # no twin built, for any tokenizer
    assert HFTokenCounter.AUTO_FASTOKENS_CHARS == ChatTemplateTokenCounter.AUTO_FASTOKENS_CHARS == 5_000_000


@needs_fastokens
def test_auto_switches_past_its_threshold_with_equal_counts(paths, monkeypatch):
    """Cache hits do not count towards the threshold; the miss that reaches it loads the twin
    (checked), and every count before and after equals the tokenizers engine's."""
    ref = HFTokenCounter(paths["qwen3"], engine="tokenizers")
    c = HFTokenCounter(paths["qwen3"])
    c.AUTO_FASTOKENS_CHARS = 1000
    first = "数据 <|im_start|> {\"a\": 1} " * 20  # < 1000 characters
    assert c.count_text(first) == ref.count_text(first) and c._auto_chars == len(first) < 1000
    for _ in range(50):  # cache hits: free, not counted
        assert c.count_text(first) == ref.count_text(first)
    assert c._auto_chars == len(first) and c.engine_in_use == "tokenizers"
    ms = [Message(role="tool", content="x" * 300 + str(i), tool_call_id=f"c{i}") for i in range(3)]
    assert c.count_array(ms).tolist() == ref.count_array(ms).tolist()
    assert c.engine_in_use == "fastokens" and c._auto_chars == -1
    more = [Message(role="user", content="after the switch 12345 " * k) for k in range(1, 6)]
    assert c.count_array(more).tolist() == ref.count_array(more).tolist()
    assert repr(c) == f"HFTokenCounter({c.path!r})"
    clone = pickle.loads(pickle.dumps(c))  # a fresh counter: empty caches, counting again
    assert clone.engine == "auto" and clone.engine_in_use == "tokenizers" and clone._auto_chars == 0
    assert clone.count_text(first) == c.count_text(first)

    folder = os.path.dirname(paths["qwen3"])
    cref = ChatTemplateTokenCounter(folder, engine="tokenizers")
    monkeypatch.setattr(ChatTemplateTokenCounter, "AUTO_FASTOKENS_CHARS", 10 ** 12)
    ct = ChatTemplateTokenCounter(folder)
    ct.AUTO_FASTOKENS_CHARS = ct._auto_chars + 2000  # what its construction's probes tokenized, and more
    conv = [Message(role="system", content="Be brief."), Message(role="user", content="hi " * 100)]
    assert ct.count_messages(conv) == cref.count_messages(conv) and ct.engine_in_use == "tokenizers"
    conv += [Message(role="assistant", content=" ".join(map(str, range(600)))),
             Message(role="user", content="again <think> " * 30)]
    assert ct.count_messages(conv) == cref.count_messages(conv)
    assert ct.engine_in_use == "fastokens"
    assert ct.count_array(conv).tolist() == cref.count_array(conv).tolist()
    conv.append(Message(role="user", content="and after " * 50))
    assert ct.count_messages(conv) == cref.count_messages(conv)
    assert repr(ct) == f"ChatTemplateTokenCounter({folder!r})"


def test_forced_engines_ignore_the_threshold(paths, monkeypatch):
    monkeypatch.setattr(HFTokenCounter, "AUTO_FASTOKENS_CHARS", 0)
    monkeypatch.setattr(ChatTemplateTokenCounter, "AUTO_FASTOKENS_CHARS", 0)
    c = HFTokenCounter(paths["mistral"], engine="tokenizers")
    c.count_text("hello world " * 100)
    assert c.engine_in_use == "tokenizers" and c._auto_chars == -1
    ct = ChatTemplateTokenCounter(os.path.dirname(paths["mistral"]), engine="tokenizers")
    assert ct.engine_in_use == "tokenizers" and ct._auto_chars == -1
    if HAVE_FASTOKENS:
        f = HFTokenCounter(paths["mistral"], engine="fastokens")
        assert f.engine_in_use == "fastokens" and f._auto_chars == -1
        assert f.count_text("hello world " * 100) == c.count_text("hello world " * 100)
