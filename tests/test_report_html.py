"""HTML reports (issue 20): ``build --report``, ``replay``, ``.to_html()``; numbers, listings, size.

The numbers on each page are checked against what the run itself says (its stderr summary,
its output lines, ``prefix_cache_stats`` on the same prompts). The browser test is in
``test_report_browser.py``.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jianmu_fast import cli, prefix_cache_stats
from jianmu_fast.memory.context import ContextBuilder, SimpleTokenCounter, TokenBudgetFilter
from jianmu_fast.message import coerce_messages
from jianmu_fast.prefix_cache import turn_ends

pytest.importorskip("plotly", reason="the report extra (pip install 'jianmu_fast[report]') is not installed")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "conversations.jsonl"
TOOLS_DESC = ROOT / "examples" / "tools_desc.txt"
EXAMPLE_FLAGS = ["--preset", "react", "--tools-desc-file", str(TOOLS_DESC), "--max-tokens", "4000"]
SUMMARY = re.compile(
    r"(\d+) prompts? written, (\d+) lines? failed, in ([\d.]+) s\n  tokens kept (\d+)(?:, dropped (\d+))?"
)


def headline(page: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in re.findall(r'<td data-key="(\w+)">([^<]*)</td>', page)}


def summary(stderr: str) -> dict[str, str]:
    m = SUMMARY.search(stderr)
    assert m is not None, stderr
    return dict(zip(["prompts", "failures", "seconds", "tokens_after", "tokens_dropped"], m.groups()))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def section_table(page: str, title: str) -> str:
    """The HTML of the section whose <h2> is ``title``."""
    start = page.index(f"<h2>{html.escape(title)}</h2>")
    return page[start:page.index("</section>", start)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- the bundled example run ------------------------------------------------------------------


def test_example_run_report_equals_the_summary(tmp_path, capsys):
    out, report = tmp_path / "prompts.jsonl", tmp_path / "report.html"
    code, _, err = run_cli(["build", str(EXAMPLES), "-o", str(out), *EXAMPLE_FLAGS, "--report", str(report)], capsys)
    assert code == 0, err
    page = report.read_text(encoding="utf-8")
    head, said, rows = headline(page), summary(err), read_jsonl(out)
    for key in ("prompts", "failures", "tokens_after", "tokens_dropped"):
        assert head[key] == said[key], key
    assert f"{float(head['seconds']):.2f}" == said["seconds"]
    assert int(head["tokens_after"]) == sum(r["prompt_tokens"] for r in rows)
    assert int(head["messages_dropped"]) == sum(r["dropped"]["messages"] for r in rows)
    assert int(head["trimmed"]) == sum(1 for r in rows if r["dropped"]["messages"]) > 0
    assert int(head["tokens_before"]) > int(head["tokens_after"])
    assert f"report written to {report}" in err
    # the sections add up to the mean prompt (no --tools-file: no tools section)
    total = re.search(r"<tr><td class=\"text\">total</td><td>([\d.]+)</td>", section_table(page, "Mean tokens per section"))
    assert total is not None
    assert float(total.group(1)) == pytest.approx(int(head["tokens_after"]) / int(head["prompts"]), abs=0.05)
    # every chart has an x and a y axis title with a unit or a count, and a table
    figures = json.loads(re.search(r'<script type="application/json" id="jianmu-figures">(.*?)</script>', page,
                                   re.S).group(1))
    assert len(figures) >= 6
    for fig in figures:
        assert fig["layout"]["xaxis"]["title"]["text"] and fig["layout"]["yaxis"]["title"]["text"], fig["id"]
        assert f'id="{fig["id"]}"' in page
    assert page.count("<table") >= len(figures) + 1
    # self-contained: no URL a browser would fetch
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', page)
    assert "No sanitize repair" in page and "No line failed." in page
    assert os.path.getsize(report) < 6_000_000


def test_run_with_failures_and_repairs_lists_them_with_file_line(tmp_path, capsys):
    call = lambda cid: [{"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}]  # noqa: E731
    no_id = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    good = [{"role": "user", "content": "hello there"}]
    lines = [
        json.dumps({"messages": good}),                                                   # 1 ok
        "{not json",                                                                        # 2 fails
        json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": call("a")},
                    {"role": "user", "content": "again"}]),                                # 3 broken unit dropped
        json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": no_id},
                    {"role": "tool", "tool_call_id": "c9", "content": "4"}, {"role": "user", "content": "ok"}]),  # 4
        json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                                       "tool_calls": call("b")}]),           # 5 broken tail
        json.dumps({"messages": [{"role": "user", "content": "word " * 400}]}),            # 6 over budget
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = tmp_path / "run.html"
    code, _, err = run_cli(["build", str(src), "-o", str(tmp_path / "out.jsonl"), "--max-tokens", "200",
                            "--on-error", "skip", "--tokenizer", "simple", "--report", str(report)], capsys)
    assert code == 0, err
    page = report.read_text(encoding="utf-8")
    head, said = headline(page), summary(err)
    assert head["prompts"] == said["prompts"] == "3"
    assert head["failures"] == said["failures"] == "3"
    assert head["repairs"] == "2"
    failed = section_table(page, "Failed lines by kind")
    for lineno, kind in ((2, "not JSON"), (5, "ToolCallHistoryError"), (6, "ContextBudgetError")):
        assert re.search(rf"<td class=\"text\">{re.escape(str(src))}:{lineno}</td><td class=\"text\">{kind}</td>",
                         failed), (lineno, kind)
        assert f"{src}:{lineno}: " in err  # the same lines the command reported
    repaired = section_table(page, "Sanitize repairs by kind")
    assert re.search(rf"{re.escape(str(src))}:3</td><td class=\"text\">broken tool-call unit left out</td>"
                     r"<td class=\"text\">messages\[1\]", repaired)
    assert re.search(rf"{re.escape(str(src))}:4</td><td class=\"text\">call id filled from its result</td>"
                     r"<td class=\"text\">messages\[1\]\.tool_calls\[0\]\.id = &#x27;c9&#x27;", repaired)


def test_on_error_raise_stops_the_report_where_the_run_stops(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('[{"role": "user", "content": "a"}]\n{bad\n[{"role": "user", "content": "b"}]\n{bad\n')
    report = tmp_path / "run.html"
    code, _, err = run_cli(["build", str(src), "-o", str(tmp_path / "o.jsonl"), "--tokenizer", "simple",
                            "--report", str(report)], capsys)
    assert code == 1
    head = headline(report.read_text(encoding="utf-8"))
    assert (head["prompts"], head["failures"]) == ("1", "1") == tuple(summary(err)[k] for k in ("prompts", "failures"))


def test_stdin_stdout_and_workers(tmp_path):
    """``-`` in and out, two worker processes: the report names <stdin> and matches the summary."""
    text = EXAMPLES.read_text(encoding="utf-8").splitlines()[:60]
    text.insert(5, "not json at all")
    report = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "jianmu_fast", "build", "-", *EXAMPLE_FLAGS, "--workers", "2",
                           "--on-error", "skip", "--report", str(report)], input="\n".join(text) + "\n",
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    head, said = headline(report.read_text(encoding="utf-8")), summary(proc.stderr)
    assert head["prompts"] == said["prompts"] == "60" and head["failures"] == said["failures"] == "1"
    assert head["tokens_after"] == said["tokens_after"]
    assert sum(json.loads(line)["prompt_tokens"] for line in proc.stdout.splitlines()) == int(head["tokens_after"])
    assert "&lt;stdin&gt;:6</td>" in report.read_text(encoding="utf-8")


def test_report_path_errors_are_usage_errors(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('[{"role": "user", "content": "a"}]\n')
    code, _, err = run_cli(["build", str(src), "-o", str(tmp_path / "o.jsonl"), "--report", str(src)], capsys)
    assert code == 2 and "--report" in err and "same file as INPUT" in err
    code, _, err = run_cli(["build", str(src), "--report", str(tmp_path / "no" / "r.html")], capsys)
    assert code == 2 and "--report" in err


# -- size bounds --------------------------------------------------------------------------------


def synthetic(n: int, path: Path) -> None:
    """``n`` short tool-calling conversations, varied and deterministic."""
    words = "cache token budget window prompt tool result history message filter".split()
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            msgs = [{"role": "system", "content": "You are terse."}]
            for k in range(1 + i % 3):
                text = " ".join(words[(i * 7 + k * 3 + j) % 10] for j in range(5 + (i * 13 + k) % 60))
                msgs += [{"role": "user", "content": text},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": f"c{k}", "content": text * (1 + k)}]
            msgs.append({"role": "user", "content": f"question {i}"})
            f.write(json.dumps({"messages": msgs}) + "\n")


def test_page_size_does_not_grow_with_the_run(tmp_path, capsys):
    sizes = {}
    for n in (2000, 10000):
        src = tmp_path / f"in{n}.jsonl"
        synthetic(n, src)
        report = tmp_path / f"r{n}.html"
        code, _, err = run_cli(["build", str(src), "-o", os.devnull, "--tokenizer", "simple", "--max-tokens", "300",
                                "--report", str(report)], capsys)
        assert code == 0, err
        assert headline(report.read_text(encoding="utf-8"))["prompts"] == str(n)
        sizes[n] = os.path.getsize(report)
    assert sizes[10000] < 6_000_000 and sizes[2000] < 6_000_000
    assert sizes[10000] - sizes[2000] < 1_000_000, sizes
    page = (tmp_path / "r10000.html").read_text(encoding="utf-8")
    assert "Capped at 20" in page and page.count("in10000.jsonl:") == 2 * 20  # chart labels and table


# -- replay ---------------------------------------------------------------------------------------


def longest_example() -> list[dict]:
    lines = [json.loads(line) for line in EXAMPLES.read_text(encoding="utf-8").splitlines()]
    return max(lines, key=lambda o: len(o["messages"]))["messages"]


@pytest.mark.parametrize("shape", ["object", "list"])
def test_replay_equals_prefix_cache_stats(tmp_path, capsys, shape):
    messages = longest_example()
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps({"messages": messages} if shape == "object" else messages), encoding="utf-8")
    report = tmp_path / "turns.html"
    code, out, err = run_cli(["replay", str(conv), *EXAMPLE_FLAGS, "--report", str(report), "--format", "text"],
                             capsys)
    assert code == 0, err
    # the same prompts, built independently: one per model call, the persona as `build` takes it
    ns = cli._parser().parse_args(["build", "-", *EXAMPLE_FLAGS])
    counter = cli.make_counter(ns.tokenizer)
    builder = cli.make_builder(ns, counter)
    msgs = coerce_messages(messages)
    persona, rest = cli.split_persona(msgs)
    prompts = [builder.build({"messages": rest[:end], "persona": persona}) for end in turn_ends(rest)]
    st = prefix_cache_stats(prompts, counter)
    assert st.turns > 10
    assert out.strip().startswith(f"{st.turns} model-call turns; prefix hit rate {100 * st.prefix_hit_rate:.1f} %")
    head = headline(report.read_text(encoding="utf-8"))
    assert head == {"turns": str(st.turns), "prefix_hits": str(st.prefix_hits),
                    "prefix_hit_rate": f"{100 * st.prefix_hit_rate:.1f}", "total_tokens": str(st.total_tokens),
                    "cached_tokens": str(st.cached_tokens),
                    "cached_token_share": f"{100 * st.cached_token_share:.1f}",
                    "mean_prompt_tokens": f"{st.mean_prompt_tokens:.1f}"}
    page = report.read_text(encoding="utf-8")
    assert "budget 4000" in page and "filters[0] TokenBudgetFilter removed" in page


def test_replay_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"msgs": []}')
    code, _, err = run_cli(["replay", str(bad)], capsys)
    assert code == 2 and "bad.json" in err and "messages" in err
    code, _, err = run_cli(["replay", str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "missing.json" in err


def test_prefix_cache_stats_to_html(tmp_path):
    messages = coerce_messages(longest_example())
    flt = TokenBudgetFilter(3000, SimpleTokenCounter())
    prompts = [flt.apply(messages[:end]) for end in turn_ends(messages)]
    st = prefix_cache_stats(prompts)
    assert [t.prompt_tokens for t in st.per_turn] == [SimpleTokenCounter().count_messages(p) for p in prompts]
    assert sum(t.cached_tokens for t in st.per_turn) == st.cached_tokens
    assert sum(t.prefix_hit for t in st.per_turn) == st.prefix_hits
    st.to_html(tmp_path / "t.html", budget=3000)
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    head = headline(page)
    assert head["turns"] == str(st.turns) and head["cached_tokens"] == str(st.cached_tokens)
    assert "Not recorded" in page  # no stage records without a replay


# -- Python objects -------------------------------------------------------------------------------


def test_build_report_to_html_lists_every_message_in_order(tmp_path):
    from jianmu_fast.message import ai, human

    b = ContextBuilder.for_chat(system_prompt="Be brief.", max_messages=2)
    history = [human("first <question>"), ai("a1"), human("q2"), ai("a2"), human("q3")]
    r = b.build_report({"messages": history})
    r.to_html(tmp_path / "one.html")
    page = (tmp_path / "one.html").read_text(encoding="utf-8")
    assert headline(page)["messages_kept"] == str(len(r.messages)) == "3"
    listing = section_table(page, "Every message, in order")
    rows = re.findall(r"<tr><td>(\d+)</td><td class=\"text\">([^<]*)</td><td class=\"text\">(\w+)</td>"
                      r"<td>(\d+)</td><td class=\"text\">(kept|dropped)</td><td class=\"text\">([^<]*)</td></tr>",
                      listing)
    assert [(int(p), state, html.unescape(text)) for p, _s, _r, _t, state, text in rows] == [
        (0, "kept", "Be brief."), (1, "dropped", "first <question>"), (2, "dropped", "a1"), (3, "dropped", "q2"),
        (4, "kept", "a2"), (5, "kept", "q3")]
    assert rows[0][1] == "providers[0] StaticPromptProvider" and rows[5][1] == "providers[1] StateHistoryProvider"
    counter = r.counter
    assert [int(t) for *_, t, _k, _x in rows] == [counter.count_message(m) for m in
                                                  [b.providers[0].get_messages({})[0], *history]]


def test_batch_report_to_html(tmp_path):
    from jianmu_fast.batch import build_batch_report
    from jianmu_fast.message import human

    b = ContextBuilder.for_chat(system_prompt="Be brief.", max_tokens=30, token_counter=SimpleTokenCounter())
    states = [{"messages": [human("hi")]}, {"messages": [human("x" * 400)]}, {"messages": [human("yo")]}]
    r = build_batch_report(b, states)
    r.to_html(tmp_path / "b.html", counter=SimpleTokenCounter())
    page = (tmp_path / "b.html").read_text(encoding="utf-8")
    head = headline(page)
    assert (head["states"], head["prompts"], head["failures"]) == ("3", "2", "1")
    assert head["tokens"] == str(sum(SimpleTokenCounter().count_messages(p) for p in r.prompts if p is not None))
    assert "states[1]</td><td class=\"text\">ContextBudgetError" in page


# -- the optional extra ---------------------------------------------------------------------------


def test_core_never_imports_plotly_and_the_error_names_the_extra(tmp_path):
    code = (
        "import sys\n"
        "import jianmu_fast, jianmu_fast.cli, jianmu_fast.run_stats, jianmu_fast.replay, jianmu_fast.report_html\n"
        "import jianmu_fast.batch, jianmu_fast.prefix_cache\n"
        "assert 'plotly' not in sys.modules, 'plotly imported'\n"
        "sys.modules['plotly'] = None\n"
        "from jianmu_fast.report_html import require_plotly\n"
        "try:\n"
        "    require_plotly()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "from jianmu_fast import cli\n"
        "sys.exit(cli.main(['build', '-', '--report', %r]))\n" % str(tmp_path / "r.html")
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, input="")
    assert "pip install 'jianmu_fast[report]'" in proc.stdout, proc.stderr
    assert proc.returncode == 2 and "jianmu_fast[report]" in proc.stderr


def test_a_run_with_no_prompt_says_so(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{bad\n"a string"\n', encoding="utf-8")
    report = tmp_path / "run.html"
    code, _, err = run_cli(["build", str(src), "-o", os.devnull, "--on-error", "skip", "--max-messages", "3",
                            "--report", str(report)], capsys)
    assert code == 0, err
    page = report.read_text(encoding="utf-8")
    head = headline(page)
    assert (head["prompts"], head["failures"]) == (summary(err)["prompts"], summary(err)["failures"]) == ("0", "2")
    assert page.count("No prompt was written: nothing to show.") == 2 and "No line failed." not in page
