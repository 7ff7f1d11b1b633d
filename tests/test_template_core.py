"""The compiled chat-template hot path (``_template_core``) equals its pure-Python twin.

``csrc/_template_core.pyx`` includes the twin's source, so they can differ only where Cython's
semantics differ from Python's; these tests hold them equal on the counter's hot loop (random
conversations with tool calls, turn by turn through ``TokenBudgetFilter``, and whole) and on
the message helpers (template dicts, keys, one-pass tool-call entries).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jianmu_fast import _template_core_py as twin
from jianmu_fast.memory.context import ChatTemplateTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context._template_frames import Frames
from jianmu_fast.message import Message

compiled = pytest.importorskip("jianmu_fast._template_core")

_HERE = os.path.join(os.path.dirname(__file__), "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data_core", os.path.join(_HERE, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]

FAMILIES = ["qwen3", "hermes", "llama3.1", "mistral", "gpt-oss", "deepseek-v3"]
#: the core's functions that are ChatTemplateTokenCounter's methods (attribute names)
METHODS = {"count_messages": "count_messages", "count_list": "_count_list", "prefill_units": "_prefill_units",
           "plan": "_plan", "plan_texts": "_plan_texts", "planned_cost": "_planned_cost", "upper_costs": "_upper_costs", "piece_counts": "_piece_counts", "frame_part": "_frame_part",
           "entries_stable": "_entries_stable", "call_entries": "_call_entries", "entry": "_entry",
           "any_lookahead": "_any_lookahead", "trait": "_trait", "overlap": "_overlap", "segments": "_segments",
           "unit_total": "_unit_total", "store_all": "_store_all", "user_repeats": "_user_repeats",
           "tools_signature": "_tools_signature", "turn_list": "_turn_list"}


#: the core's own helpers (called from the methods above, each of the same build)
HELPERS = {"any_orphan", "any_system", "encode_lengths", "end_cost", "head_groups", "holds_token", "json_escaped", "token_searches", "is_local", "json_snapshot", "json_unchanged", "keep_last", "role_of", "unit_locality", "unit_preds", "last_final", "plan_groups",
           "planned_costs", "prefill_planned", "recall", "run_text", "run_text_of", "unit_parts", "unit_succ",
           "local_pattern", "ops_hold", "plain_frame", "same_json", "settle", "settle_entry", "put_untracked", "shed_keys", "holds_message_key", "repeats_of_last", "role_positions", "shared_run", "step_costs", "trait_value", "unit_starts", "new_starts",
           "any_whole", "carried_last", "holds_kept", "looks_in", "last_user", "plain_query", "slot_value", "reasoning_entry", "DERIVED",
           "derivation_id", "bisect_ints", "costs_sum"}


def _bound(core):
    """ChatTemplateTokenCounter with its hot path taken from ``core``."""
    attrs = {attr: getattr(core, name) for name, attr in METHODS.items()}
    return type(f"Counter_{core.__name__.rsplit('.', 1)[-1]}", (ChatTemplateTokenCounter,), attrs)


TwinCounter = _bound(twin)
CompiledCounter = _bound(compiled)
#: the compiled functions taking ``self`` take a counter derived from the compiled
#: ``CounterCore`` (its fields read at fixed offsets); under ``JIANMU_FAST_PURE_PYTHON=1``
#: ``ChatTemplateTokenCounter`` derives from the twin's, so the tests that hand the compiled
#: build a counter run in the compiled run only (the twin's functions take either counter)
needs_compiled_base = pytest.mark.skipif(
    not issubclass(ChatTemplateTokenCounter, compiled.CounterCore),
    reason="pure-Python run: ChatTemplateTokenCounter derives from the twin's CounterCore, which the "
           "compiled build refuses (the compiled run compares the builds)")


def test_the_class_binds_every_core_method():
    for name, attr in METHODS.items():
        assert getattr(ChatTemplateTokenCounter, attr).__name__ == name
    assert set(METHODS) | {"message_to_template_dict", "message_key", "parse_key", "call_entry",
                           "plain_entry", "block_entry", "args_text", "flat_printed", "put_str", "CounterCore"} | HELPERS == set(twin.__all__)
    assert set(twin.__all__) == set(compiled.__all__)


def test_the_counter_derives_from_the_core_of_its_backend(tmp_path):
    """``ChatTemplateTokenCounter``'s base is the ``CounterCore`` of the backend in use, whose
    fields hold the caches the hot path reads; the compiled functions refuse a counter of the
    twin's base (a ``TypeError`` naming the type expected), a compiled field refuses a value
    of another type, and the counter still pickles by its model folder alone (no field
    travels: the base adds no pickling of its own)."""
    import pickle

    from jianmu_fast import _backend

    core = twin if _backend.BACKEND == "python" else compiled
    assert ChatTemplateTokenCounter.__bases__ == (core.CounterCore,)
    with pytest.raises(TypeError, match="CounterCore"):
        compiled.count_messages(twin.CounterCore(), [])
    with pytest.raises(TypeError, match="CounterCore"):
        compiled.segments(object(), [], [], [])
    c = ChatTemplateTokenCounter(mk.model_dir("qwen3", str(tmp_path)), engine="tokenizers")
    assert c.count_messages([Message(role="user", content="hi")]) > 0 and c._units and c._memo
    if core is compiled:
        with pytest.raises(TypeError, match="dict"):
            c._units = []  # type: ignore[assignment]
    state = pickle.dumps(c)
    assert b"_units" not in state and b"_memo" not in state
    clone = pickle.loads(state)
    assert type(clone) is ChatTemplateTokenCounter and clone.path == c.path and len(state) < 1_000
    assert clone.count_messages([Message(role="user", content="hi")]) == c.count_messages([Message(role="user", content="hi")])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {f: mk.model_dir(f, str(tmp_path_factory.mktemp(f))) for f in FAMILIES}


_text = st.one_of(st.sampled_from(["Paris", "sunny, 21°C", "", " x ", "数据", '"q"\\', "<tool_call>", "</think>",
                                   "<think>\nhm\n</think>\n\nok", "<|im_end|>", "[INST]", "x" * 40,
                                   "Oslo: -3°C, snow; wind 5 m/s. " * 12]),  # (a value run past _UNCACHED_RUN)
                  st.text(max_size=10))
#: content blocks: text (an empty one too), with a cache marker, an image (a fixed part of a frame)
_blocks = st.lists(st.one_of(_text.map(lambda t: {"type": "text", "text": t}),
                             _text.map(lambda t: {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}),
                             st.just({"type": "image_url", "image_url": {"url": "x.png"}})), max_size=3)
#: a user's or a tool result's content: mostly text, at times blocks
_content = st.one_of(_text, _text, _text, _blocks)


@st.composite
def _conversation(draw):
    ms = [Message(role="system", content=draw(_text))] if draw(st.booleans()) else []
    ms.append(Message(role="user", content=draw(_content)))
    n = 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            calls, results = [], []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                args = draw(st.one_of(st.dictionaries(_text, _text, max_size=2).map(json.dumps), st.just("not json")))
                calls.append({"id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": args}})
                results.append(Message(role="tool", content=draw(_content), tool_call_id=f"call_{n}", name="get_weather"))
            extra = {draw(st.sampled_from(["reasoning_content", "reasoning"])): draw(_text)} \
                if draw(st.integers(0, 5)) == 0 else {}
            ms.append(Message(role="assistant", content=draw(st.one_of(st.none(), _text)), tool_calls=calls, extra=extra))
            ms.extend(results)
        else:
            extra = {draw(st.sampled_from(["reasoning_content", "thinking", "reasoning"])): draw(_text)} \
                if draw(st.integers(0, 5)) == 0 else {}
            ms.append(Message(role="assistant", content=draw(_text), extra=extra))
            if kind == 1:
                ms.append(Message(role="user", content=draw(_content)))
    return ms


def _run(cls, path, ms, engine="tokenizers"):
    """What the hot loop sees: per-turn prompt counts and per-message costs (or the error)."""
    c = cls(path, engine=engine)
    flt = TokenBudgetFilter(300, counter=c)
    out: list = []
    history: list[Message] = []
    for m in ms:
        history.append(m)
        if m.role in ("user", "tool"):
            try:
                kept = flt.apply(history)
                out.append((len(kept), c.count_messages(kept), c.count_array(kept).tolist()))
            except Exception as exc:  # the template refuses, or nothing fits: the same error
                out.append((type(exc).__name__, str(exc)))
    try:
        out.append((c.count_messages(ms), c.count_array(ms).tolist()))
    except Exception as exc:
        out.append((type(exc).__name__, str(exc)))
    return out


@needs_compiled_base
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation())
def test_compiled_hot_path_equals_the_twin(model_dirs, family, ms):
    path = model_dirs[family]
    assert _run(CompiledCounter, path, ms) == _run(TwinCounter, path, ms)


def _preds_reference(first_role, true_pred, opened):
    """The neighbours a unit may have before it, as the counter listed them in Python."""
    if first_role == "tool":
        base = ["call", "tool"]
    else:
        base = ["first", "system", "user", "assistant", "tool"]
    if true_pred == "first":
        return ["first"]
    if true_pred is not None:
        base = list(dict.fromkeys([true_pred, "system"] if opened else [true_pred, "first", "system"]))
    if first_role == "system":
        base.append("system_text")
    return base


def test_unit_preds_lists_every_neighbour_on_both_builds():
    roles = ["system", "user", "assistant", "tool"]
    for first_role in roles:
        for true_pred in [None, "first", "system", "user", "assistant", "call", "tool"]:
            for opened in (False, True):
                want = _preds_reference(first_role, true_pred, opened)
                assert compiled.unit_preds(first_role, true_pred, opened) == want
                assert twin.unit_preds(first_role, true_pred, opened) == want
                assert ChatTemplateTokenCounter._preds(first_role, true_pred, opened) == want
    assert compiled.unit_preds("user", "tool") == ["tool", "first", "system"]
    for d in ({"role": "assistant", "tool_calls": [{}]}, {"role": "assistant", "tool_calls": []},
              {"role": "assistant"}, {"role": "tool"}, {"role": "user", "tool_calls": [{}]}):
        want = "call" if d["role"] == "assistant" and d.get("tool_calls") else d["role"]
        assert compiled.role_of(d) == twin.role_of(d) == ChatTemplateTokenCounter._role_of(d) == want


@needs_compiled_base
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation())
def test_unit_locality_is_lookahead_and_locality_on_both_builds(model_dirs, family, ms):
    """``unit_locality`` (asked twice per unit in a turn: the second answer from its cache)
    gives ``(any_lookahead, is_local)`` of each unit, on both builds; it keeps only units that
    are not local, under their keys' tuple."""
    c = ChatTemplateTokenCounter(model_dirs[family], engine="tokenizers")
    keys, dicts, _ = c._entries_stable(ms)
    starts = twin.unit_starts(dicts) + [len(ms)]
    for a, b in zip(starts, starts[1:]):
        ukeys, unit = tuple(keys[a:b]), dicts[a:b]
        want = (twin.any_lookahead(c, ukeys, unit), twin.is_local(c, ukeys, unit))
        for core in (compiled, twin, compiled, twin):  # (the second round: answers kept)
            got = core.unit_locality(c, ukeys, unit)
            assert got == want and type(got[0]) is bool and type(got[1]) is bool
            assert (ukeys in c._looks) == (not want[1])
        assert want[0] is False or want[1] is False


