"""Exact counts for open models: a hot-loop turn with ``ChatTemplateTokenCounter``.

The seeded tool-calling conversation is replayed model call by model call (a turn appends
what came since the last call: an assistant tool call with its results, or an answer and the
user's next message) over a history of about 40 (or 600) messages. A turn appends them, trims the history to a 8,000-token budget with ``TokenBudgetFilter`` and
counts the prompt that is sent with ``count_messages`` (each round starts from a counter that
has only seen the history before the round, as an agent process would). Peers, same turns:

- ``chat_template``: ``ChatTemplateTokenCounter`` on the bundled Qwen3 template (exact: equals
  transformers' ``apply_chat_template``; checked before timing);
- ``hf``: ``HFTokenCounter`` on the same ``tokenizer.json`` (ChatML-like constants: not the
  model's count);
- ``full_render``: what exact counting costs without segments: the whole template rendered
  over the history and tokenized, once per turn (transformers' Jinja environment, our
  renderer; transformers' own ``apply_chat_template`` is slower still).

``test_ratios`` measures the three interleaved (best of 7 rounds) and prints chat_template/hf (target <= 2) and
full_render/chat_template (target >= 100).
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
from conftest import REPORT, conversation

from jianmu_fast.memory.context import ChatTemplateTokenCounter, HFTokenCounter, TokenBudgetFilter
from jianmu_fast.message import Message

BUDGET = 8_000
TURNS = 10
SIZES = [40, 600]
_DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(_DATA, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return mk.model_dir("qwen3", str(tmp_path_factory.mktemp("qwen3")))


def _units(msgs: list[Message]) -> list[list[Message]]:
    """The conversation cut before each model call: a turn ends on a user or tool message
    (an assistant's answer and the user's next message are one turn)."""
    out: list[list[Message]] = [[]]
    for i, m in enumerate(msgs):
        out[-1].append(m)
        nxt = msgs[i + 1] if i + 1 < len(msgs) else None
        if m.role in ("user", "tool") and (nxt is None or nxt.role != "tool"):
            out.append([])
    return [u for u in out if u]


def _split(size: int) -> tuple[list[Message], list[list[Message]]]:
    units = _units(conversation(2_000))
    n, k = 0, 0
    while n + sum(len(u) for u in units[k:k + TURNS]) < size:
        n += len(units[k])
        k += 1
    return [m for u in units[:k] for m in u], units[k:k + TURNS]


def _round(impl: str, size: int, path: str):
    """``(setup, target)``: setup warms a fresh counter on the history before the round;
    target replays the round's turns and returns the counts of the prompts sent."""
    before, turns = _split(size)

    def setup():
        if impl == "hf":
            counter = HFTokenCounter(os.path.join(path, "tokenizer.json"))
        else:
            counter = ChatTemplateTokenCounter(path)
        flt = TokenBudgetFilter(BUDGET, counter=counter)
        history = list(before)
        counter.count_messages(flt.apply(history))
        return (counter, flt, history), {}

    if impl == "full_render":
        def target(counter, flt, history):
            tok = counter._tok
            out = []
            for unit in turns:
                history.extend(unit)
                out.append(len(tok.encode(counter.render(history), add_special_tokens=False)))
            return out
    else:
        def target(counter, flt, history):
            out = []
            for unit in turns:
                history.extend(unit)
                out.append(counter.count_messages(flt.apply(history)))
            return out
    return setup, target


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("impl", ["chat_template", "hf", "full_render"])
def test_turn(benchmark, model_dir, impl, size):
    benchmark.group = f"chat template hot loop, {size} messages, per {TURNS} turns"
    setup, target = _round(impl, size, model_dir)
    rounds = 3 if impl == "full_render" else 5
    benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1)


def test_counts_are_exact(model_dir):
    """Before trusting the timings: every prompt counted in a round equals a full rendering."""
    for size in SIZES:
        setup, target = _round("chat_template", size, model_dir)
        (counter, flt, history), _ = setup()
        before = len(history)
        counts = target(counter, flt, history)
        probe = ChatTemplateTokenCounter(model_dir)
        hist = history[:before]
        _, turns = _split(size)
        for unit, n in zip(turns, counts):
            hist = hist + unit
            kept = TokenBudgetFilter(BUDGET, counter=probe).apply(hist)
            assert n == probe.count_request(kept) <= BUDGET


def _best(fn_setup, fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        args, _ = fn_setup()
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best / TURNS


def test_ratios(model_dir, capsys):
    lines = []
    for size in SIZES:
        r = {impl: _round(impl, size, model_dir) for impl in ("chat_template", "hf", "full_render")}
        t = {"chat_template": float("inf"), "hf": float("inf"), "full_render": float("inf")}
        for _ in range(7):  # interleaved
            for impl, (setup, target) in r.items():
                t[impl] = min(t[impl], _best(setup, target, 1))
        line = (f"chat template, {size} messages: per turn chat_template {t['chat_template'] * 1e6:.0f} us, "
                f"hf {t['hf'] * 1e6:.0f} us, full_render {t['full_render'] * 1e3:.2f} ms; "
                f"chat_template/hf = {t['chat_template'] / t['hf']:.2f}, "
                f"full_render/chat_template = {t['full_render'] / t['chat_template']:.0f}x")
        lines.append(line)
        REPORT.append(line)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
