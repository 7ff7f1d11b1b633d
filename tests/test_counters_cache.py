"""Cached counting: each distinct text tokenized once, stale counts impossible, thread safety,
pickling by name or path."""

from __future__ import annotations

import pickle
import shutil
import threading
from pathlib import Path

import pytest
import tiktoken

from jianmu_fast.errors import TokenizerLoadError
from jianmu_fast.memory.context import HFTokenCounter, TiktokenTokenCounter
from jianmu_fast.memory.context._encodings import load_tiktoken_encoding
from jianmu_fast.message import ai, human, system, tool

MINILM = Path(__file__).parent / "data" / "all-MiniLM-L6-v2.tokenizer.json"


class SpyCore:
    """Wraps tiktoken's Rust core and records every text it is asked to encode."""

    def __init__(self, core):
        self.core = core
        self.seen: list[str] = []

    def encode_ordinary(self, text):
        self.seen.append(text)
        return self.core.encode_ordinary(text)

    def __getattr__(self, name):
        return getattr(self.core, name)


def spied_counter(**kw) -> tuple[TiktokenTokenCounter, SpyCore]:
    real = load_tiktoken_encoding("o200k_base")
    enc = tiktoken.Encoding(name="o200k_base", pat_str=real._pat_str,
                            mergeable_ranks=real._mergeable_ranks, special_tokens=real._special_tokens)
    spy = SpyCore(enc._core_bpe)
    enc._core_bpe = spy
    return TiktokenTokenCounter(enc, **kw), spy


@pytest.fixture(scope="module")
def spied():
    return spied_counter


def conversation():
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "tea"}'}},
             {"id": "c2", "type": "function", "function": {"name": "search", "arguments": '{"q": "tea"}'}}]
    return [system("Be brief."), human("find tea"), ai(None, tool_calls=calls),
            tool("green tea", name="search", tool_call_id="c1"), tool("green tea", name="search", tool_call_id="c2"),
            ai("Green tea."), human("find tea")]


def test_each_distinct_text_is_tokenized_once(spied):
    c, spy = spied()
    msgs = conversation()
    first = c.count_array(msgs).tolist()
    texts = spy.seen[:]
    assert len(texts) == len(set(texts)), "a text was tokenized twice in one pass"
    assert set(texts) >= {"Be brief.", "find tea", "search", '{"q": "tea"}', "green tea", "Green tea."}
    spy.seen.clear()
    assert c.count_array(msgs).tolist() == first
    assert c.count_messages(msgs) == 3 + sum(first)
    assert [c.count_message(m) for m in msgs] == first
    assert c.count_array(msgs[2:5]).tolist() == first[2:5]
    assert spy.seen == [], "a warm recount called the tokenizer"
    # a new message object with already-seen texts costs no tokenization either
    assert c.count_message(human("find tea")) == first[1]
    assert spy.seen == []


def test_copies_with_the_same_id_do_not_share_a_count():
    c = TiktokenTokenCounter()
    m = human("short")
    longer = m.model_copy(update={"content": "a much longer message than the first one"})
    assert longer.id == m.id
    a, b = c.count_message(m), c.count_message(longer)
    assert b > a
    assert c.count_array([m, longer]).tolist() == [a, b]


def test_in_place_mutation_of_nested_parts_is_refused_and_the_callers_lists_are_copied():
    """Issue 12 item 4: content blocks and tool calls are frozen copies, so no count goes stale."""
    c = TiktokenTokenCounter()
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    m = ai(None, tool_calls=calls)
    before = c.count_message(m)
    calls[0]["function"]["arguments"] = '{"query": "something quite a bit longer"}'  # the caller's list
    assert m.tool_calls[0]["function"]["arguments"] == "{}"
    assert c.count_message(m) == before
    with pytest.raises(TypeError, match="immutable"):
        m.tool_calls[0]["function"]["arguments"] = "{}"
    blocks = human([{"type": "text", "text": "x"}])
    with pytest.raises(TypeError, match="immutable"):
        blocks.content[0]["text"] = "x y z w v u"
    with pytest.raises(TypeError, match="immutable"):
        blocks.content.append({"type": "text", "text": "more"})
    # metadata stays a plain dict and is never counted
    n = c.count_message(blocks)
    blocks.metadata["note"] = "x " * 500
    assert c.count_message(blocks) == n == TiktokenTokenCounter().count_message(blocks)


