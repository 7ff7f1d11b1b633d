"""The HTML reports in a real browser (issue 20): headless Chromium from the distribution's
packages (``apt-get install chromium``), driven over the DevTools pipe (``tests/headless.py``).

Each page loads from disk with no console error or uncaught exception, every chart is drawn
(an SVG with marks in the DOM after the scripts ran, axis titles present), and the headline
numbers the browser shows equal the run's own summary / ``prefix_cache_stats``. A full-page
screenshot goes to the test's temporary directory; with ``JIANMU_FAST_UPDATE_SCREENSHOTS=1``
it is also written to ``docs/`` (the README's "Seeing a run" pictures). Without a browser
the test skips and says why.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from headless import find_chromium, open_page
from test_report_html import EXAMPLE_FLAGS, EXAMPLES, longest_example, summary

from jianmu_fast import cli, prefix_cache_stats

pytest.importorskip("plotly", reason="the report extra (pip install 'jianmu_fast[report]') is not installed")

DOCS = Path(__file__).resolve().parent.parent / "docs"
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium to open the reports in: install it with `apt-get install chromium` (CI's .ci/run does), "
    "or point JIANMU_FAST_CHROMIUM at a Chromium or Chrome binary",
)


def check_page(page: Path, shot: Path, docs_name: str) -> dict:
    result = open_page(CHROMIUM, page)
    shot.write_bytes(result.png)
    if os.environ.get("JIANMU_FAST_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(shot, DOCS / docs_name)
    assert result.png.startswith(b"\x89PNG") and len(result.png) > 10_000
    assert result.errors == [], result.errors
    probe = result.probe
    assert probe["rendered"] == str(len(probe["charts"])) and probe["charts"], probe
    for chart in probe["charts"]:
        assert chart["svg"] >= 1 and chart["marks"] >= 1, chart
        assert chart["xtitle"] and chart["ytitle"], chart
    return probe


def test_example_run_report_in_chromium(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent.parent)  # the page names the input as `make run` does
    report = tmp_path / "report.html"
    code = cli.main(["build", "examples/conversations.jsonl", "-o", str(tmp_path / "prompts.jsonl"),
                     *EXAMPLE_FLAGS, "--report", str(report)])
    err = capsys.readouterr().err
    assert code == 0, err
    probe = check_page(report, tmp_path / "report.png", "report-run.png")
    said = summary(err)
    shown = probe["headline"]
    for key in ("prompts", "failures", "tokens_after", "tokens_dropped"):
        assert shown[key] == said[key], key
    assert f"{float(shown['seconds']):.2f}" == said["seconds"]
    titles = [c["title"] for c in probe["charts"]]
    assert titles[:3] == ["Prompt sizes before and after trimming", "Mean tokens per section",
                          "How the sections vary across prompts"]
    assert "Where the time went" in titles


def test_replay_report_in_chromium(tmp_path, capsys):
    conv = tmp_path / "conversation.json"
    conv.write_text(json.dumps({"messages": longest_example()}), encoding="utf-8")
    report = tmp_path / "turns.html"
    code = cli.main(["replay", str(conv), *EXAMPLE_FLAGS, "--report", str(report)])
    assert code == 0, capsys.readouterr().err
    probe = check_page(report, tmp_path / "turns.png", "report-replay.png")
    ns = cli._parser().parse_args(["build", "-", *EXAMPLE_FLAGS])
    counter = cli.make_counter(ns.tokenizer)
    builder = cli.make_builder(ns, counter)
    from jianmu_fast.message import coerce_messages
    from jianmu_fast.prefix_cache import turn_ends

    persona, rest = cli.split_persona(coerce_messages(longest_example()))
    st = prefix_cache_stats([builder.build({"messages": rest[:e], "persona": persona}) for e in turn_ends(rest)],
                            counter)
    shown = probe["headline"]
    assert (shown["turns"], shown["prefix_hits"], shown["cached_tokens"], shown["total_tokens"]) == (
        str(st.turns), str(st.prefix_hits), str(st.cached_tokens), str(st.total_tokens))
    assert shown["prefix_hit_rate"] == f"{100 * st.prefix_hit_rate:.1f}"
