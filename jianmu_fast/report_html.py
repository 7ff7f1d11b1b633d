"""Self-contained HTML reports: a ``build`` run, a replay turn by turn, one prompt, a batch.

Why Plotly: its ``plotly.js`` bundle (about 4.8 MB, MIT) is one file that the Python package
ships (``plotly.offline.get_plotlyjs()``), so it is inlined into the page and the page needs no
network when it is viewed; it draws bar, box and line charts as SVG (so a test can count the
marks in the DOM), it takes pre-aggregated figures (bars of histogram bins, boxes from
quantiles), so a page's size does not grow with the number of prompts, and its figures are
plain JSON that the Python side validates (``plotly.graph_objects``). Vega-Lite would need
three runtimes (vega, vega-lite, vega-embed) that no pip package ships together. The
plotting library is the optional extra ``jianmu_fast[report]``; only this module imports it,
lazily, and the core install never does.

Every chart has its title as an ``<h2>`` in the page, axes with units, and its numbers in an
HTML ``<table>`` below it; a chart with nothing to show is replaced by a sentence saying so.
Headline figures are ``<td data-key="...">`` cells (plain integers, easy to copy and to test).
User text (message previews, reasons) only appears in tables, HTML-escaped; the chart data
embedded as JSON has ``<`` escaped, so no text can close the ``<script>``.

>>> page = _Page("demo")
>>> page.headline([("prompts", "prompts", 3)])
>>> "data-key=\\"prompts\\">3<" in page.html(plotly_js="")
True
"""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
from typing import Any, Iterable, Optional, Sequence

__all__ = [
    "EXTRA_HINT",
    "require_plotly",
    "run_report_html",
    "turns_report_html",
    "build_report_html",
    "batch_report_html",
    "write_html",
]

EXTRA_HINT = "pip install 'jianmu_fast[report]'"
_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D",
           "#BAB0AC"]
_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
p.note,p.info{color:#555;font-size:.9em}table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:2px 8px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.text{text-align:left;font-family:ui-monospace,monospace;max-width:520px;
overflow-wrap:anywhere}table.headline td{font-size:1.3em;font-weight:600}
.chart{width:100%;height:380px}details summary{cursor:pointer;color:#555;font-size:.9em}
"""


def require_plotly() -> Any:
    """``plotly.graph_objects``, or an ``ImportError`` naming the extra to install.

    >>> require_plotly().__name__
    'plotly.graph_objects'
    """
    try:
        import plotly.graph_objects as go
        import plotly.offline  # noqa: F401  (the inlined plotly.js)
    except ImportError as exc:
        raise ImportError(f"HTML reports need plotly: {EXTRA_HINT}") from exc
    return go


def _plotly_js() -> str:
    require_plotly()
    import plotly.offline

    return plotly.offline.get_plotlyjs()


def write_html(path: Any, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in the same directory, then
    ``os.replace``), so a reader never sees half a page."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- the page ---------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"<td>{value:.1f}</td>" if not value.is_integer() else f"<td>{int(value)}</td>"
    if isinstance(value, int):
        return f"<td>{value}</td>"
    return f'<td class="text">{_esc(value)}</td>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f'<table{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:40] or "chart"


class _Page:
    """An HTML page under construction: a headline table, then sections of charts and tables."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures: list[tuple[str, dict[str, Any]]] = []

    def headline(self, rows: Sequence[tuple[str, str, Any]], info: str = "") -> None:
        """``rows``: ``(key, label, value)``; each value is a ``<td data-key=key>``."""
        cells = "".join(f'<tr><th>{_esc(label)}</th><td data-key="{_esc(key)}">{_esc(_fmt(value))}</td></tr>'
                        for key, label, value in rows)
        self.parts.append(f'<section id="headline"><table class="headline"><tbody>{cells}</tbody></table>'
                          + (f'<p class="info">{_esc(info)}</p>' if info else "") + "</section>")

    def section(self, title: str, body: str = "", note: str = "") -> None:
        self.parts.append(f'<section><h2>{_esc(title)}</h2>' + (f'<p class="note">{_esc(note)}</p>' if note else "")
                          + body + "</section>")

    def chart(self, title: str, figure: Any, headers: Sequence[str], rows: Sequence[Sequence[Any]],
              note: str = "", after: str = "") -> None:
        """A chart (a ``plotly.graph_objects.Figure``) with its numbers as a table below it."""
        fid = f"chart-{len(self.figures)}-{_slug(title)}"
        figure.update_layout(template="none", margin=dict(l=70, r=20, t=20, b=60), font=dict(size=12),
                             legend=dict(orientation="h", y=-0.2), colorway=_COLORS)
        figure.update_xaxes(showgrid=True, gridcolor="#eee", zeroline=False, automargin=True)
        figure.update_yaxes(showgrid=True, gridcolor="#eee", zeroline=False, automargin=True)
        self.figures.append((fid, figure.to_plotly_json()))
        body = (f'<div class="chart" id="{fid}" role="img" aria-label="{_esc(title)}"></div>'
                f'<details open><summary>the numbers</summary>{_table(headers, rows)}{after}</details>')
        self.section(title, body, note)

    def html(self, plotly_js: Optional[str] = None) -> str:
        js = _plotly_js() if plotly_js is None else plotly_js
        specs = json.dumps([{"id": fid, "data": f["data"], "layout": f["layout"]} for fid, f in self.figures],
                           separators=(",", ":"), default=_json_default)
        specs = specs.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        boot = (
            "(function(){var specs=JSON.parse(document.getElementById('jianmu-figures').textContent);"
            "var done=specs.map(function(s){return Plotly.newPlot(s.id,s.data,s.layout,"
            "{displayModeBar:false,responsive:true});});"
            "Promise.all(done).then(function(){document.body.setAttribute('data-charts-rendered',String(specs.length));});"
            "})();"
        )
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{_esc(self.title)}</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>{_esc(self.title)}</h1>\n" + "\n".join(self.parts)
            + f'\n<script type="application/json" id="jianmu-figures">{specs}</script>\n'
            + (f"<script>{js}</script>\n<script>{boot}</script>\n" if self.figures else "")
            + "</body></html>\n"
        )


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


