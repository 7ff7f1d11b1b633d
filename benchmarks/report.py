"""Turn pytest-benchmark's ``--benchmark-json`` output into the markdown table of ratios.

Usage (``make bench`` does this, one JSON file per benchmark module so that a module that
fails or crashes costs only its own rows)::

    .venv/bin/python -m pytest benchmarks/test_regimes.py --benchmark-disable-gc --benchmark-json=out/bench/regimes.json
    .venv/bin/python benchmarks/report.py out/bench/*.json benchmarks/RESULTS.md

The first table is issue 13's targets, per regime (``test_regimes.py``): hot-loop figures
are medians over turns of each turn's best round (``extra_info["turn_times"]``), batch
figures medians of rounds. The second is the earlier issues' table (``test_hot_loop.py``,
``test_batch.py``), each ratio from the median and, beside it, from the minimum of the rounds.
A LangChain peer timed on a subset of the prompts is scaled by its ``extra_info["scale"]``.
Groups that are missing from the JSON are left out.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any, Optional

__all__ = ["load", "rows", "render", "regime_rows", "render_regimes", "main"]

HOT = "hot-loop-{}-msgs-8k-budget"
BATCH = "batch-10k-prompts-2k-budget"
MEMORY = "batch-10k-prompts-memory"


def load(path: str) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    """``{(group, impl): {"median": s, "min": s, "extra": {...}}}`` and the machine info."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for b in data["benchmarks"]:
        impl = (b.get("params") or {}).get("impl") or b.get("param") or b["name"]
        extra = b.get("extra_info", {})
        scale = float(extra.get("scale", 1))
        out[(b["group"], impl)] = {"median": b["stats"]["median"] * scale, "min": b["stats"]["min"] * scale,
                                   "extra": extra}
    return out, data.get("machine_info", {})


def _ratio(res, num: tuple[str, str], den: tuple[str, str], key: str) -> Optional[float]:
    if num not in res or den not in res:
        return None
    return res[num][key] / res[den][key]


def rows(res: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, str, Optional[float], Optional[float], str]]:
    """``(metric, target, median ratio, min ratio, "yes"/"no")`` for every figure present."""
    h600, h100 = HOT.format(600), HOT.format(100)
    specs = [
        ("hot loop, 600 msgs: LangChain+tiktoken / jianmu_fast", ">= 1000", (h600, "langchain_tiktoken"),
         (h600, "jianmu_fast"), lambda r: r >= 1000),
        ("hot loop, 600 msgs: LangChain memoized / jianmu_fast", ">= 5", (h600, "langchain_memoized"),
         (h600, "jianmu_fast"), lambda r: r >= 5),
        ("hot loop, 600 msgs: LangChain approximate / jianmu_fast", "(peer)", (h600, "langchain_approx"),
         (h600, "jianmu_fast"), None),
        ("hot loop: jianmu_fast at 600 msgs / at 100 msgs", "<= 2", (h600, "jianmu_fast"),
         (h100, "jianmu_fast"), lambda r: r <= 2),
        ("hot loop, 600 msgs: pure-Python core / compiled core", "(info)", (h600, "jianmu_fast_py"),
         (h600, "jianmu_fast"), None),
        ("batch 10k: LangChain loop / jianmu_fast", ">= 50", (BATCH, "langchain_loop"), (BATCH, "jianmu_fast"),
         lambda r: r >= 50),
        ("batch 10k: LangChain memoized / jianmu_fast", ">= 2", (BATCH, "langchain_memoized"),
         (BATCH, "jianmu_fast"), lambda r: r >= 2),
        ("batch 10k: jianmu_fast / raw tokenizer floor", "<= 1.5", (BATCH, "jianmu_fast"), (BATCH, "_floor"),
         lambda r: r <= 1.5),
        ("batch 10k: workers=2 / workers=1", "(info)", (BATCH, "jianmu_fast_workers2"), (BATCH, "jianmu_fast"), None),
    ]
    floor = [res[(BATCH, k)] for k in ("raw_floor_loop", "raw_floor_batch") if (BATCH, k) in res]
    if floor:
        res = dict(res)
        res[(BATCH, "_floor")] = {"median": min(f["median"] for f in floor), "min": min(f["min"] for f in floor)}
    out = []
    for name, target, num, den, ok in specs:
        med, mn = _ratio(res, num, den, "median"), _ratio(res, num, den, "min")
        if med is None:
            continue
        out.append((name, target, med, mn, "" if ok is None else ("yes" if ok(med) else "no")))
    mem = next((v for (g, _), v in res.items() if g == MEMORY), None)
    if mem is not None and "ratio" in mem["extra"]:
        r = float(mem["extra"]["ratio"])
        out.append(("batch 10k: peak memory / JSON of the 100 input conversations", "< 2", r, r,
                    "yes" if r < 2 else "no"))
        if "ratio_prompts_jsonl" in mem["extra"]:
            r = float(mem["extra"]["ratio_prompts_jsonl"])
            out.append(("batch 10k: peak memory / JSONL of the 10,000 prompts", "< 2", r, r,
                        "yes" if r < 2 else "no"))
    return out


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x"


