"""Batch assembly: 10,000 prompts, each a random prefix of one of 100 seeded tool-calling
conversations (50-400 messages; every prefix ends on a user turn, the point where an agent
asks the model), with a 2,000-token budget and o200k_base.

Peers, same prompts, same run:

- ``jianmu_fast``: ``build_batch(ContextBuilder([StateHistoryProvider(annotate=False)],
  [TokenBudgetFilter(2000, TiktokenTokenCounter("o200k_base"))]), states)``, sanitize step
  included, from a fresh counter each round (every text tokenized cold);
  ``jianmu_fast_workers2``: the same with ``workers=2``;
- ``langchain_loop``: ``trim_messages(strategy="last", include_system=True,
  start_on="human")`` per prompt with a tiktoken ``token_counter`` using our formula. It
  takes about half a minute for 10,000 prompts, so one round times the first
  ``LC_SUBSET`` prompts and the report scales it by ``extra_info["scale"]``;
- ``langchain_memoized``: the same counter memoized per message object (fresh each round);
- ``raw_floor_loop`` / ``raw_floor_batch``: tokenizing every distinct text the counter
  needs (contents, tool names, tool arguments of every message of the input) once, with a
  plain ``encode_ordinary`` loop / ``encode_ordinary_batch``; the floor is the faster.

``test_batch_peak_memory`` runs the jianmu_fast batch once under ``tracemalloc`` and records
its peak beside two sizes of its input as JSON: the 100 conversations the prompts are
prefixes of (the strict figure: what is really held in memory), and a JSONL file of the
10,000 prompts, one conversation prefix a line (what ``jianmu-fast build`` would read).

Before timing, a sample of the batch's prompts is checked against ``builder.build()`` per
state (the very same messages), and LangChain's prompts against ours (within the budget,
no broken tool-call transaction, contained in ours).
"""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest
from lc_peers import MemoCount, TiktokenCount, lc_trim, originals, to_langchain
from traces import check_history, make_conversations

from jianmu_fast.batch import build_batch
from jianmu_fast.memory.context import ContextBuilder, StateHistoryProvider, TiktokenTokenCounter, TokenBudgetFilter
from jianmu_fast.memory.context._encodings import load_tiktoken_encoding
from jianmu_fast.message import Message, coerce_messages

N_PROMPTS = 10_000
BUDGET = 2_000
LC_SUBSET = 500
SEED = 20261130
IMPLS = ["jianmu_fast", "jianmu_fast_workers2", "langchain_loop", "langchain_memoized",
         "raw_floor_loop", "raw_floor_batch"]
ROUNDS = {"langchain_loop": 1, "langchain_memoized": 3, "jianmu_fast_workers2": 3}


class Data:
    def __init__(self) -> None:
        raw = make_conversations(100, 50, 400, seed=SEED)
        self.input_json_bytes = sum(len(json.dumps({"messages": c}, ensure_ascii=False).encode()) + 1 for c in raw)
        self.convs: list[list[Message]] = [coerce_messages(c) for c in raw]
        self.lc = [to_langchain(c) for c in self.convs]
        self.by_id = {m.id: m for c in self.convs for m in c}
        rng = random.Random(SEED)
        cuts = [[i + 1 for i, m in enumerate(c) if m.role == "user"] for c in self.convs]
        self.picks = []
        for _ in range(N_PROMPTS):
            k = rng.randrange(len(self.convs))
            self.picks.append((k, rng.choice(cuts[k])))
        self.states = [{"messages": self.convs[k][:cut]} for k, cut in self.picks]
        self.lc_states = [self.lc[k][:cut] for k, cut in self.picks]
        # what a JSONL file of the 10,000 prompts (one conversation prefix a line) would hold
        sizes = [[len(json.dumps(m, ensure_ascii=False).encode()) + 2 for m in c] for c in raw]
        self.prompts_jsonl_bytes = sum(sum(sizes[k][:cut]) + 16 for k, cut in self.picks)
        texts: dict[str, None] = {}
        for c in self.convs:
            for m in c:
                if isinstance(m.content, str):
                    texts[m.content] = None
                for call in m.tool_calls or ():
                    texts[call["function"]["name"]] = None
                    texts[call["function"].get("arguments") or ""] = None
        self.texts = list(texts)