@needs_compiled_base
@pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens not installed")
@pytest.mark.parametrize("family", ["qwen3", "mistral"])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation())
def test_compiled_hot_path_equals_the_twin_on_fastokens(model_dirs, family, ms):
    """The core's own fastokens loop (``encode_lengths``) and the uncached long runs: the
    same counts on both builds, and the same as on tokenizers."""
    path = model_dirs[family]
    got = _run(CompiledCounter, path, ms, "fastokens")
    assert got == _run(TwinCounter, path, ms, "fastokens") == _run(TwinCounter, path, ms)


_FAST_COUNTERS: dict[str, ChatTemplateTokenCounter] = {}


@needs_compiled_base
@pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="fastokens not installed")
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(texts=st.lists(st.text(st.sampled_from(list("ab <>|[]/_\n\t{}\":,.0123éü中文😀")) | st.characters(blacklist_categories=("Cs",)), max_size=40)
                      | st.sampled_from(["<|im_end|>", "[INST]", "<|eot_id|>", "<think>", "<|end|>", "</s>", " <"]),
                      min_size=1, max_size=6).map(lambda parts: "".join(parts)))
def test_the_core_counts_a_piece_without_added_tokens_as_the_tokenizer_does(model_dirs, family, texts):
    """``encode_lengths`` (a unit plan's value runs, which ``plan_texts`` checked to hold no
    added token) counts with fastokens' ``encode_ordinary``: for such a text, on every bundled
    tokenizer, the count of ``tokenizers``' ``encode(text, add_special_tokens=False)``."""
    c = _FAST_COUNTERS.get(family)
    if c is None:
        c = _FAST_COUNTERS[family] = ChatTemplateTokenCounter(model_dirs[family], engine="fastokens")
    if c._split is None or c._search(texts) is not None:
        return  # (a text holding an added token never reaches encode_lengths)
    want = len(c._tok.encode(texts, add_special_tokens=False))
    for core in (twin, compiled):
        assert core.encode_lengths(c, [texts]) == [want]
        assert core.encode_lengths(c, [texts, texts + "x"]) == [want, len(c._tok.encode(texts + "x", add_special_tokens=False))] \
            or c._search(texts + "x") is not None


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 14), st.one_of(st.none(), st.integers(0, 9))), max_size=60),
       size=st.integers(1, 12))
