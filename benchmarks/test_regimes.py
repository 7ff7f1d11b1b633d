"""Issue 13: the targets table, on traces shaped like real ones, ratios of one run.

Two regimes (``traces.py``): ``cs``, customer-service eval traffic (a fixed ~1,250-token
policy system prompt, short conversations, JSON tool results, the same ``tool_call_id``
reused in a conversation) and ``coding``, a coding agent (a short system prompt, ~150
messages and ~30k tokens per conversation, tool outputs up to several thousand tokens: the
long histories that are trimmed hard). All counting is o200k_base with
``TiktokenTokenCounter`` (``engine="tiktoken"``, the reference, unless the impl's name ends in
``_fastokens``), compiled core, public API only.

**Hot loop** (groups ``hot-<regime>-<size>``): a history of ``size`` messages (conversations
of the regime stitched together) grows by ``TURNS`` units (a user message, an assistant
answer, or an assistant tool call with its result) and the prompt is rebuilt after each, with
an 8,000-token budget; the turns are the same units for every ``size``. Every round starts from fresh caches that saw the history before the
round (an agent process that ran before). Each turn is timed on its own; ``extra_info`` holds
the per-turn times (best of the rounds for each turn) and the report takes their median.

- ``preset``: ``ContextBuilder.for_react(system_prompt, max_tokens=8000, token_counter=
  TiktokenTokenCounter("o200k_base")).build(state)``, the state holding Messages;
- ``preset_tools``: the same with ``tools_schema=`` 14 tool schemas (~2k tokens), a new list
  of new dicts every turn; ``preset_fastokens``: the fastokens engine (built before timing);
- ``filter``: ``TokenBudgetFilter(8000, counter).apply(history)`` alone;
- ``floor``: tokenizing exactly the turn's new texts (contents, tool names and arguments)
  with tiktoken's ``encode_ordinary`` (the Rust core called directly, the fastest raw way for
  1-2 texts); ``floor_fastokens``: the same with fastokens;
- ``langchain_memo``: ``trim_messages(strategy="last", include_system=True,
  start_on="human")`` with our formula's tiktoken counter memoized per message object;
  ``langchain``: the same counter without memo (fewer turns: ~50 ms a turn).

Group ``repeat-<regime>-600``: ``build(state)`` again on an unchanged history.

**Batch** (groups ``batch-<regime>``): ``N`` prompts, each a prefix of one of the regime's
conversations ending where an agent calls the model (after a user message or a tool
result), 5,000-token budget (16,000 for coding, whose newest tool round alone can take ~9k),
cold counter each round:

- ``transform_batch``: ``transform_batch(ContextBuilder(filters=[TokenBudgetFilter(5000,
  counter)]), prefixes)`` (system prompt in each list); ``build_batch``:
  ``build_batch(for_react(...), states)``; ``*_fastokens``: the same, fastokens engine;
- ``floor``: each distinct text of the input tokenized once, the faster of an
  ``encode_ordinary`` loop and ``encode_ordinary_batch``; ``floor_fastokens``: fastokens'
  ``encode_batch_flat``;
- ``langchain_memo`` (memo shared by the whole batch) and ``langchain`` (timed on the first
  ``LC_SUBSET`` prompts, scaled by ``extra_info["scale"]``).

``test_batch_memory`` records the traced peak of one cold ``transform_batch`` of the cs batch
against the JSON of its input conversations (fastokens' own buffers are not traced).

Before timing, outputs are checked: jianmu_fast's batch equals per-prompt ``build()`` /
``transform()`` on a sample, the hot loop's last prompt is within budget with whole tool-call
transactions, and LangChain's prompts are within budget by our counter.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import time
import tracemalloc
from typing import Any, Callable

import pytest
from lc_peers import MemoCount, TiktokenCount, lc_trim, to_langchain
from traces import (
    CODING_SYSTEM_PROMPT,
    CS_SYSTEM_PROMPT,
    check_history,
    make_coding_conversation,
    make_cs_conversations,
    stitch,
)

from jianmu_fast.batch import build_batch, transform_batch
from jianmu_fast.memory.context import ContextBuilder, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context._encodings import load_fastokens, load_tiktoken_encoding
from jianmu_fast.message import Message, coerce_messages

ENC = "o200k_base"
HOT_BUDGET = 8_000
BATCH_BUDGET = {"cs": 5_000, "coding": 16_000}  # coding: a newest tool round can take ~9k
TURNS = 40
SEED = 20261201
SYSTEM = {"cs": CS_SYSTEM_PROMPT, "coding": CODING_SYSTEM_PROMPT}
BATCH_SIZE = {"cs": (10_000, 200), "coding": (1_000, 20)}  # prompts, conversations
LC_SUBSET = {"cs": 500, "coding": 20}
HOT_IMPLS = ["preset", "preset_tools", "preset_fastokens", "filter", "floor", "floor_fastokens",
             "langchain_memo", "langchain"]
HOT_ROUNDS = {"langchain": 1}
HOT_TURNS = {"langchain": 8}
BATCH_IMPLS = ["transform_batch", "build_batch", "transform_batch_fastokens", "build_batch_fastokens",
               "floor", "floor_fastokens", "langchain_memo", "langchain"]
BATCH_ROUNDS = {"langchain": 1, "langchain_memo": 2}


# -- data -------------------------------------------------------------------------------------

_CACHE: dict[Any, Any] = {}


def _cached(key: Any, make: Callable[[], Any]) -> Any:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def conversations(regime: str, count: int) -> list[list[dict[str, Any]]]:
    if regime == "cs":
        return _cached(("cs", count), lambda: make_cs_conversations(count, SEED))
    return _cached(("coding", count), lambda: [make_coding_conversation(SEED + i) for i in range(count)])


def history(regime: str) -> list[Message]:
    """~900 messages of the regime stitched into one history (system prompt first)."""
    def make() -> list[Message]:
        convs = make_cs_conversations(60, SEED + 1) if regime == "cs" else \
            [make_coding_conversation(SEED + 100 + i) for i in range(7)]
        return coerce_messages(stitch(convs, 900))
    return _cached(("history", regime), make)


def units(msgs: list[Message]) -> list[list[Message]]:
    out: list[list[Message]] = []
    for m in msgs:
        if m.role == "tool" and out:
            out[-1].append(m)
        else:
            out.append([m])
    return out


def split(regime: str, size: int, turns: int) -> tuple[list[Message], list[list[Message]]]:
    """The history before the round (``size`` messages, or one unit more) and its turns:
    the same ``turns`` units (from other conversations of the regime) for every ``size``,
    so that turns at 100 and at 600 messages tokenize the very same new texts."""
    us = units(history(regime))
    n, k = 0, 0
    while n < size:
        n += len(us[k])
        k += 1

    def make_turns() -> list[list[Message]]:
        convs = make_cs_conversations(20, SEED + 2) if regime == "cs" else \
            [make_coding_conversation(SEED + 200 + i) for i in range(2)]
        return units(coerce_messages(stitch(convs, 250))[1:])
    return [m for u in us[:k] for m in u], _cached(("turns", regime), make_turns)[:turns]


def texts_of(m: Message) -> list[str]:
    out = [m.content] if isinstance(m.content, str) else []
    for call in m.tool_calls or ():
        out.append(call["function"]["name"])
        if call["function"].get("arguments"):
            out.append(call["function"]["arguments"])
    return out


def tool_schemas() -> list[dict[str, Any]]:
    """14 function schemas of a retail agent, ~2k o200k tokens (as a request's ``tools``)."""
    rng = random.Random(7)
    names = ["find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details", "get_order_details",
             "get_product_details", "list_all_product_types", "cancel_pending_order",
             "modify_pending_order_items", "modify_pending_order_address", "modify_pending_order_payment",
             "return_delivered_order_items", "exchange_delivered_order_items", "modify_user_address",
             "transfer_to_human_agents"]
    words = ("the order user item payment method id refund gift card balance original list must be "
             "pending delivered exchange return address zip code first last name email product "
             "option new old should confirm before action only each").split()

    def desc(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."

    out = []
    for name in names:
        props = {}
        for _ in range(rng.randint(2, 5)):
            p = "_".join(rng.choice(words) for _ in range(2))
            if rng.random() < 0.3:
                props[p] = {"type": "array", "items": {"type": "string"}, "description": desc(rng.randint(12, 24))}
            else:
                props[p] = {"type": "string", "description": desc(rng.randint(12, 28))}
        out.append({"type": "function", "function": {
            "name": name, "description": desc(rng.randint(30, 60)),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:2]}}})
    return out