def test_cache_is_bounded_and_counts_stay_exact():
    c = TiktokenTokenCounter(cache_size=16)
    enc = load_tiktoken_encoding("o200k_base")
    msgs = [human(f"message number {i} " * (i % 5 + 1)) for i in range(200)]
    for _ in range(2):
        assert c.count_array(msgs).tolist() == [3 + 1 + len(enc.encode_ordinary(m.content)) for m in msgs]
        info = c.cache_info()
        assert info["texts"] <= 16 and info["messages"] <= 16 and info["cache_size"] == 16


def test_collected_messages_leave_no_stale_entry():
    """The message cache holds weak references: a new object reusing an id is a miss."""
    c = TiktokenTokenCounter()
    for i in range(300):  # CPython reuses ids of freed objects quickly
        m = human("x" * (i % 7 + 1))
        assert c.count_message(m) == 3 + 1 + c.count_text("x" * (i % 7 + 1))
        del m


def test_threads_share_a_counter(spied):
    c, spy = spied(cache_size=64)
    msgs = [human(f"thread text {i % 150} " + "word " * (i % 13)) for i in range(600)]
    expected = TiktokenTokenCounter().count_array(msgs).tolist()
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def work(offset):
        try:
            for k in range(5):
                shift = (offset * 37 + k * 91) % 600
                got = c.count_array(msgs[shift:] + msgs[:shift]).tolist()
                results.append(got == expected[shift:] + expected[:shift])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(results) and len(results) == 40
    assert c.count_array(msgs).tolist() == expected


# -- pickling ------------------------------------------------------------------------------------


def test_tiktoken_pickles_by_name():
    c = TiktokenTokenCounter("gpt-4", cache_size=123, image_tokens=7)
    c.count_array(conversation())
    blob = pickle.dumps(c)
    assert len(blob) < 400, "the vocabulary or the cache travelled"
    back = pickle.loads(blob)
    assert (back.encoding_name, back.cache_size, back.image_tokens) == ("cl100k_base", 123, 7)
    assert back.cache_info()["texts"] == 0
    assert back.count_array(conversation()).tolist() == c.count_array(conversation()).tolist()


def test_tiktoken_from_a_known_encoding_object_pickles_by_name():
    real = load_tiktoken_encoding("o200k_base")
    copy = tiktoken.Encoding(name="o200k_base", pat_str=real._pat_str,
                             mergeable_ranks=real._mergeable_ranks, special_tokens=real._special_tokens)
    for enc in (real, copy):
        blob = pickle.dumps(TiktokenTokenCounter(enc))
        assert len(blob) < 400
        assert pickle.loads(blob).count_text("hello world") == 2


def test_tiktoken_from_a_custom_encoding_refuses_to_pickle():
    real = load_tiktoken_encoding("cl100k_base")
    custom = tiktoken.Encoding(name="my_cl100k_im", pat_str=real._pat_str, mergeable_ranks=real._mergeable_ranks,
                               special_tokens={**real._special_tokens, "<|im_start|>": 100264})
    c = TiktokenTokenCounter(custom)
    assert c.count_text("<|im_start|>") == len(real.encode_ordinary("<|im_start|>"))
    with pytest.raises(pickle.PicklingError, match="'my_cl100k_im'.*Build the counter from a name"):
        pickle.dumps(c)


def test_hf_pickles_by_path(tmp_path):
    path = tmp_path / "tokenizer.json"
    shutil.copyfile(MINILM, path)
    c = HFTokenCounter(path)
    blob = pickle.dumps(c)
    assert len(blob) < 600
    back = pickle.loads(blob)
    assert back.path == str(path)
    assert back.count_array(conversation()).tolist() == c.count_array(conversation()).tolist()
    path.write_text(path.read_text().replace('"[UNK]"', '"[UNKNOWN]"'))
    with pytest.raises(TokenizerLoadError, match="changed since the counter was pickled"):
        pickle.loads(blob)


def test_hf_from_an_object_refuses_to_pickle():
    from tokenizers import Tokenizer

    c = HFTokenCounter(Tokenizer.from_file(str(MINILM)))
    with pytest.raises(pickle.PicklingError, match=r"tok\.save\('tokenizer\.json'\)"):
        pickle.dumps(c)


def test_image_tokens_is_read_only():
    c = TiktokenTokenCounter(image_tokens=10)
    with pytest.raises(AttributeError):
        c.image_tokens = 765
    assert c.image_tokens == 10