def test_long_run_caches_drop_the_least_recently_used_on_both_builds(ops, size):
    """``recall`` (a lookup that puts the key back last) and ``keep_last`` (a store into a full
    cache, at ``min(_LONG_RUNS, cache_size)`` keys, drops its oldest quarter, at least one
    key) keep an LRU cache: the same one on both
    builds as an ``OrderedDict`` model's (None in ``ops``, or a key held: look it up; else
    store it, as ``run_text`` and ``piece_counts`` store only what they missed)."""
    import collections
    import types

    owner = types.SimpleNamespace(cache_size=size)
    caches = {core: {} for core in (twin, compiled)}
    model: collections.OrderedDict = collections.OrderedDict()
    for key, value in ops:
        if value is None or key in model:
            want = model.get(key, -1)
            if key in model:
                model.move_to_end(key)
            for core, cache in caches.items():
                assert core.recall(cache, key, -1) == want
        else:
            if len(model) >= size:  # full: its oldest quarter dropped, at least one key
                for _ in range(max(size // 4, 1)):
                    model.popitem(last=False)
            model[key] = value
            for core, cache in caches.items():
                core.keep_last(owner, cache, key, value)
        for cache in caches.values():
            assert list(cache.items()) == list(model.items())


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation())
def test_compiled_message_helpers_equal_the_twin(ms):
    fields = ("content", "name", "tool_call_id")
    frames = Frames(lambda ds: "")
    dicts = [twin.message_to_template_dict(m) for m in ms]
    assert compiled.unit_starts(dicts) == twin.unit_starts(dicts)
    for start in range(len(dicts) + 1):
        assert compiled.any_system(dicts, start) == twin.any_system(dicts, start) \
            == any(d["role"] == "system" for d in dicts[start:])
        assert compiled.any_orphan(dicts, start) == twin.any_orphan(dicts, start)
        assert compiled.new_starts(dicts, start) == twin.new_starts(dicts, start) \
            == [i for i in range(start, len(dicts)) if dicts[i]["role"] != "tool"]
        finals = [i for i, d in enumerate(dicts[start:], start) if d["role"] == "assistant" and "tool_calls" not in d]
        assert compiled.last_final(dicts, start, len(dicts)) == twin.last_final(dicts, start, len(dicts)) \
            == (finals[-1] if finals else -1)
        users = [i for i, d in enumerate(dicts[start:], start) if d["role"] == "user"]
        assert compiled.last_user(dicts, start, len(dicts)) == twin.last_user(dicts, start, len(dicts)) \
            == (users[-1] if users else -1)
    tools = [i for i, d in enumerate(dicts) if d["role"] == "tool"]
    orphan = any(not (dicts[u]["role"] == "assistant" and dicts[u].get("tool_calls"))
                 for u in (max(j for j in twin.unit_starts(dicts) if j <= i) for i in tools))
    assert twin.any_orphan(dicts, 0) == orphan
    for d in dicts:
        if d["role"] == "user":
            c = d["content"]
            assert compiled.plain_query(d) == twin.plain_query(d) == (
                type(c) is str and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")))
        part = twin.plain_frame(fields, d)
        assert compiled.plain_frame(fields, d) == part
        if part is not None:  # (None: a dict the frames build themselves)
            assert part == frames.frame_of(d)
        else:
            assert "tool_calls" in d or any(type(v) is not str for v in d.values())
    for m in ms:
        d = twin.message_to_template_dict(m)
        assert compiled.message_to_template_dict(m) == d
        key = twin.message_key(d)
        assert compiled.message_key(d) == key
        assert compiled.parse_key(key) == twin.parse_key(key) == d
        assert compiled.call_entry(m) == twin.call_entry(m)
        got = twin.plain_entry(m, fields)
        assert compiled.plain_entry(m, fields) == got
        if got is not None:  # the one-pass entry of a plain text message: the generic path's
            assert got == (d, key, twin.plain_frame(fields, d))
            assert compiled.plain_entry(m, ("content",)) == (d, key, twin.plain_frame(("content",), d))
        else:
            assert type(m.content) is not str or m.tool_calls is not None or m.extra
        if m.role == "assistant" and len(m.extra) == 1:  # one reasoning field, put into a bare entry
            (field, r), = m.extra.items()
            wide = fields + ("reasoning_content", "thinking", "reasoning")
            one = twin.call_entry(m, True) or twin.plain_entry(m, wide, True)
            if one is not None and type(r) is str:
                got = twin.reasoning_entry(one, field, r)
                assert compiled.reasoning_entry(one, field, r) == got
                assert got[0] == d and list(got[0]) == list(d) and got[1] == key
                assert got[2] == Frames(lambda ds: "", fields=wide).frame_of(d)
        # (bare: the message as without its extra fields, on both builds)
        plain = m.model_copy(update={"extra": {}})
        assert compiled.call_entry(m, True) == twin.call_entry(m, True) == twin.call_entry(plain)
        assert compiled.plain_entry(m, fields, True) == twin.plain_entry(m, fields, True) == twin.plain_entry(plain, fields)
        blocks = twin.block_entry(m, fields)
        assert compiled.block_entry(m, fields) == blocks
        if blocks is not None:  # the one-pass entry of a message with content blocks: the generic path's
            assert blocks == (d, key, frames.frame_of(d))
            narrow = Frames(lambda ds: "", fields=("name",))
            assert compiled.block_entry(m, ("name",)) == (d, key, narrow.frame_of(d))
        else:
            assert type(m.content) is not list or m.tool_calls is not None or m.extra


@settings(max_examples=300, deadline=None)
@given(heads=st.lists(st.text("<[/|tA", max_size=2), max_size=6).map(lambda hs: tuple(sorted(set(hs)))),
       text=st.text("<[/|tAx", max_size=12))
def test_head_groups_find_a_head_exactly_where_a_head_is(heads, text):
    """plan_texts skips the added-token search for a text holding no token head; it looks for
    a head only where its first character occurs (head_groups): same answer as every head."""
    for core in (twin, compiled):
        groups = core.head_groups(heads)
        if "" in heads:
            assert groups is None
            continue
        assert sorted(h for _, hs in groups for h in hs) == sorted(heads)
        assert all(h[0] == c for c, hs in groups for h in hs)
        assert any(c in text and any(h in text for h in hs) for c, hs in groups) == any(h in text for h in heads)


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")) * 2, deadline=None)
@given(v=st.text(st.characters(codec=None) | st.sampled_from(list('"\\/\n\r\t\b\f\x00\x1f\x7f\x80\xff\u2028\ud800😀数é'))),
       repeat=st.sampled_from([1, 2, 300]))
@example(v="", repeat=1)
@example(v="\ud800x\x01", repeat=1)
def test_json_escaped_is_what_tojson_prints_inside_the_quotes(v, repeat):
    """``json_escaped`` (a tool output printed by ``tojson`` in a unit's value run) is
    ``json.dumps(v, ensure_ascii=False)[1:-1]`` on both builds, for strings of every width
    (ASCII, Latin-1, BMP, astral, lone surrogates) and length, and the compiled one's output
    is a canonical str (equal and hashing as the encoder's)."""
    v = v * repeat
    want = json.dumps(v, ensure_ascii=False)[1:-1]
    for core in (twin, compiled):
        got = core.json_escaped(v)
        assert got == want and hash(got) == hash(want) and type(got) is str
        assert max(map(ord, got), default=0) == max(map(ord, want), default=0)


def _token_core(core, tokens):
    """A ``CounterCore`` of ``core`` holding the added-token fields ``holds_token`` reads for
    ``tokens``, and the whole tokens' search (``_piecewise_splitter``'s pattern)."""
    import re as _re

    c = core.CounterCore()
    c._token_head_groups = core.head_groups(tuple(sorted({t[:2] for t in tokens})))
    c._token_firsts = "".join(sorted({t[0] for t in tokens if t}))
    c._token_searches = core.token_searches(tokens)
    c._search = _re.compile("(" + "|".join(_re.escape(t) for t in sorted(tokens, key=len, reverse=True)) + ")").search
    return c


_TOKEN_ALPHABET = "<[/|tIx>]"


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")), deadline=None)
@given(tokens=st.lists(st.text(_TOKEN_ALPHABET, max_size=4), min_size=1, max_size=6).map(lambda ts: sorted(set(ts))),
       parts=st.lists(st.text(_TOKEN_ALPHABET + " a\n数😀", max_size=8), max_size=8),
       pad=st.sampled_from([0, 1, 300]), at=st.sampled_from(["start", "end"]), nxt=st.integers(-1, 5))
@example(tokens=["[INST]", "[/INST]"], parts=["x[IN"], pad=300, at="start", nxt=0)
@example(tokens=["[INST]", "[/INST]"], parts=["x["], pad=300, at="start", nxt=1)
def test_holds_token_finds_an_added_token_exactly_where_the_search_does(tokens, parts, pad, at, nxt):
    """``holds_token`` (a value run's check before it is counted as ordinary text) answers
    what the whole tokens' search answers -- a token starting in the text, inside it or
    running into the next token -- on both builds, for short texts (heads first) and long
    ones (past ``_HEAD_SCAN``: a search per first character)."""
    text = "".join(parts)
    filler = "y" * pad
    text = filler + text if at == "start" else text + filler
    next_token = tokens[nxt % len(tokens)] if nxt >= 0 else ""
    probe = _token_core(twin, tokens)
    if next_token:
        want = probe._search(text + next_token).start() != len(text)
    else:
        want = probe._search(text) is not None
    assert (len(text) > twin._HEAD_SCAN) == (pad == 300)
    for core in (twin, compiled):
        assert core.holds_token(_token_core(core, tokens), text, next_token) is want


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(),
                     st.text(max_size=6), st.sampled_from(["é", '"', "\\", "\n", "\x00", "/", "\u2028", "数"]))
_values = st.recursive(_scalars, lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=4), ch, max_size=3),
                       max_leaves=6)


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")), deadline=None)
@given(obj=st.dictionaries(st.text(max_size=5), _values, max_size=4),
       style=st.sampled_from(["dumps", "ascii", "compact", "indent", "text"]), twice=st.booleans())