def counter(engine: str = "tiktoken") -> TiktokenTokenCounter:
    return TiktokenTokenCounter(ENC, engine=engine)


def preset(regime: str, budget: int, engine: str = "tiktoken") -> ContextBuilder:
    return ContextBuilder.for_react(system_prompt=SYSTEM[regime], max_tokens=budget, token_counter=counter(engine))


# -- hot loop ---------------------------------------------------------------------------------


class Turns:
    """Per-turn times of every round; ``best()`` is the best round of each turn."""

    def __init__(self) -> None:
        self.rounds: list[list[float]] = []

    def best(self) -> list[float]:
        return [min(ts) for ts in zip(*self.rounds)]


def hot_round(impl: str, regime: str, size: int, rec: Turns):
    """``(setup, target)`` for ``benchmark.pedantic``; target records per-turn times in ``rec``."""
    turns_n = HOT_TURNS.get(impl, TURNS)
    before, turns = split(regime, size, turns_n)
    clock = time.perf_counter
    if impl.startswith("floor"):
        if impl == "floor_fastokens":
            fast = load_fastokens(ENC)
            enc_one = lambda t: fast.encode_ordinary(t)  # noqa: E731
        else:
            enc_one = load_tiktoken_encoding(ENC)._core_bpe.encode_ordinary
        new_texts = [[t for m in u for t in texts_of(m)] for u in turns]

        def floor_target():
            times = []
            for ts in new_texts:
                t0 = clock()
                for t in ts:
                    enc_one(t)
                times.append(clock() - t0)
            rec.rounds.append(times)
            return len(times)

        return (lambda: ((), {})), floor_target
    if impl.startswith("langchain"):
        lc_before = to_langchain(before)
        lc_turns = [to_langchain(u) for u in turns]

        def lc_setup():
            cnt = MemoCount(ENC) if impl == "langchain_memo" else TiktokenCount(ENC)
            hist = list(lc_before)
            lc_trim(hist, HOT_BUDGET, cnt)
            return (hist, cnt), {}

        def lc_target(hist, cnt):
            times = []
            for u in lc_turns:
                t0 = clock()
                hist.extend(u)
                out = lc_trim(hist, HOT_BUDGET, cnt)
                times.append(clock() - t0)
            rec.rounds.append(times)
            return out

        return lc_setup, lc_target
    if impl == "filter":
        def f_setup():
            flt = TokenBudgetFilter(HOT_BUDGET, counter=counter())
            hist = list(before)
            flt.apply(hist)
            return (flt, hist), {}

        def f_target(flt, hist):
            times = []
            for u in turns:
                t0 = clock()
                hist.extend(u)
                out = flt.apply(hist)
                times.append(clock() - t0)
            rec.rounds.append(times)
            return out

        return f_setup, f_target
    engine = "fastokens" if impl.endswith("_fastokens") else "tiktoken"
    with_tools = impl == "preset_tools"
    schemas = tool_schemas()
    body = [m for m in before if m.role != "system"]  # the preset adds the system prompt

    def p_setup():
        b = preset(regime, HOT_BUDGET, engine)
        state = {"messages": list(body)}
        tools = [copy.deepcopy(schemas) for _ in turns] if with_tools else [None] * len(turns)
        b.build(state, tools_schema=copy.deepcopy(schemas) if with_tools else None)
        return (b, state, tools), {}

    def p_target(b, state, tools):
        times = []
        hist = state["messages"]
        for u, ts in zip(turns, tools):
            t0 = clock()
            hist.extend(u)
            out = b.build(state, tools_schema=ts)
            times.append(clock() - t0)
        rec.rounds.append(times)
        return out

    return p_setup, p_target


