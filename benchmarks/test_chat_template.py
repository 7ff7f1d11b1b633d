"""Exact counts for open models: a hot-loop turn with ``ChatTemplateTokenCounter``.

The seeded tool-calling conversation is replayed model call by model call (a turn appends
what came since the last call: an assistant tool call with its results, or an answer and the
user's next message) over a history of about 40 (or 600) messages. A turn appends them, trims the history to a 8,000-token budget with ``TokenBudgetFilter`` and
counts the prompt that is sent with ``count_messages`` (each round starts from a counter that
has only seen the history before the round, as an agent process would). Peers, same turns:

- ``chat_template``: ``ChatTemplateTokenCounter`` on each bundled template (exact: equals
  transformers' ``apply_chat_template``; checked before timing);
- ``hf``: ``HFTokenCounter`` on the same ``tokenizer.json`` (ChatML-like constants: not the
  model's count);
- ``full_render``: what exact counting costs without segments: the whole template rendered
  over the history and tokenized, once per turn (transformers' Jinja environment, our
  renderer; transformers' own ``apply_chat_template`` on the same history measured 2.65 ms
  against this 2.55 ms at 19 messages, 196 against 174 ms at 581: the same work, slightly
  slower).

Every family gets the same seeded conversation, as its template accepts it: Hermes requires a
``name`` on tool results (given the called function's), Llama 3.1 refuses parallel calls (each
is sent as its own call and result). DeepSeek-V3's template fails the additivity self-check, so
its counts are full renderings (the fallback; its ratio shows what that costs).

``test_ratios`` measures the three interleaved (each turn's best of 15 rounds, 3 for full
rendering, averaged over the round's turns) and prints chat_template/hf (target <= 2) and
full_render/chat_template (target >= 100). A turn of either counter must tokenize the turn's
new text (about a twentieth of a 40-message history), which bounds full_render/hf, and so any
exact counter's ratio, to roughly 15-25x at 40 messages.
"""

from __future__ import annotations

import gc
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
FAMILIES = ["qwen3", "hermes", "llama3.1", "mistral", "gpt-oss", "deepseek-v3"]
_DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat_templates")
_spec = importlib.util.spec_from_file_location("_ct_data", os.path.join(_DATA, "make_tokenizer.py"))
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {f: mk.model_dir(f, str(tmp_path_factory.mktemp(f))) for f in FAMILIES}


def _as_family_accepts(msgs: list[Message], family: str) -> list[Message]:
    """The conversation as ``family``'s template accepts it (see the module docstring)."""
    out: list[Message] = []
    names: dict[str, str] = {}
    pending: list[dict] = []  # Llama 3.1: the parallel calls still to send, one per result
    for m in msgs:
        for call in m.tool_calls or ():
            names[call["id"]] = call["function"]["name"]
        if m.role == "tool" and family == "hermes":
            out.append(m.model_copy(update={"name": names.get(m.tool_call_id or "", "tool")}))
        elif m.tool_calls and len(m.tool_calls) > 1 and family == "llama3.1":
            out.append(m.model_copy(update={"tool_calls": m.tool_calls[:1]}))
            pending = list(m.tool_calls[1:])
        else:
            out.append(m)
        if m.role == "tool" and pending:
            out.append(Message(role="assistant", content=None, tool_calls=[pending.pop(0)]))
    return out


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


def _split(size: int, family: str = "qwen3") -> tuple[list[Message], list[list[Message]]]:
    units = _units(_as_family_accepts(conversation(2_000), family))
    n, k = 0, 0
    while n + sum(len(u) for u in units[k:k + TURNS]) < size:
        n += len(units[k])
        k += 1
    return [m for u in units[:k] for m in u], units[k:k + TURNS]


def _round(impl: str, size: int, path: str, family: str = "qwen3"):
    """``(setup, target)``: setup warms a fresh counter on the history before the round;
    target replays the round's turns and returns the counts of the prompts sent."""
    before, turns = _split(size, family)

    def setup():
        if impl == "hf":
            counter = HFTokenCounter(os.path.join(path, "tokenizer.json"))
        else:
            counter = ChatTemplateTokenCounter(path)
        flt = TokenBudgetFilter(BUDGET, counter=counter)
        history = list(before)
        counter.count_messages(flt.apply(history))
        gc.collect()  # the garbage of building the counter is not the first turn's to collect
        return (counter, flt, history), {}

    clock = time.perf_counter
    if impl == "full_render":
        def target(counter, flt, history, timed=False):
            tok = counter._tok
            out = []
            for unit in turns:
                t = clock()
                history.extend(unit)
                n = len(tok.encode(counter.render(history), add_special_tokens=False))
                out.append(clock() - t if timed else n)
            return out
    else:
        def target(counter, flt, history, timed=False):
            out = []
            for unit in turns:
                t = clock()
                history.extend(unit)
                n = counter.count_messages(flt.apply(history))
                out.append(clock() - t if timed else n)
            return out
    return setup, target


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("impl", ["chat_template", "hf", "full_render"])
def test_turn(benchmark, model_dirs, impl, size, family):
    benchmark.group = f"chat template hot loop ({family}), {size} messages, per {TURNS} turns"
    setup, target = _round(impl, size, model_dirs[family], family)
    rounds = 3 if impl == "full_render" else 5
    benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_are_exact(model_dirs, family):
    """Before trusting the timings: every prompt counted in a round equals a full rendering."""
    model_dir = model_dirs[family]
    for size in SIZES:
        setup, target = _round("chat_template", size, model_dir, family)
        (counter, flt, history), _ = setup()
        before = len(history)
        counts = target(counter, flt, history)
        probe = ChatTemplateTokenCounter(model_dir)
        hist = history[:before]
        _, turns = _split(size, family)
        for unit, n in zip(turns, counts):
            hist = hist + unit
            kept = TokenBudgetFilter(BUDGET, counter=probe).apply(hist)
            assert n == probe.count_request(kept) <= BUDGET


def _turn_mins(setup_target, rounds: int) -> list[float]:
    """Seconds of each turn of the round, each the least over ``rounds`` fresh replays (a
    shared machine preempts whole turns; the per-turn minimum sheds that)."""
    setup, target = setup_target
    mins: list[float] = []
    for _ in range(rounds):
        (counter, flt, history), _ = setup()
        times = target(counter, flt, history, timed=True)
        mins = times if not mins else [min(a, b) for a, b in zip(mins, times)]
    return mins


@pytest.mark.parametrize("family", FAMILIES)
def test_ratios(model_dirs, family, capsys):
    lines = []
    for size in SIZES:
        r = {impl: _round(impl, size, model_dirs[family], family) for impl in ("chat_template", "hf", "full_render")}
        mins: dict[str, list[float]] = {}
        for k in range(15):  # interleaved; full rendering (seconds a round at 600) in 3 of them
            for impl, st in r.items():
                if impl != "full_render" or k % 5 == 0:
                    got = _turn_mins(st, 1)
                    mins[impl] = got if impl not in mins else [min(a, b) for a, b in zip(mins[impl], got)]
        t = {impl: sum(v) / len(v) for impl, v in mins.items()}
        line = (f"chat template ({family}), {size} messages: per turn chat_template {t['chat_template'] * 1e6:.0f} us, "
                f"hf {t['hf'] * 1e6:.0f} us, full_render {t['full_render'] * 1e3:.2f} ms; "
                f"chat_template/hf = {t['chat_template'] / t['hf']:.2f}, "
                f"full_render/chat_template = {t['full_render'] / t['chat_template']:.0f}x")
        lines.append(line)
        REPORT.append(line)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