@example(obj={}, style="text:{\"a\": -0}", twice=False)
@example(obj={}, style="text:{\"a\": 1, \"a\": 2}", twice=False)
@example(obj={}, style='text:{"a": "\\u00e9", "b": "x\\/y"}', twice=False)
@example(obj={}, style="text:{\"a\": 1.0, \"b\": 1e5, \"c\": 10}", twice=False)
@example(obj={}, style="text:{\"a\":1}", twice=False)
@example(obj={}, style="text:{}", twice=False)
@example(obj={}, style="text:{\"a\": NaN}", twice=False)
def test_args_text_is_the_printed_arguments(obj, style, twice):
    """``args_text`` (the arguments' text kept where it is already printed as ``tojson``
    prints it) equals ``json.dumps(json.loads(text), ensure_ascii=False)`` on both builds."""
    if style.startswith("text:"):
        text = style[5:]
    else:
        text = {"dumps": json.dumps(obj, ensure_ascii=False), "ascii": json.dumps(obj), "text": json.dumps(obj),
                "compact": json.dumps(obj, separators=(",", ":")), "indent": json.dumps(obj, indent=1)}[style]
    if twice and obj:  # every key twice (the last value wins, at the first one's place)
        text = text[:-1] + ", " + text[1:]
    args = json.loads(text)
    want = json.dumps(args, ensure_ascii=False)
    assert twin.args_text(text, args) == want
    assert compiled.args_text(text, args) == want


#: text shaped like tool-call arguments: JSON's punctuation, digits, words and the characters
#: an escape-free string must not hold, so that most draws are near-misses of a flat object
_flat_alphabet = st.sampled_from(['{', '}', '"', ':', ' ', ',', '-', '0', '1', '9', '5', 'a', 'é', 'true', 'false',
                                  'null', 'nul', '\\', '\n', '\x1f', '\x7f', '[', '.', 'e', '数'])
_flat_texts = st.one_of(
    st.lists(_flat_alphabet, max_size=24).map("".join),
    st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=4)),
                    max_size=4).map(json.dumps),
    st.dictionaries(st.text(max_size=4), st.integers(-9, 99), max_size=3).map(json.dumps).flatmap(
        lambda t: st.integers(0, len(t)).flatmap(lambda i: _flat_alphabet.map(lambda c: t[:i] + c + t[i + 1:]))),
)


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")) * 4, deadline=None)
@given(text=_flat_texts)
@example(text='{"a": 0}')
@example(text='{"a": -0}')
@example(text='{"a": 01}')
@example(text='{"a": "x}')
@example(text='{"a": 1}}')
@example(text='{"a": true, "b": null, "c": false}')
@example(text='{"a": truex}')
@example(text='{"a": "b", }')
@example(text='{"": ""}')
@example(text="{}")
@example(text="{ }")
@example(text="{")
@example(text="")
def test_flat_printed_is_the_regular_expression(text):
    """``flat_printed`` (the character scan ``args_text`` runs) accepts exactly what
    ``_FLAT_PRINTED`` (the regular expression it replaced) fully matches, on both builds."""
    want = twin._FLAT_PRINTED.fullmatch(text) is not None
    assert twin.flat_printed(text) is want
    assert compiled.flat_printed(text) is want