def render(table, machine: dict[str, Any]) -> str:
    """The markdown of ``rows()``.

    >>> print(render([("a / b", ">= 2", 3.0, 2.5, "yes")], {}))  # doctest: +NORMALIZE_WHITESPACE
    | metric | target | median | min | met |
    |---|---|---|---|---|
    | a / b | >= 2 | 3.00x | 2.50x | yes |
    """
    lines = ["| metric | target | median | min | met |", "|---|---|---|---|---|"]
    for name, target, med, mn, ok in table:
        lines.append(f"| {name} | {target} | {_fmt(med)} | {_fmt(mn)} | {ok} |")
    if machine:
        lines.append("")
        lines.append(_machine_line(machine))
    return "\n".join(lines)


def _machine_line(machine: dict[str, Any]) -> str:
    if not machine:
        return ""
    cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or platform.processor()
    cores = machine.get("cpu", {}).get("count", "?")
    return f"Machine: {cpu} ({cores} cores), Python {machine.get('python_version', '?')}; ratios of the same run."


# -- issue 13 -----------------------------------------------------------------------------------

US = 1e-6


def _turn(res, group: str, impl: str) -> Optional[float]:
    """Median over turns of each turn's best time, or None."""
    e = res.get((group, impl))
    if e is None or "turn_median" not in e["extra"]:
        return None
    return float(e["extra"]["turn_median"])


