"""``ng-otel report``: the summary as one self-contained HTML page that opens with no network.

The charts are drawn by plotly.js, read at report time from the installed ``plotly`` package
(the ``report`` extra) and inlined, so the page needs nothing but a browser. Every figure is
the summary's own; every text from a file is escaped, in the page and in chart labels.
"""

from __future__ import annotations

import datetime
import html
import importlib.util
import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, Final

import orjson
from rich.console import Console

from ng_otel.cli._exit import usage_error
from ng_otel.cli._text import printable
from ng_otel.cli.summary import summarise_files
from ng_otel.otel import names
from ng_otel.runs.coverage import ACCOUNT_KEYS
from ng_otel.runs.summary import NO_SERVER, NO_STAGE, Chain, Summary

TOP_CHAINS: Final = 10
MAX_BARS: Final = 40  # kinds on one axis; the rest are summed as `_other`
CHART_IDS: Final = ("by-kind", "by-class", "root-kinds", "masked", "by-stage", "over-time")


def plotly_js() -> str | None:
    """plotly.js as the installed ``plotly`` package ships it, or ``None`` without it."""
    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        return None


def report_command(args: Any, console: Console) -> int:
    """``ng-otel report``: the summary of ``args.files`` written to ``args.output``."""
    problem = report_problem(args.output, args.files)
    if problem is not None:
        return usage_error(problem)
    return write_report(summarise_files(args.files, console, args.min_valid), args.output, console)


def write_report(summary: Summary, output: Path, console: Console) -> int:
    script = plotly_js()
    if script is None:
        return usage_error(_no_plotly_message())
    page = render_page(summary, script)
    try:
        output.write_text(page, encoding="utf-8")
    except OSError as error:
        return usage_error(f"cannot write {output}: {error.strerror or error}")
    charts = len(charts_of(summary))
    console.print(
        f"report: {printable(str(output), 500)} ({charts} charts, {len(summary.top_chains(TOP_CHAINS))} chains)"
    )
    return 0


def report_problem(output: Path, inputs: Iterable[Path]) -> str | None:
    """Why no report can be written, found before the files are read: no plotly, or ``output``
    is one of the ``inputs`` (under any name: a link, a relative path); or ``None``."""
    if importlib.util.find_spec("plotly") is None:
        return _no_plotly_message()
    for path in inputs:
        try:
            if os.path.samefile(output, path):
                return f"cannot write {output}: it is the input {path} (choose another -o)"
        except OSError:  # either is missing: not the same file
            continue
    return None


def _no_plotly_message() -> str:  # built when asked: it names this installation
    from ng_otel.cli._install import install_hint

    return f"report needs plotly to draw its charts: {install_hint('report')}"


def _label(text: Any) -> str:
    # plotly reads a few HTML tags in labels (<a href>, <br>): no tag from a file gets through.
    return (
        str(text)
        .replace("<", "\N{SINGLE LEFT-POINTING ANGLE QUOTATION MARK}")
        .replace(">", "\N{SINGLE RIGHT-POINTING ANGLE QUOTATION MARK}")
    )


def _top(counts: Any, limit: int = MAX_BARS) -> list[tuple[Any, int]]:
    ranked = counts.most_common()
    if len(ranked) <= limit:
        return list(ranked)
    return [*ranked[: limit - 1], (names.OTHER_KIND, sum(count for _, count in ranked[limit - 1 :]))]