@given(st.lists(st.sampled_from(["id", "type", "function", "name", "arguments", "x"]), unique=True, max_size=4),
       st.sampled_from([("id", "type", "function"), ("name", "arguments"), ()]), st.booleans())
def test_the_call_dict_reads_are_dict_reads_on_both_builds(ks, keys, frozen):
    """``_keys_are`` is ``tuple(d) == keys`` and ``_dict_get`` is ``dict.get`` on both builds,
    for a dict and a validated message's ``FrozenDict`` (``call_entry``'s reads of a call)."""
    from jianmu_fast.message.model import FrozenDict

    d = {k: i for i, k in enumerate(ks)}
    d = FrozenDict(d) if frozen else d
    for core in (twin, compiled):
        assert core._keys_are(d, keys) == (tuple(d) == keys)
        assert [core._dict_get(d, k) for k in ("id", "type", "x", "nope")] == [d.get(k) for k in ("id", "type", "x", "nope")]


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")), deadline=None)
@given(a=st.lists(st.integers(-3, 40), max_size=30).map(sorted), x=st.integers(-5, 45),
       costs=st.lists(st.integers(0, 2**40), max_size=5), as_list=st.booleans())
def test_the_sums_and_searches_of_segments_are_the_builtins_on_both_builds(a, x, costs, as_list):
    """``bisect_ints`` is ``bisect.bisect_left`` (``right``: ``bisect_right``) on a sorted list
    of ints, repeated values included, and ``costs_sum`` is ``sum`` of a tuple of costs (or any
    other iterable), on both builds."""
    import bisect

    for core in (twin, compiled):
        assert core.bisect_ints(a, x) == bisect.bisect_left(a, x)
        assert core.bisect_ints(a, x, True) == bisect.bisect_right(a, x)
        assert core.costs_sum(list(costs) if as_list else tuple(costs)) == sum(costs)


@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "500")), deadline=None)
@given(s=st.one_of(st.text(max_size=80), st.text(st.characters(max_codepoint=0x7f), max_size=70),
                   st.sampled_from(["", "call_1", 'a"b', "a\\b", "\x00", "\x1f", "\x7f", "\u2028", "x" * 64, "x" * 65,
                                    "\ud800"])))
def test_put_str_is_the_encoder(s):
    """``put_str`` appends ``json.encoder.encode_basestring(s)`` (in pieces) on both builds."""
    for core in (twin, compiled):
        out = ["<"]
        core.put_str(out, s)
        assert out[0] == "<" and "".join(out[1:]) == json.encoder.encode_basestring(s)


def _replay(cls, path, ms, ops):
    """Counts of successive calls over windows of ``ms`` (``ops``: (lo, hi, pinned, swap)),
    each call's ``call_entries`` answer, and the state kept for the next call."""
    c = cls(path)
    out: list = []
    for lo, hi, pinned, swap in ops:
        window = ms[:1] + ms[lo:hi] if pinned and lo > 0 else ms[lo:hi]
        if swap is not None and window:  # a message replaced in place (the same length)
            window[swap % len(window)] = ms[(swap * 7) % len(ms)]
        last = (c._last_ms, c._last)
        try:
            out.append(c.count_messages(window))
        except Exception as exc:  # the template refuses: the same error
            out.append((type(exc).__name__, str(exc)))
        after = (c._last_ms, c._last)
        c._last_ms, c._last = last  # call_entries' answer from the same state
        out.append(c._call_entries(list(window))[2] if window else None)
        c._last_ms, c._last = after
        out.append((c._last_ms and c._last_ms[1], c._last and c._last[1:]))
    return out


@needs_compiled_base
@pytest.mark.parametrize("family", ["qwen3", "llama3.1", "mistral"])
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation(), data=st.data())
def test_compiled_window_alignment_equals_the_twin(model_dirs, family, ms, data):
    """Successive calls over windows of one history (extended, cut moved after a pinned first
    message or not, shrunk, a message replaced in place): the same counts, the same
    alignment with the previous call (``call_entries``) and the same kept state on both builds."""
    ops = []
    for _ in range(6):
        lo = data.draw(st.integers(0, len(ms) - 1))
        ops.append((lo, data.draw(st.integers(lo + 1, len(ms))), data.draw(st.booleans()),
                    data.draw(st.one_of(st.none(), st.integers(0, 50)))))
    path = model_dirs[family]
    assert _replay(CompiledCounter, path, ms, ops) == _replay(TwinCounter, path, ms, ops)


class _Noted(Message):
    """A Message subclass (its fields are read by attribute, not from ``__dict__``)."""

    note: str = ""


def test_a_message_subclass_gets_the_entries_of_the_message_it_copies():
    fields = ("content", "name", "tool_call_id")
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    for m in (Message(role="tool", content="ok", tool_call_id="c1", name="f"),
              Message(role="assistant", content="On it.", tool_calls=call),
              Message(role="assistant", content=None, tool_calls=call)):
        sub = _Noted(**m.model_dump(exclude={"metadata", "extra", "id"}), note="n")
        for core in (compiled, twin):
            assert core.plain_entry(sub, fields) == core.plain_entry(m, fields)
            assert core.call_entry(sub) == core.call_entry(m)
            if m.tool_calls:
                assert core.call_entry(m) is not None and core.plain_entry(m, fields) is None
            else:
                assert core.plain_entry(m, fields) is not None and core.call_entry(m) is None


_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=3),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=2), c, max_size=3), max_leaves=8)


def _retyped(v):
    """``v`` with ints as floats and dict keys reversed: equal (``==``), printed otherwise."""
    if isinstance(v, dict):
        return {k: _retyped(v[k]) for k in reversed(list(v))}
    if isinstance(v, list):
        return [_retyped(x) for x in v]
    return float(v) if type(v) is int else v