_DATA: list[Data] = []


@pytest.fixture(scope="module")
def data() -> Data:
    if not _DATA:
        _DATA.append(Data())
    return _DATA[0]


def builder() -> ContextBuilder:
    counter = TiktokenTokenCounter("o200k_base")
    return ContextBuilder([StateHistoryProvider(annotate=False)], [TokenBudgetFilter(BUDGET, counter=counter)])


def make(impl: str, d: Data):
    """``(setup, target)`` for ``benchmark.pedantic``."""
    if impl.startswith("jianmu_fast"):
        workers = 2 if impl == "jianmu_fast_workers2" else 1
        return (lambda: ((builder(),), {})), (lambda b: build_batch(b, d.states, workers=workers))
    if impl.startswith("langchain"):
        memo = impl == "langchain_memoized"
        states = d.lc_states if memo else d.lc_states[:LC_SUBSET]
        return (lambda: ((MemoCount() if memo else TiktokenCount(),), {})), (
            lambda counter: [lc_trim(s, BUDGET, counter) for s in states])
    enc = load_tiktoken_encoding("o200k_base")
    if impl == "raw_floor_batch":
        return (lambda: ((), {})), (lambda: enc.encode_ordinary_batch(d.texts))
    encode = enc.encode_ordinary
    return (lambda: ((), {})), (lambda: [encode(t) for t in d.texts])


def check(impl: str, d: Data, out, report) -> dict:
    info: dict = {"prompts": N_PROMPTS, "distinct_texts": len(d.texts), "input_json_bytes": d.input_json_bytes}
    if impl.startswith("raw_floor"):
        assert len(out) == len(d.texts)
        return info
    b = builder()
    sample = range(0, N_PROMPTS, 97)
    if impl.startswith("jianmu_fast"):
        assert len(out) == N_PROMPTS
        for i in sample:
            want = b.build(d.states[i])
            if impl == "jianmu_fast":
                assert [id(m) for m in out[i]] == [id(m) for m in want]
            assert out[i] == want
        info["kept_messages_mean"] = sum(map(len, out)) / N_PROMPTS
    else:
        counter = TiktokenCount()
        for i in (j for j in sample if j < len(out)):
            ours = b.build(d.states[i])
            theirs = originals(out[i], d.by_id)
            check_history(theirs)
            assert counter(out[i]) <= BUDGET
            assert {m.id for m in theirs} <= {m.id for m in ours}
        info["scale"] = N_PROMPTS / len(out)
        info["kept_messages_mean"] = sum(map(len, out)) / len(out)
    report.append(f"batch-10k   {impl:<22} valid on {len(sample)} sampled prompts; "
                  f"mean prompt {info['kept_messages_mean']:.1f} messages"
                  + (f"; timed on {len(out)} prompts, scaled x{info['scale']:.0f}" if info.get("scale", 1) != 1 else ""))
    return info


@pytest.mark.benchmark(group="batch-10k-prompts-2k-budget")
@pytest.mark.parametrize("impl", IMPLS)
def test_batch(benchmark, report, impl, data):
    setup, target = make(impl, data)
    args, _ = setup()
    benchmark.extra_info.update(check(impl, data, target(*args), report))
    benchmark.pedantic(target, setup=setup, rounds=ROUNDS.get(impl, 5), iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="batch-10k-prompts-memory")
def test_batch_peak_memory(benchmark, report, data):
    """Peak traced allocation of one cold 10,000-prompt batch (the input already loaded)."""
    b = builder()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = build_batch(b, data.states)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(out) == N_PROMPTS
    ratio = peak / data.input_json_bytes
    benchmark.extra_info.update(peak_bytes=peak, input_json_bytes=data.input_json_bytes, ratio=ratio,
                                prompts_jsonl_bytes=data.prompts_jsonl_bytes,
                                ratio_prompts_jsonl=peak / data.prompts_jsonl_bytes)
    report.append(f"batch-10k   peak memory {peak / 1e6:.1f} MB = {ratio:.2f}x the JSON of the 100 conversations "
                  f"({data.input_json_bytes / 1e6:.1f} MB), {peak / data.prompts_jsonl_bytes:.3f}x the JSONL of "
                  f"the 10,000 prompts ({data.prompts_jsonl_bytes / 1e6:.0f} MB)")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