def charts_of(summary: Summary) -> dict[str, dict[str, Any]]:
    """Plotly figures (data and layout) by chart id; a chart with nothing to draw is left out."""
    s = summary
    charts: dict[str, dict[str, Any]] = {}
    bar_layout = {"barmode": "stack", "margin": {"b": 140}, "legend": {"title": {"text": "boundary"}}}
    if s.events:
        kinds = [kind for kind, _ in _top(s.by_kind)]
        charts["by-kind"] = {
            "title": "Failures by kind and boundary",
            "data": [
                {
                    "type": "bar",
                    "name": _label(boundary),
                    "x": [_label(kind) for kind in kinds],
                    "y": [s.kind_boundary.get((kind, boundary), 0) for kind in kinds],
                }
                for boundary, _ in s.by_boundary.most_common()
            ],
            "layout": bar_layout,
        }
        classes = s.by_class.most_common()
        charts["by-class"] = {
            "title": "INFRA vs DATA",
            "data": [
                {
                    "type": "pie",
                    "hole": 0.45,
                    "labels": [_label(name).upper() for name, _ in classes],
                    "values": [count for _, count in classes],
                    "sort": False,
                }
            ],
            "layout": {},
        }
        stages = _top(s.by_stage)
        charts["by-stage"] = {
            "title": "Failures by stage",
            "data": [
                {
                    "type": "bar",
                    "x": [_label(stage) for stage, _ in stages],
                    "y": [count for _, count in stages],
                    "marker": {"color": ["#bbbbbb" if stage == NO_STAGE else "#4c78a8" for stage, _ in stages]},
                }
            ],
            "layout": {},
        }
    if s.failed_rows:
        roots = _top(s.root_kinds)[::-1]  # horizontal bars: the largest on top
        charts["root-kinds"] = {
            "title": "Root causes, ranked (one per failed row)",
            "data": [
                {
                    "type": "bar",
                    "orientation": "h",
                    "y": [_label(kind) for kind, _ in roots],
                    "x": [count for _, count in roots],
                }
            ],
            "layout": {"margin": {"l": 220}},
        }
    whole, of = (s.rows, "rows") if s.rows else (s.verify_outcomes or 0, "verify outcomes")
    if whole:
        charts["masked"] = {
            "title": f"Masked share of {of}",
            "data": [
                {
                    "type": "pie",
                    "hole": 0.45,
                    "labels": ["masked", "not masked"],
                    "values": [s.masked, max(0, whole - s.masked)],
                    "sort": False,
                }
            ],
            "layout": {},
        }
    times = [(when, count) for minute, count in _every_minute(s.over_time) if (when := _minute_text(minute))]
    if len(times) > 1:
        charts["over-time"] = {
            "title": "Failures over the run (per minute)",
            "data": [
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "x": [when for when, _ in times],
                    "y": [count for _, count in times],
                }
            ],
            "layout": {},
        }
    for chart in charts.values():
        chart["layout"] = {"title": {"text": chart.pop("title")}, "height": 420, **chart["layout"]}
    return charts


_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
MAX_MINUTES_DRAWN: Final = 10_080  # a week of minutes: past it, only the minutes with failures are drawn


def _every_minute(over_time: Any) -> list[tuple[Any, int]]:
    """Each minute from the first failure to the last, a quiet one as zero, so the line does
    not join two failing minutes as if failures kept going between them."""
    minutes = sorted(minute for minute in over_time if isinstance(minute, int))
    if not minutes or minutes[-1] - minutes[0] >= MAX_MINUTES_DRAWN:
        return [(minute, over_time[minute]) for minute in minutes]
    return [(minute, over_time.get(minute, 0)) for minute in range(minutes[0], minutes[-1] + 1)]


def _minute_text(minute: Any) -> str | None:
    """A unix minute as an ISO date, or ``None`` for one no date can show (an event time past
    year 9999 or before year 1, or the ``_other`` of a full table)."""
    if not isinstance(minute, int):
        return None
    try:
        return (_EPOCH + datetime.timedelta(minutes=minute)).isoformat()
    except OverflowError:
        return None


def _chain_html(chain: Chain, count: int, failed: int) -> str:
    share = f"{100 * count / failed:.1f}%" if failed else ""
    nested = ""
    for kind, boundary, server in reversed(chain):  # built from the root up: each cause inside its effect
        where = boundary if server == NO_SERVER else f"{boundary} · {server}"
        node = f'<span class="kind">{html.escape(kind)}</span> <span class="boundary">{html.escape(where)}</span>'
        nested = f"<li>{node}{f'<ul>{nested}</ul>' if nested else ''}</li>"
    return f'<div class="chain"><div class="count">{count:,} rows · {share}</div><ul class="tree">{nested}</ul></div>'


def _root_causes_html(summary: Summary) -> str:
    rows = "".join(
        f'<tr><td class="kind">{html.escape(kind)}</td><td>{html.escape(server)}</td>'
        f"<td>{html.escape(reason)}</td><td>{count:,}</td></tr>"
        for (kind, server, reason), count in summary.top_root_causes(TOP_CHAINS)
    )
    if not rows:
        return ""
    return f"<table><tr><th>root kind</th><th>server</th><th>reason</th><th>failed rows</th></tr>{rows}</table>"