@settings(max_examples=500, deadline=None)
@given(a=_json, how=st.sampled_from(["copy", "retyped", "other"]), other=_json)
def test_same_json_is_printed_alike_by_tojson(a, how, other):
    """``same_json`` (the tool list's cache check) on both builds: true exactly where the two
    values print alike as JSON -- not for ``1`` against ``1.0`` or ``True``, reordered keys,
    ``0.0`` against ``-0.0``."""
    b = {"copy": lambda: json.loads(json.dumps(a)), "retyped": lambda: _retyped(a), "other": lambda: other}[how]()
    want = json.dumps(a) == json.dumps(b)
    assert twin.same_json(a, b) == compiled.same_json(a, b) == want
    assert twin.same_json([a], [b]) == compiled.same_json({"t": a}, {"t": b}) == want


def _nested(o, out):
    """Every list and dict in the JSON tree ``o``, ``o`` first."""
    if type(o) in (list, dict):
        out.append(o)
        for v in (o.values() if type(o) is dict else o):
            _nested(v, out)
    return out


@settings(max_examples=500, deadline=None)
@given(a=st.lists(_json, max_size=3) | st.dictionaries(st.text(max_size=2), _json, max_size=3),
       edit=st.sampled_from(["none", "new top", "retype in place", "set in place", "grow", "copy a child", "reorder"]),
       pick=st.integers(0, 50))
def test_json_unchanged_tells_the_same_tree_from_any_edit(a, edit, pick):
    """``json_snapshot`` / ``json_unchanged`` (how the tool list passed again is recognized
    without comparing it), on both builds: after no edit, or with the same contents in a new
    top-level list or dict, the tree is unchanged; after any edit in place -- an int made an
    equal float, a value set, an element added, a child replaced by an equal copy, keys
    reordered -- it is not, and it never says unchanged where the JSON now prints otherwise."""
    printed = json.dumps(a)
    snaps = {core: core.json_snapshot(a) for core in (twin, compiled)}
    assert snaps[twin] == snaps[compiled] and snaps[twin] is not None
    containers = _nested(a, [])
    target = containers[pick % len(containers)]
    b = a
    changed = True
    if edit == "none":
        changed = False
    elif edit == "new top":
        b = list(a) if type(a) is list else dict(a)
        changed = False
    elif edit == "grow":
        if type(target) is list:
            target.append(None)
        else:
            target["\0new"] = None
    else:
        keys = list(range(len(target))) if type(target) is list else list(target)
        if not keys:
            changed = False
        else:
            k = keys[pick % len(keys)]
            if edit == "retype in place":
                v = target[k]
                target[k] = float(v) if type(v) is int else (int(v) if type(v) is float and v.is_integer() and abs(v) < 2 ** 53 else [v])
            elif edit == "set in place":
                target[k] = "\0set"
            elif edit == "copy a child":
                target[k] = json.loads(json.dumps(target[k]))
                changed = type(target[k]) in (list, dict) or target[k] is not None  # (a new object where one stood)
            elif edit == "reorder":
                if type(target) is dict and len(target) > 1:
                    items = list(target.items())
                    target.clear()
                    target.update(reversed(items))
                else:
                    changed = False
    got = {core: core.json_unchanged(snaps[core], b) for core in (twin, compiled)}
    assert got[twin] == got[compiled]
    if got[twin]:
        assert json.dumps(b) == printed
    if not changed:
        assert got[twin]
    elif edit in ("grow", "set in place", "reorder"):
        assert not got[twin]
    assert twin.json_snapshot([(1, 2)]) is None and compiled.json_snapshot({"a": {1, 2}}) is None


_said = st.sampled_from(["continue", "go on", "continue ", ""])


@st.composite
def _repeating_conversation(draw):
    """Short texts from few choices: user messages often equal the last one, or differ from it
    only in a name, trailing space, or an assistant's role; tool turns between them."""
    ms: list[Message] = [Message(role="system", content=draw(_said))] if draw(st.booleans()) else []
    for n in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 4))
        if kind <= 1:
            name = draw(st.sampled_from([None, None, "ana", "bo"]))
            ms.append(Message(role="user", content=draw(_said), name=name))
        elif kind == 2:
            ms.append(Message(role="assistant", content=draw(_said)))
        else:
            call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ms += [Message(role="assistant", content=None, tool_calls=[call]),
                   Message(role="tool", content=draw(_said), tool_call_id=f"c{n}", name="f")]
    return ms


@pytest.fixture(scope="module")
def mistral_counters(model_dirs):
    return [cls(model_dirs["mistral"]) for cls in (CompiledCounter, TwinCounter)]


@needs_compiled_base
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_repeating_conversation(), grow=_repeating_conversation())
def test_user_repeats_are_the_earlier_user_messages_the_template_sees_equal_to_the_last(mistral_counters, ms, grow):
    """``_user_repeats`` (what Mistral's template prints the tools again before) on both
    builds: the user messages before the last user message whose template dicts equal its,
    on a prompt, the prompt grown (the identity path of ``call_entries``), and its tail."""
    def want(msgs):
        dicts = [twin.message_to_template_dict(m) for m in msgs]
        users = [i for i, d in enumerate(dicts) if d["role"] == "user"]
        return [i for i in users[:-1] if dicts[i] == dicts[users[-1]]]

    for c in mistral_counters:
        for msgs in (ms, ms + grow, (ms + grow)[1:], []):
            assert c._user_repeats(list(msgs)) == want(msgs), type(c).__name__
    assert want([Message(role="user", content="go on"), Message(role="assistant", content="ok"),
                 Message(role="user", content="go on")]) == [0]  # (the reference finds a repeat)


@needs_compiled_base
@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize("family", ["qwen3", "hermes", "llama3.1"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(ms=_conversation())
def test_a_tiny_cache_evicts_and_counts_the_same(model_dirs, family, size, ms):
    """``cache_size`` 1 and 4: every cache is evicted turn after turn (the stores take no lock,
    the evictions do; a cache of 1-3 keys drops at least one); the counts are those of a
    roomy cache, on both builds, and no cache of the counter outgrows its size (the frame and
    plan tables, shared by every counter of a template in the process, are not its own)."""
    path = model_dirs[family]

    def tiny(cls):
        return type("Tiny", (cls,), {"__init__": lambda self, p, engine="tokenizers":
                                     cls.__init__(self, p, engine=engine, cache_size=size)})

    want = _run(TwinCounter, path, ms)
    assert _run(tiny(CompiledCounter), path, ms) == want
    assert _run(tiny(TwinCounter), path, ms) == want
    for cls in (CompiledCounter, TwinCounter):
        c = tiny(cls)(path)
        for k in range(1, len(ms) + 1):
            try:
                c.count_messages(ms[:k])
            except Exception:
                pass
            caches = {name: getattr(c, name) for name in (
                "_memo", "_by_key", "_looks", "_frame_parts", "_calls", "_texts", "_units",
                "_local_units", "_local", "_pieces", "_long_pieces", "_run_texts")}
            assert {name: len(v) for name, v in caches.items() if len(v) > size} == {}


# -- what the caches keep, and the cyclic garbage collector ----------------------------------------

_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3)),
                     lambda ch: st.lists(ch, max_size=3) | st.lists(ch, max_size=3).map(tuple)
                     | st.dictionaries(st.text(max_size=3), ch, max_size=3), max_leaves=8)