# -- numbers ----------------------------------------------------------------------------------


def _quantile(sorted_values: Sequence[int], p: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default).

    >>> _quantile([1, 2, 3, 4], 0.5)
    2.5
    """
    n = len(sorted_values)
    if not n:
        return 0.0
    pos = p * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def _nice_width(span: float, bins: int) -> int:
    """A round bin width (1, 2, 5 times a power of ten) giving at most about ``bins`` bins.

    >>> _nice_width(1000, 30), _nice_width(7, 30)
    (50, 1)
    """
    raw = max(span / bins, 1.0)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return int(m * power)
    return int(10 * power)


def _histogram(series: Sequence[Sequence[int]], bins: int = 30, extra: Sequence[int] = ()) -> tuple[
        list[int], list[list[int]]]:
    """Shared integer bin edges over every series (and ``extra`` values such as the budget)
    and the count of each series per bin: ``(edges, counts)``; bin ``k`` is
    ``edges[k] <= v < edges[k + 1]``.

    >>> _histogram([[1, 2, 2, 9]], bins=3)
    ([0, 5, 10], [[3, 1]])
    """
    values = [v for s in series for v in s] + list(extra)
    if not values:
        return [], [[] for _ in series]
    lo, hi = min(values), max(values)
    width = _nice_width(hi - lo + 1, bins)
    start = (lo // width) * width
    n = (hi - start) // width + 1
    edges = [start + k * width for k in range(n + 1)]
    counts = []
    for s in series:
        c = [0] * n
        for v in s:
            c[(v - start) // width] += 1
        counts.append(c)
    return edges, counts


def _axis(title: str) -> dict[str, Any]:
    return dict(title=dict(text=title))


# -- a build run ------------------------------------------------------------------------------


def run_report_html(stats: Any) -> str:
    """The page of a ``build`` run (a :class:`~jianmu_fast.run_stats.RunStats`)."""
    go = require_plotly()
    st = stats
    page = _Page(f"jianmu-fast build: {st.source}")
    info = ", ".join(f"{k} {v}" for k, v in st.info.items())
    limits = []
    if st.budget is not None:
        limits.append(f"--max-tokens {st.budget}")
    if st.max_messages is not None:
        limits.append(f"--max-messages {st.max_messages}")
    page.headline([
        ("prompts", "prompts written", st.prompts),
        ("failures", "lines failed", st.failures),
        ("trimmed", "prompts trimmed (an input message left out)", st.trimmed),
        ("tokens_before", "tokens before trimming", st.tokens_before),
        ("tokens_after", "tokens after trimming (kept)", st.tokens_after),
        ("tokens_dropped", "tokens of input messages dropped", st.tokens_dropped),
        ("messages_dropped", "input messages dropped", st.messages_dropped),
        ("repairs", "sanitize repairs", st.repairs),
        ("seconds", "wall time (s)", round(st.seconds, 2)),
    ], info=(info + ("; " if info and limits else "") + ", ".join(limits)) or "")

    # prompt sizes
    if st.prompts:
        extra = [st.budget] if st.budget is not None else []
        edges, (c_before, c_after) = _histogram([st.before, st.after], 30, extra)
        width = edges[1] - edges[0]
        centers = [e + width / 2 for e in edges[:-1]]
        fig = go.Figure([go.Bar(x=centers, y=c_before, width=width, name="before trimming", opacity=0.55),
                         go.Bar(x=centers, y=c_after, width=width, name="after trimming", opacity=0.75)])
        fig.update_layout(barmode="overlay", xaxis=_axis("prompt size (tokens)"), yaxis=_axis("prompts (count)"))
        if st.budget is not None:
            fig.add_vline(x=st.budget, line=dict(color="#E45756", dash="dash", width=2))
            fig.add_annotation(x=st.budget, y=1, yref="paper", text=f"budget {st.budget}", showarrow=False,
                               xanchor="left", yanchor="top", font=dict(color="#E45756"))
        s_b, s_a = sorted(st.before), sorted(st.after)
        rows: list[Any] = [(edges[k], edges[k + 1] - 1, c_before[k], c_after[k]) for k in range(len(c_before))]
        quant = _table(["", "p5", "p50", "p95", "max", "mean"], [
            ("before trimming", *(round(_quantile(s_b, p)) for p in (.05, .5, .95)), s_b[-1],
             round(sum(s_b) / len(s_b), 1)),
            ("after trimming", *(round(_quantile(s_a, p)) for p in (.05, .5, .95)), s_a[-1],
             round(sum(s_a) / len(s_a), 1)),
        ])
        page.chart("Prompt sizes before and after trimming", fig,
                   ["from (tokens)", "to (tokens)", "prompts before", "prompts after"], rows,
                   note="Tokens of each prompt (counter.count_messages, the request's tools not included)"
                   + (f"; the dashed line is the budget, {st.budget} tokens (tools included)." if st.budget is not None
                      else "; no --max-tokens budget was set."), after=quant)
    else:
        page.section("Prompt sizes before and after trimming", "<p>No prompt was written: nothing to show.</p>")

    # sections
    sections = {k: v for k, v in st.sections.items() if v and any(v)}
    if st.prompts and sections:
        n = st.prompts
        fig = go.Figure([go.Bar(y=["mean prompt"], x=[sum(v) / n], name=k, orientation="h", width=0.5)
                         for k, v in sections.items()])
        fig.update_layout(barmode="stack", xaxis=_axis("mean tokens per prompt (tokens)"),
                          yaxis=_axis("all prompts"), height=260)
        total = sum(sum(v) for v in sections.values()) / n
        rows = []
        for k, v in sections.items():
            s = sorted(v)
            mean = sum(s) / n
            rows.append((k, round(mean, 1), round(100 * mean / total, 1) if total else 0.0,
                         round(_quantile(s, .05)), round(_quantile(s, .5)), round(_quantile(s, .95)), s[-1]))
        rows.append(("total", round(total, 1), 100.0, "", "", "", ""))
        page.chart("Mean tokens per section", fig,
                   ["section", "mean (tokens)", "share (%)", "p5", "p50", "p95", "max"], rows,
                   note="What the budget was spent on, in the prompts as sent; the sections add up to the mean "
                   "prompt size plus the request's tools.")
        boxes = []
        for k, v in sections.items():
            s = sorted(v)
            boxes.append(go.Box(x=[k], name=k, q1=[_quantile(s, .25)], median=[_quantile(s, .5)],
                                q3=[_quantile(s, .75)], lowerfence=[_quantile(s, .05)],
                                upperfence=[_quantile(s, .95)], mean=[sum(s) / n], boxpoints=False))
        fig = go.Figure(boxes)
        fig.update_layout(showlegend=False, xaxis=_axis("section"), yaxis=_axis("tokens per prompt (tokens)"))
        rows = [(k, *(round(_quantile(sorted(v), p)) for p in (.05, .25, .5, .75, .95))) for k, v in sections.items()]
        page.chart("How the sections vary across prompts", fig,
                   ["section", "p5", "p25", "median", "p75", "p95"], rows,
                   note="Boxes span the 25th to 75th percentile; whiskers the 5th and 95th (tokens per prompt).")
    else:
        page.section("Mean tokens per section", "<p>No prompt was written: nothing to show.</p>")

    # dropped messages
    if st.prompts:
        edges, (counts,) = _histogram([st.dropped], 40)
        width = edges[1] - edges[0]
        if any(st.dropped):
            fig = go.Figure(go.Bar(x=[e + (width - 1) / 2 for e in edges[:-1]], y=counts, width=width * 0.9,
                                   name="prompts"))
            fig.update_layout(xaxis=_axis("messages dropped per prompt (messages)"), yaxis=_axis("prompts (count)"))
            rows = [((f"{edges[k]}" if width == 1 else f"{edges[k]}-{edges[k + 1] - 1}"), counts[k])
                    for k in range(len(counts)) if counts[k]]
            page.chart("Messages dropped per prompt", fig, ["messages dropped", "prompts"], rows,
                       note=f"{st.messages_dropped} input messages left out of {st.prompts} prompts "
                       f"({st.trimmed} prompts trimmed).")
        else:
            page.section("Messages dropped per prompt", "<p>No input message was dropped: every prompt kept its "
                         "whole conversation.</p>")

    # largest messages
    if st.largest:
        ls = st.largest
        fig = go.Figure(go.Bar(y=[f"{e.where} [{e.index}] {e.role}" for e in ls][::-1],
                               x=[e.tokens for e in ls][::-1], orientation="h", name="tokens",
                               marker=dict(color=[_COLORS[0] if e.kept else _COLORS[3] for e in ls][::-1])))
        fig.update_layout(xaxis=_axis("tokens of the message (tokens)"), yaxis=_axis("input line and message"),
                          height=max(300, 22 * len(ls) + 80))
        rows = [(i + 1, e.tokens, e.where, e.index, e.role, "kept" if e.kept else "dropped", e.preview)
                for i, e in enumerate(ls)]
        page.chart(f"The {len(ls)} largest messages", fig,
                   ["rank", "tokens", "FILE:LINE", "message", "role", "in the prompt", "text (start)"], rows,
                   note=f"Capped at {st.top}: the largest messages of the run as sent to the model (annotated "
                   "copies included), by input line; blue kept, red dropped.")

    # repairs and failures
    for title, total, kinds, events, noun, empty in (
        ("Sanitize repairs", st.repairs, st.repair_kinds, st.repair_list, "repairs",
         "No sanitize repair: every tool-call transaction was whole."),
        ("Failed lines", st.failures, st.failure_kinds, st.failure_list, "failures", "No line failed."),
    ):
        if not total:
            page.section(title, f"<p>{_esc(empty)}</p>")
            continue
        fig = go.Figure(go.Bar(x=list(kinds), y=list(kinds.values()), name=noun))
        fig.update_layout(xaxis=_axis("kind"), yaxis=_axis(f"{noun} (count)"))
        capped = (f"<p class=\"note\">Showing the first {len(events)} of {total} {noun} (the list is capped at "
                  f"{st.cap}).</p>" if len(events) < total else "")
        listing = capped + _table(["FILE:LINE", "kind", "detail"], [(e.where, e.kind, e.detail) for e in events])
        page.chart(f"{title} by kind", fig, ["kind", noun], list(kinds.items()), after=listing,
                   note=f"{total} {noun} in all.")

    # time
    phases = [(k, v) for k, v in st.phases.items() if v > 0]
    if phases:
        from .run_stats import PHASES

        what = dict(PHASES)
        fig = go.Figure(go.Bar(y=[k for k, _ in phases][::-1], x=[v for _, v in phases][::-1], orientation="h",
                               name="seconds"))
        fig.update_layout(xaxis=_axis("time (s)"), yaxis=_axis("phase"), height=280)
        total = sum(v for _, v in phases)
        rows = [(k, round(v, 3), round(100 * v / total, 1) if total else 0.0, what.get(k, "")) for k, v in phases]
        page.chart("Where the time went", fig, ["phase", "seconds", "share (%)", "what"], rows,
                   note=f"Wall time {st.seconds:.2f} s; the phases cover {total:.2f} s of it (the rest is startup: "
                   "loading the tokenizer and the builder).")
    return page.html()


# -- a replay, turn by turn -------------------------------------------------------------------


def turns_report_html(stats: Any, turns: Optional[Sequence[Any]] = None, *, budget: Optional[int] = None,
                      title: str = "prompt per model call", cap: int = 2000) -> str:
    """The page of consecutive prompts: ``stats`` is a
    :class:`~jianmu_fast.prefix_cache.PrefixCacheStats` (its ``per_turn`` records), ``turns``
    optional :class:`~jianmu_fast.replay.ReplayTurn` records (the first kept message and what
    each stage removed) for the same prompts."""
    go = require_plotly()
    per = list(stats.per_turn)
    page = _Page(f"jianmu-fast replay: {title}")
    page.headline([
        ("turns", "model-call turns", stats.turns),
        ("prefix_hits", "turns whose prompt starts with the whole previous one", stats.prefix_hits),
        ("prefix_hit_rate", "prefix hit rate (%)", f"{100 * stats.prefix_hit_rate:.1f}"),
        ("total_tokens", "tokens of all prompts", stats.total_tokens),
        ("cached_tokens", "tokens a prefix cache could serve", stats.cached_tokens),
        ("cached_token_share", "cached token share (%)", f"{100 * stats.cached_token_share:.1f}"),
        ("mean_prompt_tokens", "mean prompt (tokens)", f"{stats.mean_prompt_tokens:.1f}"),
    ], info=f"budget {budget} tokens" if budget is not None else "no budget given")
    if not per:
        page.section("Prompt size per turn", "<p>No turn: nothing to show.</p>")
        return page.html()
    x = [t.turn for t in per]
    tools = [getattr(turns[k], "tools_tokens", 0) for k in range(len(per))] if turns else [0] * len(per)
    fig = go.Figure([
        go.Scatter(x=x, y=[t.prompt_tokens + tools[k] for k, t in enumerate(per)], mode="lines+markers",
                   name="prompt (with the request's tools)"),
        go.Scatter(x=x, y=[t.cached_tokens for t in per], mode="lines+markers", name="served by a prefix cache"),
    ])
    if budget is not None:
        fig.add_hline(y=budget, line=dict(color="#E45756", dash="dash", width=2))
        fig.add_annotation(x=1, xref="paper", y=budget, text=f"budget {budget}", showarrow=False, xanchor="right",
                           yanchor="bottom", font=dict(color="#E45756"))
    fig.update_layout(xaxis=_axis("model-call turn (number)"), yaxis=_axis("tokens"))
    shown = per[:cap]
    headers = ["turn", "history messages", "prompt messages", "prompt tokens", "tools tokens", "cached tokens",
               "prefix hit"]
    rows: list[list[Any]] = []
    for k, t in enumerate(shown):
        rows.append([t.turn, getattr(turns[k], "history", "") if turns else "", t.messages, t.prompt_tokens,
                     tools[k], t.cached_tokens, "yes" if t.prefix_hit else ("first" if k == 0 else "no")])
    stage_names: list[str] = []
    if turns:
        for t in turns:
            for name, _m, _t in t.removed:
                if name not in stage_names:
                    stage_names.append(name)
        headers += ["first kept message"] + [f"{n} removed (msgs/tokens)" for n in stage_names]
        for k, row in enumerate(rows):
            r = turns[k]
            removed = {name: (m, tk) for name, m, tk in r.removed}
            row.append("" if r.first_kept is None else r.first_kept)
            row.extend(f"{removed[n][0]} / {removed[n][1]}" if n in removed else "" for n in stage_names)
    capped = (f"<p class=\"note\">Showing the first {cap} of {len(per)} turns.</p>" if len(per) > cap else "")
    page.chart("Prompt size per turn", fig, headers, rows, after=capped,
               note="Tokens of each model call's prompt (the request's tools included) and the tokens of its "
               "longest common message prefix with the previous prompt (what a provider's prefix cache could "
               "serve).")
    if turns:
        fig = go.Figure(go.Scatter(x=x, y=[t.first_kept for t in turns], mode="lines+markers",
                                   name="first kept message", line=dict(shape="hv")))
        fig.update_layout(xaxis=_axis("model-call turn (number)"),
                          yaxis=_axis("first kept history message (position in the conversation)"))
        page.chart("Where the window starts", fig, ["turn", "history messages", "first kept message"],
                   [(t.turn, t.history, "" if t.first_kept is None else t.first_kept) for t in turns[:cap]],
                   note="The position (in the conversation's messages) of the oldest non-pinned message each "
                   "prompt kept; a step is the window moving.")
        if any(tk for t in turns for _n, _m, tk in t.removed):
            fig = go.Figure([go.Bar(x=x, y=[dict((n, tk) for n, _m, tk in t.removed).get(name, 0) for t in turns],
                                    name=name) for name in stage_names])
            fig.update_layout(barmode="stack", xaxis=_axis("model-call turn (number)"),
                              yaxis=_axis("tokens removed (tokens)"))
            page.chart("What each stage removed", fig, ["turn", *[f"{n} (tokens)" for n in stage_names]],
                       [(t.turn, *[dict((n, tk) for n, _m, tk in t.removed).get(name, 0) for name in stage_names])
                        for t in turns[:cap]])
        else:
            page.section("What each stage removed", "<p>No stage removed anything: every prompt held its whole "
                         "history.</p>")
    else:
        page.section("What each stage removed", "<p>Not recorded: these prompts were given to prefix_cache_stats "
                     "ready-made (jianmu-fast replay or jianmu_fast.replay.replay record each stage).</p>")
    return page.html()


# -- one prompt ---------------------------------------------------------------------------------


def build_report_html(report: Any) -> str:
    """The page of one :class:`~jianmu_fast.memory.context.report.BuildReport`: every message
    the providers gave, in order, kept or dropped, with its section and token count."""
    go = require_plotly()
    from .run_stats import message_preview

    counter = report.counter
    provided = list(getattr(report, "provided_messages", []) or [])
    sections = list(getattr(report, "provided_sections", []) or [])
    names = {p.index: p.name for p in report.providers}
    kept = {m.id for m in report.messages}
    page = _Page("jianmu_fast build_report: one prompt")
    n_kept = sum(1 for m in provided if m.id in kept)
    page.headline([
        ("messages_provided", "messages provided", len(provided)),
        ("messages_kept", "messages kept", n_kept),
        ("messages_dropped", "messages dropped", len(provided) - n_kept),
        ("provided_tokens", "tokens provided (request as billed)", report.provided_tokens),
        ("total_tokens", "tokens sent (request as billed)", report.total_tokens),
        ("tools_tokens", "tokens of the request's tools", report.tools_tokens),
    ], info=f"error: {report.error}" if report.error is not None else "")
    per_kept: dict[str, int] = {}
    per_dropped: dict[str, int] = {}
    rows = []
    for pos, (m, s) in enumerate(zip(provided, sections)):
        label = f"providers[{s}] {names.get(s, '?')}"
        c = int(counter.count_message(m)) if counter is not None else 0
        is_kept = m.id in kept
        (per_kept if is_kept else per_dropped)[label] = (per_kept if is_kept else per_dropped).get(label, 0) + c
        rows.append((pos, label, m.role, c, "kept" if is_kept else "dropped", message_preview(m)))
    labels = list(dict.fromkeys([*per_kept, *per_dropped]))
    if labels:
        fig = go.Figure([go.Bar(x=labels, y=[per_kept.get(k, 0) for k in labels], name="kept"),
                         go.Bar(x=labels, y=[per_dropped.get(k, 0) for k in labels], name="dropped")])
        fig.update_layout(barmode="stack", xaxis=_axis("section (provider)"), yaxis=_axis("tokens"))
        page.chart("Tokens per section, kept and dropped", fig, ["section", "kept (tokens)", "dropped (tokens)"],
                   [(k, per_kept.get(k, 0), per_dropped.get(k, 0)) for k in labels])
    else:
        page.section("Tokens per section, kept and dropped", "<p>The providers gave no message.</p>")
    stages = [(s.name if s.index < 0 else f"filters[{s.index}] {s.name}", s.messages_in, s.messages_out,
               s.dropped_messages, s.dropped_tokens, "failed" if s.failed else "") for s in report.stages]
    page.section("Stages", _table(["stage", "messages in", "messages out", "dropped", "dropped (tokens)", ""],
                                  stages) if stages else "<p>No filter stage.</p>")
    page.section("Every message, in order", _table(["position", "section", "role", "tokens", "in the prompt",
                                                    "text (start)"], rows),
                 note="Each message the providers gave, in prompt order; tokens by the report's counter "
                 "(per message, without the request's fixed cost).")
    return page.html()


# -- a batch ----------------------------------------------------------------------------------


def batch_report_html(report: Any, counter: Any = None, *, cap: int = 50) -> str:
    """The page of a :class:`~jianmu_fast.batch.BatchReport`: prompt sizes (by ``counter``,
    default ``SimpleTokenCounter()``), messages per prompt, and the failures by state index."""
    go = require_plotly()
    from .run_stats import failure_kind

    if counter is None:
        from .memory.context import SimpleTokenCounter

        counter = SimpleTokenCounter()
    prompts = [p for p in report.prompts if p is not None]
    sizes = [int(counter.count_messages(p)) for p in prompts]
    lengths = [len(p) for p in prompts]
    page = _Page("jianmu_fast build_batch_report")
    page.headline([
        ("states", "states", len(report.prompts)),
        ("prompts", "prompts built", len(prompts)),
        ("failures", "states failed", len(report.failures)),
        ("tokens", "tokens of all prompts", sum(sizes)),
        ("messages", "messages of all prompts", sum(lengths)),
    ], info=f"tokens counted by {counter!r}")
    for title, values, axis in (("Prompt sizes", sizes, "prompt size (tokens)"),
                                ("Messages per prompt", lengths, "messages per prompt (messages)")):
        if not values:
            page.section(title, "<p>No prompt was built: nothing to show.</p>")
            continue
        edges, (counts,) = _histogram([values], 30)
        width = edges[1] - edges[0]
        fig = go.Figure(go.Bar(x=[e + width / 2 for e in edges[:-1]], y=counts, width=width, name="prompts"))
        fig.update_layout(xaxis=_axis(axis), yaxis=_axis("prompts (count)"))
        page.chart(title, fig, ["from", "to", "prompts"],
                   [(edges[k], edges[k + 1] - 1, counts[k]) for k in range(len(counts)) if counts[k]])
    if report.failures:
        kinds: dict[str, int] = {}
        for f in report.failures:
            k = failure_kind(f.reason)
            kinds[k] = kinds.get(k, 0) + 1
        fig = go.Figure(go.Bar(x=list(kinds), y=list(kinds.values()), name="failures"))
        fig.update_layout(xaxis=_axis("kind"), yaxis=_axis("failures (count)"))
        shown = report.failures[:cap]
        capped = (f"<p class=\"note\">Showing the first {cap} of {len(report.failures)} failures.</p>"
                  if len(report.failures) > cap else "")
        page.chart("Failures by kind", fig, ["kind", "failures"], list(kinds.items()),
                   after=capped + _table(["state", "kind", "reason"],
                                         [(f"states[{f.index}]", failure_kind(f.reason), f.reason) for f in shown]))
    else:
        page.section("Failures by kind", "<p>No state failed.</p>")
    return page.html()