def _excess(res, group: str, impl: str, floor: str) -> Optional[float]:
    """Median over turns of (turn - 1.5 x that turn's floor), in seconds."""
    a, b = res.get((group, impl)), res.get((group, floor))
    if a is None or b is None or "turn_times" not in a["extra"] or "turn_times" not in b["extra"]:
        return None
    ts, fs = a["extra"]["turn_times"], b["extra"]["turn_times"]
    if len(ts) != len(fs):
        return None
    return sorted(t - 1.5 * f for t, f in zip(ts, fs))[len(ts) // 2]


def _us(x: float) -> str:
    return f"{x / US:,.1f} µs"


def _x(x: float) -> str:
    return f"{x:,.0f}×" if x >= 100 else f"{x:.2f}×"


def regime_rows(res) -> list[tuple[str, str, str, str, str]]:
    """``(regime, metric, target, measured, met)`` for every issue-13 figure present."""
    out: list[tuple[str, str, str, str, str]] = []

    def add(regime: str, metric: str, target: str, measured: str, ok: Optional[bool]) -> None:
        out.append((regime, metric, target, measured, "" if ok is None else ("yes" if ok else "**no**")))

    for regime in ("cs", "coding"):
        hot, hot100, rep, batch = f"hot-{regime}-600", f"hot-{regime}-100", f"repeat-{regime}-600", f"batch-{regime}"
        for impl, floor, label, target in (
            ("preset", "floor", "`for_react`", True), ("preset_fastokens", "floor_fastokens", "`for_react`, fastokens engine", True),
            ("filter", "floor", "`TokenBudgetFilter` alone", False),
        ):
            t, f, ex = _turn(res, hot, impl), _turn(res, hot, floor), _excess(res, hot, impl, floor)
            if t is None or f is None or ex is None:
                continue
            add(regime, f"hot loop 600 msgs, 8k budget, {label}: median turn − 1.5 × its new texts' tokenization",
                "≤ 15 µs" if target else "(info)",
                f"{_us(ex)} (turn {_us(t)}, floor {_us(f)})", ex <= 15 * US if target else None)
        t = _turn(res, hot, "preset")
        for peer, label, target in (("langchain_memo", "LangChain `trim_messages` + memoized counter", 5.0),
                                    ("langchain", "LangChain `trim_messages`, plain counter", None)):
            p = _turn(res, hot, peer)
            if t is not None and p is not None:
                add(regime, f"hot loop 600: {label} / `for_react` (median turns)",
                    f"≥ {target:g}×" if target else "(info)", _x(p / t), p / t >= target if target else None)
        t100 = _turn(res, hot100, "preset")
        if t is not None and t100 is not None:
            add(regime, "hot loop: `for_react` turn at 600 msgs / at 100", "≤ 1.3×", _x(t / t100), t / t100 <= 1.3)
        for impl, label, target in (("preset", "`for_react`", True), ("filter", "`TokenBudgetFilter` alone", False)):
            e = res.get((rep, impl))
            if e is not None:
                add(regime, f"repeated call on an unchanged 600-msg history, {label}", "≤ 10 µs" if target else "(info)",
                    _us(e["median"]), e["median"] <= 10 * US if target else None)
        tt = _turn(res, hot, "preset_tools")
        if t is not None and tt is not None:
            add(regime, "hot loop 600: turn with 14 tool schemas (~2k tokens, new list each turn) / without",
                "≤ 1.1×", _x(tt / t), tt / t <= 1.1)
        fl = res.get((batch, "floor"))
        if fl is not None:
            floor_s = float(fl["extra"].get("best_s", fl["median"]))
            n = fl["extra"].get("prompts", "?")
            for impl in ("transform_batch", "build_batch", "transform_batch_fastokens", "build_batch_fastokens"):
                e = res.get((batch, impl))
                if e is None:
                    continue
                r = e["median"] / floor_s
                fast = impl.endswith("_fastokens")
                add(regime, f"batch of {n:,} prompts, {'5k' if regime == 'cs' else '16k'} budget: `{impl.replace('_fastokens', '')}`"
                            f"{', fastokens engine' if fast else ''} / tiktoken floor (each distinct text once)",
                    "< 1×" if fast else "≤ 1.3×", f"{_x(r)} ({e['median']:.3f} s vs {floor_s:.3f} s)",
                    r < 1 if fast else r <= 1.3)
            ff = res.get((batch, "floor_fastokens"))
            if ff is not None:
                add(regime, f"batch: fastokens floor / tiktoken floor", "(info)", _x(ff["median"] / floor_s), None)
            tb = res.get((batch, "transform_batch"))
            for peer, label, target in (("langchain_memo", "memoized LangChain loop", 3.0),
                                        ("langchain", "LangChain loop (subsample, scaled)", 100.0)):
                p = res.get((batch, peer))
                if tb is not None and p is not None:
                    r = p["median"] / tb["median"]
                    add(regime, f"batch: {label} / `transform_batch`", f"≥ {target:g}×", _x(r), r >= target)
        mem = res.get((f"batch-{regime}-memory", "test_batch_memory"))
        if mem is not None and "ratio" in mem["extra"]:
            r = float(mem["extra"]["ratio"])
            add(regime, "batch: peak traced memory of `transform_batch` / JSON of its input conversations", "< 2×",
                f"{_x(r)} ({mem['extra']['peak_bytes'] / 1e6:.0f} MB / {mem['extra']['input_json_bytes'] / 1e6:.1f} MB)",
                r < 2)
    st = res.get(("fastokens-startup", "test_fastokens_startup"))
    if st is not None:
        add("-", "startup: tiktoken counter; fastokens engine on top (fresh process)", "(info)",
            f"{st['extra']['tiktoken_load_s']:.2f} s; +{st['extra']['fastokens_build_s']:.2f} s", None)
    return out


def render_regimes(table) -> str:
    """The markdown of ``regime_rows()``.

    >>> print(render_regimes([("cs", "a / b", "≥ 5×", "6.00×", "yes")]))
    | regime | metric | target | measured | met |
    |---|---|---|---|---|
    | cs | a / b | ≥ 5× | 6.00× | yes |
    """
    lines = ["| regime | metric | target | measured | met |", "|---|---|---|---|---|"]
    for row in table:
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: report.py BENCH.json [BENCH.json ...] RESULTS.md", file=sys.stderr)
        return 2
    res: dict[tuple[str, str], dict[str, Any]] = {}
    machine: dict[str, Any] = {}
    missing = []
    for path in argv[1:-1]:
        try:
            part, info = load(path)
        except (OSError, ValueError, KeyError) as exc:  # a module that crashed wrote no JSON
            missing.append(f"{path} ({type(exc).__name__})")
            continue
        res.update(part)
        machine = machine or info
    text = "# Benchmark results\n\n"
    regimes = regime_rows(res)
    if regimes:
        text += ("## Issue 13 targets (o200k_base, compiled core, tiktoken engine unless noted)\n\n"
                 + render_regimes(regimes) + "\n\n")
    old = rows(res)
    if old:
        text += "## Earlier targets (issues 2 and 7)\n\n" + render(old, {}) + "\n\n"
    text += _machine_line(machine) + "\n"
    if missing:
        text += "\nNo results from: " + ", ".join(missing) + "\n"
    with open(argv[-1], "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