def check_prompt(out: list[Message], budget: int) -> int:
    """The prompt's tokens, after checking it: system prompt first, whole tool-call
    transactions, within ``budget``."""
    assert out and out[0].role == "system"
    check_history(out)
    tokens = counter().count_messages(out)
    assert tokens <= budget, (tokens, budget)
    return tokens


def run_hot(benchmark, report, impl: str, regime: str, size: int) -> None:
    if impl.endswith("_fastokens"):
        load_fastokens(ENC)  # startup (~1.5 s) outside the timed rounds; see test_fastokens_startup
    rec = Turns()
    setup, target = hot_round(impl, regime, size, rec)
    args, _ = setup()
    out = target(*args)
    rec.rounds.clear()
    info: dict[str, Any] = {"history": size}
    if impl.startswith(("preset", "filter")):
        tokens = check_prompt(out, HOT_BUDGET)
        info.update(kept=len(out), tokens=tokens)
        if impl == "preset_tools":  # whether the budget holds the tools too (the filter's business)
            info["tokens_with_tools"] = tokens + counter().count_tools(tool_schemas())
    elif impl.startswith("langchain"):
        tokens = TiktokenCount(ENC)(out)
        assert tokens <= HOT_BUDGET
        info.update(kept=len(out), tokens=tokens)
    benchmark.pedantic(target, setup=setup, rounds=HOT_ROUNDS.get(impl, 7), iterations=1, warmup_rounds=0)
    best = rec.best()
    info.update(turn_times=best, turn_median=statistics.median(best), turn_mean=sum(best) / len(best))
    benchmark.extra_info.update(info)
    report.append(f"hot-{regime}-{size:<4} {impl:<18} median turn {info['turn_median'] * 1e6:8.1f} us, "
                  f"mean {info['turn_mean'] * 1e6:8.1f} us over {len(best)} turns"
                  + (f"; prompt {info['kept']} msgs, {info['tokens']} tokens" if "kept" in info else "")
                  + (f" ({info['tokens_with_tools']} with the tools)" if "tokens_with_tools" in info else ""))