def _coverage_html(summary: Summary) -> str:
    coverage = summary.coverage_total()
    if coverage is None:
        return ""
    head = "".join(f"<th>{key}</th>" for key in ACCOUNT_KEYS)

    def row(name: str, account: dict[str, int | None]) -> str:
        cells = "".join(f"<td>{'-' if account[key] is None else f'{account[key]:,}'}</td>" for key in ACCOUNT_KEYS)
        return f"<tr><td>{html.escape(name)}</td>{cells}</tr>"

    body = "".join(row(agent, account) for agent, account in coverage["coverage_by_agent"].items())
    body += row("total", coverage["coverage"])
    unknown = coverage["unknown_rollouts"]
    if unknown is None:
        missing = "<p>No materialized inputs beside the rows: expected and unknown are not known.</p>"
    else:
        listed = "".join(
            f"<li>{html.escape(str(item['run']))}: task {html.escape(str(item['task_index']))} rollout "
            f"{html.escape(str(item['rollout_index']))}</li>"
            for item in unknown
        )
        missing = f"<p>{coverage['unknown_count']:,} rollout(s) never finished</p><ul>{listed}</ul>" if listed else ""
    groups = "".join(
        f"<li>task {html.escape(str(group['task_index']))}: {group['valid']} valid of {group['size']}</li>"
        for group in coverage["groups_below_min_valid"]
    )
    short = (
        f"<p>{coverage['groups_below_count']:,} prompt group(s) with fewer than {coverage['min_valid']} valid "
        f"(measured, unmasked) members</p><ul>{groups}</ul>"
        if groups
        else ""
    )
    return (
        "<h2>Coverage: expected = measured + masked + failed + omitted + unknown</h2>"
        f"<table><tr><th>agent</th>{head}</tr>{body}</table>{missing}{short}"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } .figures { display: flex; gap: 2em; flex-wrap: wrap; }
.figure { font-size: 1.1em; } .figure b { display: block; font-size: 1.6em; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; } .chart { min-height: 420px; }
.chart.wide { grid-column: 1 / span 2; }
.chain { margin: 1em 0; } .count { color: #555; font-size: .9em; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 1.4em; }
ul.tree li { position: relative; padding: .15em 0; }
ul.tree li::before { content: "\\2514\\2500 "; position: absolute; left: -1.4em; color: #999; }
.kind { font-weight: 600; } .boundary { color: #666; font-size: .9em; }
footer { margin-top: 3em; color: #777; font-size: .85em; }
table { border-collapse: collapse; } th, td { text-align: left; padding: .2em .8em; border-bottom: 1px solid #ddd; }
"""

_DRAW = """
const charts = JSON.parse(document.getElementById("ng-charts").textContent);
for (const [id, chart] of Object.entries(charts)) {
  Plotly.newPlot(id, chart.data, chart.layout, {displaylogo: false, responsive: true})
    .then(() => document.getElementById(id).setAttribute("data-drawn", "true"));
}
"""


def _json_for_script(value: Any) -> str:
    # Inside <script>: no "</script>" or "<!--" can end or bend the element.
    return orjson.dumps(value).decode().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(summary: Summary, script: str) -> str:
    """The whole page: figures, charts, the top chains as trees, the files it came from."""
    s = summary
    charts = charts_of(s)
    figures = [
        *([("rows", s.rows)] if s.rows or not s.traces else []),
        *([("traces", s.traces)] if s.traces else []),
        ("failed rows" if s.rows or not s.traces else "failure chains", s.failed_rows),
        ("failure events", s.events),
        ("masked", s.masked),
        ("skipped lines", s.skipped),
    ]
    wide = {"by-kind", "over-time"}
    chart_divs = "".join(
        f'<div class="chart{" wide" if chart_id in wide else ""}" id="{chart_id}"></div>'
        for chart_id in CHART_IDS
        if chart_id in charts
    )
    chains = "".join(_chain_html(chain, count, s.failed_rows) for chain, count in s.top_chains(TOP_CHAINS))
    roots = _root_causes_html(s)
    coverage = _coverage_html(s)
    files = "".join(f"<li>{html.escape(path)}</li>" for path in s.files)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ng-otel report</title>
<style>{_STYLE}</style>
<script>{script}</script>
</head>
<body>
<h1>What failed, where, and why</h1>
<div class="figures">{"".join(f'<div class="figure"><b>{n:,}</b>{label}</div>' for label, n in figures)}</div>
<div class="charts">{chart_divs}</div>
<h2>Root causes (kind, server, reason), ranked</h2>
{roots or "<p>No failed rows.</p>"}
{coverage}
<h2>Most frequent chains (effect at the top, each child its cause)</h2>
{chains or "<p>No failed rows.</p>"}
<footer>ng-otel report of<ul>{files}</ul></footer>
<script type="application/json" id="ng-charts">{_json_for_script(charts)}</script>
<script>{_DRAW}</script>
</body>
</html>
"""