def test_text_cache_is_bounded_in_characters():
    class Small(TiktokenTokenCounter):
        MAX_CACHED_CHARS = 640  # texts over 10 characters are not kept

    c = Small()
    enc = load_tiktoken_encoding("o200k_base")
    texts = [f"t{i:03d}" for i in range(300)] + ["a long text " * 50]
    assert [c.count_text(t) for t in texts] == [len(enc.encode_ordinary(t)) for t in texts]
    assert "a long text " * 50 not in c._texts
    assert sum(map(len, c._texts)) <= 640 and 0 < c.cache_info()["texts"] <= 160
    msg = human("a long text " * 50)
    assert c.count_message(msg) == c.count_message(msg) == 4 + len(enc.encode_ordinary(msg.content))


def test_threads_share_an_hf_counter():
    c = HFTokenCounter(MINILM, cache_size=32)
    msgs = [human(f"thread text {i % 90} " + "word " * (i % 11)) for i in range(300)]
    expected = HFTokenCounter(MINILM).count_array(msgs).tolist()
    outcomes: list[bool] = []

    def work(offset):
        for k in range(4):
            shift = (offset * 31 + k * 53) % 300
            outcomes.append(c.count_array(msgs[shift:] + msgs[:shift]).tolist() == expected[shift:] + expected[:shift])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == [True] * 24


# -- the compiled counting loop equals its pure-Python twin -------------------------------------

def _messages_for_counting(draw_ops, surrogates=True):
    """Messages from drawn ops: plain texts (some shared), names, content blocks with images,
    tool calls and results, dicts to coerce, unfrozen messages (model_construct), repeats."""
    from jianmu_fast.message import Message

    words = ["hi", "token budget", "上下文 🙂", "{\"a\": 1}", "", "x" * 30]
    if surrogates:  # tiktoken repairs them (HF tokenizers refuse them)
        words.append("lone \ud800 surrogate")
    out: list = []
    for op, k in draw_ops:
        w = words[k % len(words)]
        if op == 0:
            out.append(human(w or "q"))
        elif op == 1:
            out.append(ai(w, name="bot") if k % 2 else system(w or "s"))
        elif op == 2:
            calls = [{"id": f"c{k}_{j}", "type": "function", "function": {"name": "find", "arguments": w or "{}"}}
                     for j in range(1 + k % 2)]
            out.append(ai(None, tool_calls=calls))
            out.extend(tool(w or "r", tool_call_id=c["id"]) for c in calls)
        elif op == 3:
            out.append(human([{"type": "text", "text": w or "t"}, {"type": "image_url", "image_url": {"url": "u"}}]))
        elif op == 4:
            out.append({"role": "user", "content": w or "d"})
        elif op == 5:
            out.append(Message.model_construct(role="assistant", content=None, name=None, tool_call_id=None,
                                               tool_calls=[{"id": "z", "type": "function",
                                                            "function": {"name": "f", "arguments": w}}],
                                               metadata={}, extra={}, id=f"m{k}"))
        elif op == 6 and out:
            out.append(out[k % len(out)])  # the same object again
    return out


def _cache_state(counter):
    return (list(counter._texts.items()), counter._chars,
            [(key, e[0]() is not None, e[1]) for key, e in counter._msgs.items()],
            getattr(counter, "_auto_chars", None), getattr(counter, "engine_in_use", None))