class _Sub(list):
    """A list subclass: not a plain JSON container (settle leaves it, and what holds it, alone)."""


def _containers(o, out):
    if type(o) in (tuple, list, dict) or isinstance(o, _Sub):
        out.append(o)
        for v in (list(o.keys()) + list(o.values()) if isinstance(o, dict) else o):
            _containers(v, out)
    return out


def _plain(o) -> bool:
    """Whether ``o`` is made of exact JSON containers and scalars only (the spec of settle)."""
    if type(o) in (tuple, list):
        return all(_plain(v) for v in o)
    if type(o) is dict:
        return all(_plain(k) and _plain(v) for k, v in o.items())
    return o is None or type(o) in (str, int, float, bool)


@settings(max_examples=300, deadline=None)
@given(obj=_json, sub=st.booleans())
def test_settle_untracks_exactly_the_containers_made_of_json_values(obj, sub):
    """``settle`` returns its argument unchanged (both builds). The compiled build stops the
    collector tracking each exact tuple, list and dict holding only JSON values (so none of
    them can be in a cycle), bottom-up; a container holding anything else (a list subclass
    here) stays tracked, and so does every container holding it (fails if the walk untracked
    a container holding a tracked object: a cycle through it would never be collected)."""
    import copy
    import gc

    if sub:
        obj = [obj, _Sub([1])]
    want = copy.deepcopy(obj)
    gc.disable()  # (a collection meanwhile untracks tuples of its own accord)
    try:
        for build in (twin, compiled):
            o = copy.deepcopy(obj)
            before = [gc.is_tracked(c) for c in _containers(o, [])]
            assert build.settle(o) is o and o == want
            for c, tracked in zip(_containers(o, []), before):
                if build is twin or not tracked:
                    assert gc.is_tracked(c) == tracked
                else:
                    assert gc.is_tracked(c) == (not _plain(c))
    finally:
        gc.enable()


