"""Turn pytest-benchmark's ``--benchmark-json`` output into the markdown table of ratios.

Usage (``make bench`` does this)::

    .venv/bin/python -m pytest benchmarks --benchmark-disable-gc --benchmark-json=out/bench.json
    .venv/bin/python benchmarks/report.py out/bench.json benchmarks/RESULTS.md

Each ratio is computed from the median and, beside it, from the minimum of the rounds (the
minimum is the steadier figure on a shared machine). A LangChain peer timed on a subset of
the prompts is scaled by its ``extra_info["scale"]``. Groups that are missing from the JSON
(e.g. ``pytest benchmarks/test_batch.py`` alone) are left out of the table.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any, Optional

__all__ = ["load", "rows", "render", "main"]

HOT = "hot-loop-{}-msgs-8k-budget"
BATCH = "batch-10k-prompts-2k-budget"
MEMORY = "batch-10k-prompts-memory"


def load(path: str) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    """``{(group, impl): {"median": s, "min": s, "extra": {...}}}`` and the machine info."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for b in data["benchmarks"]:
        impl = b.get("param") or b["name"]
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
        cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or platform.processor()
        lines.append("")
        lines.append(f"Machine: {cpu}, Python {machine.get('python_version', '?')}; ratios of the same run.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: report.py BENCH.json RESULTS.md", file=sys.stderr)
        return 2
    res, machine = load(argv[1])
    text = "# Benchmark results\n\n" + render(rows(res), machine) + "\n"
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