@pytest.mark.parametrize("impl", HOT_IMPLS)
@pytest.mark.parametrize("size", [100, 600])
@pytest.mark.parametrize("regime", ["cs", "coding"])
def test_hot(benchmark, report, regime, size, impl):
    if size == 100 and impl not in ("preset", "floor", "filter"):
        pytest.skip("the 100-message turn is only the denominator of the 600/100 ratio")
    benchmark.group = f"hot-{regime}-{size}"
    run_hot(benchmark, report, impl, regime, size)


@pytest.mark.parametrize("impl", ["preset", "filter"])
@pytest.mark.parametrize("regime", ["cs", "coding"])
def test_repeat(benchmark, report, regime, impl):
    """The same history again: the agent rebuilds without a new message."""
    benchmark.group = f"repeat-{regime}-600"
    before, turns = split(regime, 600, TURNS)
    hist = [m for u in turns for m in u]
    if impl == "preset":
        b = preset(regime, HOT_BUDGET)
        state = {"messages": [m for m in before if m.role != "system"] + hist}
        first = b.build(state)
        call = lambda: b.build(state)  # noqa: E731
    else:
        flt = TokenBudgetFilter(HOT_BUDGET, counter=counter())
        msgs = before + hist
        first = flt.apply(msgs)
        call = lambda: flt.apply(msgs)  # noqa: E731
    assert call() == first
    benchmark.pedantic(call, rounds=2_000, iterations=1, warmup_rounds=20)
    report.append(f"repeat-{regime}-600 {impl:<8} {benchmark.stats.stats.median * 1e6:.1f} us")