@needs_compiled_base
@pytest.mark.parametrize("family", ["qwen3", "deepseek-v3"])
def test_the_caches_keep_call_messages_untracked_by_the_collector(model_dirs, family):
    """A counted tool-call message's template dict (its calls, their functions, the parsed
    arguments) and every message's frame part stay in the caches as long as they do; the
    compiled build hands them to the cyclic collector no more (such survivors brought on the
    full collections behind many conversations: ~5 tracked objects a turn more than
    ``HFTokenCounter``), the same values as transformers receives."""
    import gc

    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": [1, {"a": "b"}]}'}}]
    ms = [Message(role="system", content="s"), Message(role="user", content="u"),
          Message(role="assistant", content=None, tool_calls=call),
          Message(role="tool", content="r", tool_call_id="c1", name="f")]
    c = CompiledCounter(model_dirs[family])
    c.count_messages(ms)
    e = c._memo[id(ms[2])]
    d = e[2]
    assert d == twin.message_to_template_dict(ms[2])
    assert d["tool_calls"][0]["function"]["arguments"] == {"q": [1, {"a": "b"}]}
    assert [gc.is_tracked(x) for x in _containers(d, [])] == [False] * len(_containers(d, []))
    parts = [c._frame_parts[c._memo[id(m)][3]] for m in ms]
    assert not any(gc.is_tracked(x) for p in parts for x in _containers(p, []))
    t = TwinCounter(model_dirs[family])  # the twin keeps the same values, tracked
    t.count_messages(ms)
    assert t._memo[id(ms[2])][2] == d and gc.is_tracked(t._memo[id(ms[2])][2])
    # a call whose dict holds the caller's own objects (an unvalidated message: its lists are
    # the caller's, shared by the template dict) is left to the collector: it is theirs to
    # change (fails where every call message's dict is settled)
    mine = [1, 2]
    calls = [{"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}, "meta": mine}]
    loose = Message.model_construct(role="assistant", content="", tool_calls=calls, name=None, tool_call_id=None,
                                    extra={}, id="m1", metadata={})
    c.count_messages(ms[:2] + [loose, Message(role="tool", content="r", tool_call_id="c2")])
    assert c._memo[id(loose)][2]["tool_calls"][0]["meta"] is mine and gc.is_tracked(mine)
    assert gc.is_tracked(c._memo[id(loose)])  # (its entry holds that dict: tracked too)


#: the compiled counter's caches of message keys, unit keys and texts (grown by every new
#: message of an eval run: tens of thousands of entries each)
_KEY_CACHES = ("_memo", "_by_key", "_texts", "_units", "_local_units", "_looks", "_frame_parts", "_calls",
               "_pieces", "_long_pieces", "_run_texts")


@needs_compiled_base
@pytest.mark.parametrize("family", ["qwen3", "deepseek-v3", "gpt-oss"])
def test_the_caches_themselves_stay_untracked_by_the_collector(model_dirs, family):
    """The compiled counter's caches hold untracked keys and values only (settled strings,
    tuples, template dicts), and stay untracked themselves after a conversation's turns through
    the budget filter and its counts (trimmed and not): a full collection does not walk their
    entries -- with an eval run's caches that walk, a cache miss an entry, was what a full
    collection cost. Fails where a store tracks a cache again: a template dict into
    ``_by_key`` (CPython tracks a dict that holds a dict), a new unit key or cost tuple into
    ``_units``. A cache holding a caller's own tracked object is tracked (the collector must
    see through it)."""
    import gc

    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": [1, {"a": "b"}]}'}}]
    ms = [Message(role="system", content="s" * 40), Message(role="user", content="u " * 30),
          Message(role="assistant", content=None, tool_calls=call),
          Message(role="tool", content="r " * 50, tool_call_id="c1"),
          Message(role="assistant", content="done " * 20), Message(role="user", content="next " * 10)]
    gc.disable()  # (CPython's own untracking of old dicts and tuples left out)
    try:
        c = CompiledCounter(model_dirs[family])
        for budget in (10_000, c.count_messages(ms) - 30):
            flt = TokenBudgetFilter(budget, counter=c)
            for k in (2, 4, 5, 6):
                c.count_messages(flt.apply(ms[:k]))
        assert len(c._units) and len(c._by_key) > 4
        assert [name for name in _KEY_CACHES if gc.is_tracked(getattr(c, name))] == []
        mine = [1, 2]
        calls = [{"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}, "meta": mine}]
        loose = Message.model_construct(role="assistant", content="", tool_calls=calls, name=None, tool_call_id=None,
                                        extra={}, id="m1", metadata={})
        c.count_messages(ms[:2] + [loose, Message(role="tool", content="r", tool_call_id="c2")])
        assert gc.is_tracked(c._by_key) and any(d["tool_calls"][0].get("meta") is mine
                                                for d in c._by_key.values() if "tool_calls" in d)
    finally:
        gc.enable()


@needs_compiled_base
def test_memo_entries_leave_the_collector_and_still_let_their_messages_go(model_dirs):
    """A memo entry (weak reference, snapshot, template dict, key) of the compiled build is
    untracked, its weak reference too (no callback: it holds nothing strongly). Untracked weak
    references still die with their messages: freed by reference counting, or by the collector
    as part of a cycle (a message whose metadata holds itself), after which the entry no longer
    answers for a new message at the same address."""
    import gc

    c = CompiledCounter(model_dirs["qwen3"])
    m = Message(role="user", content="hello")
    cyc = Message(role="user", content="again", metadata={"me": []})
    cyc.metadata["me"].append(cyc)
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    a = Message(role="assistant", content=None, tool_calls=call)
    c.count_messages([m, a, Message(role="tool", content="r", tool_call_id="c1"), cyc])
    entries = [c._memo[id(x)] for x in (m, a, cyc)]
    assert [gc.is_tracked(e) or gc.is_tracked(e[0]) for e in entries] == [False] * 3
    assert [e[0]() for e in entries] == [m, a, cyc]
    want = c.count_messages([Message(role="user", content="hello")])  # (the last call's list is kept: not theirs)
    del m, a, cyc
    gc.collect()
    assert [e[0]() for e in entries] == [None] * 3
    assert c.count_messages([Message(role="user", content="hello")]) == want


def _signature_by_scan(ms, opening, first_user, last_user, no_user):
    """``tools_signature``'s answer for ``ms`` by one pass over every role (what it computed
    before session 34: ``role_positions`` now reads only the roles the last prompt did not hold)."""
    dicts = [twin.message_to_template_dict(m) for m in ms]
    keys = [twin.message_key(d) for d in dicts]
    n = len(dicts)
    systems = [i for i, d in enumerate(dicts) if d["role"] == "system"]
    users = [i for i, d in enumerate(dicts) if d["role"] == "user"]
    o = next((i for i, d in enumerate(dicts) if d["role"] != "system"), n)
    head = keys[o] if opening and o < n else None
    if not users:
        return (keys[0], tuple(keys[i] for i in systems), head, None, None, None, 0, dicts[-1]["role"]) if no_user else None
    f, j = users[0], users[-1]
    repeats = sum(dicts[u] == dicts[j] for u in users[:-1])
    return (keys[0], tuple(keys[i] for i in systems), head, keys[f] if first_user else None,
            keys[j] if last_user else None, f == j, repeats, dicts[-1]["role"])


#: messages of a prompt whose roles and repeats matter to ``tools_signature``: system messages
#: anywhere, user messages that repeat (equal texts, and one object standing twice)
_plain_pool = st.lists(st.tuples(st.sampled_from(["system", "user", "user", "assistant"]),
                                 st.sampled_from(["go on", "hi", "", "数据"])), min_size=2, max_size=14)


@needs_compiled_base
@settings(max_examples=int(os.environ.get("JIANMU_FAST_MAX_EXAMPLES", "150")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(pool=_plain_pool, data=st.data())
def test_tools_signature_of_successive_prompts_is_a_full_scan(model_dirs, pool, data):
    """Successive prompts over one history -- extended, the cut moved after a pinned first
    message or not, shrunk, a message replaced, one object standing twice -- get the
    signature a full scan of their roles gives, on both builds, whatever the last prompt
    was (``role_positions`` reuses the positions of the messages it shares with it)."""
    ms = [Message(role=r, content=t) for r, t in pool]
    if data.draw(st.booleans()):
        ms.append(ms[data.draw(st.integers(0, len(ms) - 1))])  # (the same object again)
    counters = [cls(model_dirs["mistral"]) for cls in (CompiledCounter, TwinCounter)]
    for _ in range(6):
        lo = data.draw(st.integers(0, len(ms) - 1))
        hi = data.draw(st.integers(lo + 1, len(ms)))
        window = ms[:1] + ms[lo:hi] if data.draw(st.booleans()) and lo > 0 else ms[lo:hi]
        swap = data.draw(st.one_of(st.none(), st.integers(0, 50)))
        if swap is not None:
            window[swap % len(window)] = ms[(swap * 7) % len(ms)]
        flags = data.draw(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()))
        want = _signature_by_scan(window, *flags)
        for c in counters:
            assert c._tools_signature(list(window), *flags) == want


class _RoleReads(dict):
    """A template dict counting how often its role is read."""

    reads = [0]

    def __getitem__(self, k):
        if k == "role":
            _RoleReads.reads[0] += 1
        return super().__getitem__(k)


@pytest.mark.parametrize("build", [compiled, twin], ids=["compiled", "twin"])
def test_role_positions_read_only_the_roles_the_last_prompt_did_not_hold(build):
    """A prompt extending the last one reads its new messages' roles; one whose cut moved after
    its first message reads the messages after the shared ones; a prompt sharing nothing
    reads them all (fails where every call scans the whole prompt)."""

    class Core(build.CounterCore):
        pass

    core = Core()
    core._role_pos = None
    roles = ["system", "user", "assistant", "user", "assistant", "system", "user", "tool", "user"]
    dicts = [_RoleReads(role=r, content=str(i)) for i, r in enumerate(roles)]
    keys = [f"k{i}" for i in range(len(roles))]

    def positions(ks, ds):
        _RoleReads.reads[0] = 0
        got = build.role_positions(core, ks, ds)
        want = ([i for i, d in enumerate(ds) if dict.__getitem__(d, "role") == "system"],
                [i for i, d in enumerate(ds) if dict.__getitem__(d, "role") == "user"])
        assert (list(got[0]), list(got[1])) == want
        return _RoleReads.reads[0]

    assert positions(keys[:6], dicts[:6]) == 6
    assert positions(keys[:8], dicts[:8]) == 2  # extended by two
    assert positions(keys[:8], dicts[:8]) == 0  # the same prompt
    assert positions(keys[:1] + keys[3:9], dicts[:1] + dicts[3:9]) == 1  # cut after the first, one new
    assert positions(keys[4:9], dicts[4:9]) == 0  # its cut moved again, nothing new
    assert positions(keys[2:5], dicts[2:5]) == 3  # not a continuation: every role read
    assert positions([f"x{i}" for i in range(3)], dicts[:3]) == 3  # new keys (by identity)