@pytest.mark.skipif(__import__("os").environ.get("JIANMU_FAST_PURE_PYTHON") == "1", reason="pure-Python run")
@pytest.mark.parametrize("kind", ["tiktoken", "tiktoken-engine", "auto-switch", "hf"])
def test_compiled_counts_equal_the_twin_caches_included(kind):
    """``counts_of`` (compiled) and ``_filter_core_py.counts_of``: the same counts, the same
    text cache (content, order, characters) and message cache (keys, order, counts), over
    random message lists counted in random chunks, with evictions (small ``cache_size``)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import jianmu_fast._filter_core as core_c
    import jianmu_fast._filter_core_py as core_py

    def make(cache_size):
        if kind == "hf":
            return HFTokenCounter(str(MINILM), cache_size=cache_size)
        if kind == "tiktoken-engine":  # engine="tiktoken": the loop calls tiktoken's core directly
            counter = TiktokenTokenCounter("o200k_base", cache_size=cache_size, engine="tiktoken")
            assert counter._direct_encode is not None
            return counter
        counter = TiktokenTokenCounter("o200k_base", cache_size=cache_size)
        assert counter._direct_encode is not None  # engine="auto" also calls tiktoken's core directly
        if kind == "auto-switch":  # ... until its rule moves it to fastokens (if installed) mid-stream
            counter.AUTO_FASTOKENS_CHARS = 300
        return counter

    @settings(max_examples=60, deadline=None)
    @given(ops=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40)), max_size=40),
           cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8), cache_size=st.sampled_from([3, 8, 1 << 16]))
    def check(ops, cuts, cache_size):
        msgs = _messages_for_counting(ops, surrogates=kind != "hf")
        counters = [make(cache_size), make(cache_size)]
        fresh = make(1 << 16)
        pos, step = 0, 0
        while pos < len(msgs):
            part = msgs[pos:pos + cuts[step % len(cuts)]]
            results = [core.counts_of(c, part, "messages") for core, c in zip((core_c, core_py), counters)]
            assert results[0] == results[1]
            assert results[0] == [fresh.count_message(m) if not isinstance(m, dict) else results[0][j]
                                  for j, m in enumerate(part)]
            assert _cache_state(counters[0]) == _cache_state(counters[1])
            pos += len(part)
            step += 1

    check()


def test_counts_of_coercion_errors_are_the_same_on_both():
    import os

    from jianmu_fast.errors import MessageValidationError
    import jianmu_fast._filter_core_py as core_py

    cores = [core_py]
    if os.environ.get("JIANMU_FAST_PURE_PYTHON") != "1":
        import jianmu_fast._filter_core as core_c

        cores.append(core_c)
    for core in cores:
        c = TiktokenTokenCounter("o200k_base")
        with pytest.raises(MessageValidationError, match=r"messages\[1\]: expected a Message or a chat-completions dict, got int"):
            core.counts_of(c, [human("a"), 5])
        with pytest.raises(MessageValidationError, match=r"^message: expected a Message"):
            core.counts_of(c, [5], "message")


def test_auto_engine_counts_directly_and_keeps_its_switching_rule(monkeypatch):
    """``engine="auto"``: the counting loop encodes with tiktoken's core directly and adds
    the characters to the rule's tally (each distinct new text once, as ``_encode_counts``
    would); the call that reaches ``AUTO_FASTOKENS_CHARS`` goes through the rule, and once
    fastokens is engaged the direct path is dropped. Counts never change."""
    from jianmu_fast import _backend
    from jianmu_fast.memory.context import _encodings

    monkeypatch.setattr(TiktokenTokenCounter, "AUTO_FASTOKENS_CHARS", 40)
    c = TiktokenTokenCounter("o200k_base")
    ref = TiktokenTokenCounter("o200k_base", engine="tiktoken")
    assert c._direct_encode is not None and c._auto_chars == 0
    _backend.counts_of(c, [human(""), ai("")])  # the roles' own texts go through count_text
    base = c._auto_chars
    first = [human("hello there"), ai("hello there"), human("twelve chars")]
    assert _backend.counts_of(c, first) == [ref.count_message(m) for m in first]
    assert c._auto_chars == base + len("hello there") + len("twelve chars") and c.engine_in_use == "tiktoken"
    more = [human("x" * 30)]
    assert _backend.counts_of(c, more) == [ref.count_message(more[0])]
    try:
        _encodings.import_fastokens()
        have = True
    except ImportError:  # pragma: no cover - the [fast] extra is installed for the tests
        have = False
    assert c._auto_chars == -1 and c.engine_in_use == ("fastokens" if have else "tiktoken")
    assert (c._direct_encode is None) == have
    last = [human("after the switch")]
    assert _backend.counts_of(c, last) == [ref.count_message(last[0])]
    assert TiktokenTokenCounter("o200k_base", engine="tiktoken")._auto_chars == -1


def test_the_message_cache_leaves_the_cyclic_collector_and_lets_messages_go():
    """The compiled counting loop keeps each message's entry out of the cyclic collector's sight
    (its weak reference has no callback and holds nothing strongly; the entry holds it and
    ints and a role): behind many conversations the entries brought on full collections.
    Untracked, the weak reference still dies with its message -- by reference counting, or by
    the collector where the message is part of a cycle -- and the entry answers no new
    message at that address. The pure-Python run keeps them tracked (the same counts)."""
    import gc

    from jianmu_fast import _backend
    from jianmu_fast.message import Message

    c = TiktokenTokenCounter("o200k_base")
    plain = human("hello there")
    cyc = Message(role="user", content="again", metadata={"me": []})
    cyc.metadata["me"].append(cyc)
    counts = c.count_array([plain, cyc]).tolist()
    entries = [c._msgs[id(plain)], c._msgs[id(cyc)]]
    assert [e[0]() for e in entries] == [plain, cyc]
    tracked = [gc.is_tracked(e) or gc.is_tracked(e[0]) for e in entries]
    assert tracked == ([True, True] if _backend.BACKEND == "python" else [False, False])
    del plain, cyc
    gc.collect()
    assert [e[0]() for e in entries] == [None, None]
    assert c.count_array([human("hello there")]).tolist() == counts[:1]