# -- batch ------------------------------------------------------------------------------------


class Batch:
    def __init__(self, regime: str) -> None:
        n_prompts, n_convs = BATCH_SIZE[regime]
        raw = conversations(regime, n_convs)
        self.regime = regime
        self.input_json_bytes = sum(len(json.dumps({"messages": c}, ensure_ascii=False).encode()) + 1 for c in raw)
        self.convs = [coerce_messages(c) for c in raw]
        self.lc = [to_langchain(c) for c in self.convs]
        rng = random.Random(SEED)
        cuts = [[i + 1 for i, m in enumerate(c)  # after a user message or a complete tool round
                 if m.role == "user" or (m.role == "tool" and (i + 1 == len(c) or c[i + 1].role != "tool"))]
                for c in self.convs]
        picks = []
        for _ in range(n_prompts):
            k = rng.randrange(len(self.convs))
            picks.append((k, rng.choice(cuts[k])))
        self.lists = [self.convs[k][:cut] for k, cut in picks]
        self.states = [{"messages": self.convs[k][1:cut]} for k, cut in picks]
        self.lc_lists = [self.lc[k][:cut] for k, cut in picks]
        texts: dict[str, None] = {}
        for c in self.convs:
            for m in c:
                for t in texts_of(m):
                    texts[t] = None
        self.texts = list(texts)
        self.n = n_prompts


def batch_data(regime: str) -> Batch:
    return _cached(("batch", regime), lambda: Batch(regime))


def filter_builder(regime: str, engine: str = "tiktoken") -> ContextBuilder:
    return ContextBuilder(filters=[TokenBudgetFilter(BATCH_BUDGET[regime], counter=counter(engine))])


def batch_call(impl: str, d: Batch):
    """``(setup, target)``: every round starts cold (a fresh counter)."""
    engine = "fastokens" if impl.endswith("_fastokens") else "tiktoken"
    if impl.startswith("transform_batch"):
        return (lambda: ((filter_builder(d.regime, engine),), {})), (lambda b: transform_batch(b, d.lists))
    if impl.startswith("build_batch"):
        return (lambda: ((preset(d.regime, BATCH_BUDGET[d.regime], engine),), {})), (lambda b: build_batch(b, d.states))
    if impl == "floor":
        enc = load_tiktoken_encoding(ENC)
        core = enc._core_bpe.encode_ordinary

        def floor():
            t0 = time.perf_counter()
            for t in d.texts:
                core(t)
            t1 = time.perf_counter()
            enc.encode_ordinary_batch(d.texts)
            t2 = time.perf_counter()
            floor.best = min(getattr(floor, "best", 1e9), t1 - t0, t2 - t1)  # type: ignore[attr-defined]
            floor.loop = min(getattr(floor, "loop", 1e9), t1 - t0)  # type: ignore[attr-defined]
            floor.batch = min(getattr(floor, "batch", 1e9), t2 - t1)  # type: ignore[attr-defined]

        return (lambda: ((), {})), floor
    if impl == "floor_fastokens":
        fast = load_fastokens(ENC)
        return (lambda: ((), {})), (lambda: fast.encode_batch_flat(d.texts))
    memo = impl == "langchain_memo"
    lists = d.lc_lists if memo else d.lc_lists[:LC_SUBSET[d.regime]]
    return (lambda: ((MemoCount(ENC) if memo else TiktokenCount(ENC),), {})), (
        lambda cnt: [lc_trim(x, BATCH_BUDGET[d.regime], cnt) for x in lists])


def check_batch(impl: str, d: Batch, out: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"prompts": d.n, "distinct_texts": len(d.texts), "input_json_bytes": d.input_json_bytes}
    if impl.startswith("floor"):
        return info
    sample = range(0, d.n, max(1, d.n // 97))
    if impl.startswith(("transform_batch", "build_batch")):
        assert len(out) == d.n
        b = filter_builder(d.regime) if impl.startswith("transform") else preset(d.regime, BATCH_BUDGET[d.regime])
        for i in sample:
            want = b.transform(d.lists[i]) if impl.startswith("transform") else b.build(d.states[i])
            assert [m.to_openai() for m in out[i]] == [m.to_openai() for m in want], i  # ids differ per builder
            check_prompt(out[i], BATCH_BUDGET[d.regime])
        info["kept_messages_mean"] = sum(map(len, out)) / len(out)
        return info
    cnt = TiktokenCount(ENC)
    for i in (j for j in sample if j < len(out)):
        assert cnt(out[i]) <= BATCH_BUDGET[d.regime]
    info["scale"] = d.n / len(out)
    info["kept_messages_mean"] = sum(map(len, out)) / len(out)
    return info


@pytest.mark.parametrize("impl", BATCH_IMPLS)
@pytest.mark.parametrize("regime", ["cs", "coding"])
def test_batch(benchmark, report, regime, impl):
    benchmark.group = f"batch-{regime}"
    if impl.endswith("_fastokens"):
        load_fastokens(ENC)
    d = batch_data(regime)
    setup, target = batch_call(impl, d)
    args, _ = setup()
    info = check_batch(impl, d, target(*args))
    benchmark.pedantic(target, setup=setup, rounds=BATCH_ROUNDS.get(impl, 3), iterations=1, warmup_rounds=0)
    if impl == "floor":
        info.update(best_s=target.best, loop_s=target.loop, batch_s=target.batch)
    benchmark.extra_info.update(info)
    secs = target.best if impl == "floor" else benchmark.stats.stats.median * info.get("scale", 1)
    report.append(f"batch-{regime} {impl:<26} {secs:8.3f} s for {d.n} prompts"
                  + (f" (timed on {LC_SUBSET[regime]}, scaled)" if "scale" in info and info["scale"] != 1 else "")
                  + (f"; mean prompt {info['kept_messages_mean']:.1f} msgs" if "kept_messages_mean" in info else ""))


def test_batch_memory(benchmark, report):
    """Peak traced allocation of one cold cs ``transform_batch`` vs the JSON of its input."""
    d = batch_data("cs")
    b = filter_builder("cs")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = transform_batch(b, d.lists)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(out) == d.n
    ratio = peak / d.input_json_bytes
    benchmark.group = "batch-cs-memory"
    benchmark.extra_info.update(peak_bytes=peak, input_json_bytes=d.input_json_bytes, ratio=ratio)
    report.append(f"batch-cs memory: peak {peak / 1e6:.1f} MB = {ratio:.2f}x the JSON of the "
                  f"{len(d.convs)} input conversations ({d.input_json_bytes / 1e6:.1f} MB)")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


def test_fastokens_startup(benchmark, report):
    """What ``engine="fastokens"`` costs once per process (a fresh interpreter, measured)."""
    import subprocess
    import sys

    code = ("import time; t=time.perf_counter(); "
            "from jianmu_fast.memory.context import TiktokenTokenCounter as T; "
            "c=T('o200k_base', engine='tiktoken'); c.count_text('warm'); t1=time.perf_counter(); "
            "from jianmu_fast.memory.context._encodings import load_fastokens; load_fastokens('o200k_base'); "
            "t2=time.perf_counter(); print(t1-t, t2-t1)")
    for _ in range(3):  # a fresh interpreter: retried if another job rebuilds the extension meanwhile
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if res.returncode == 0:
            break
    assert res.returncode == 0, res.stderr[-2000:]
    tiktoken_s, fast_s = map(float, res.stdout.split())
    benchmark.group = "fastokens-startup"
    benchmark.extra_info.update(tiktoken_load_s=tiktoken_s, fastokens_build_s=fast_s)
    report.append(f"startup: tiktoken counter {tiktoken_s:.2f} s; fastokens engine +{fast_s:.2f} s")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
