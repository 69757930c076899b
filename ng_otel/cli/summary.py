"""``ng-otel summary``: the figures of ``ng_otel.runs.summary`` on the terminal or as JSON."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from ng_otel.cli._progress import progress_bar
from ng_otel.cli._text import printable
from ng_otel.runs.coverage import ACCOUNT_KEYS, DEFAULT_MIN_VALID
from ng_otel.runs.inputs import open_rows
from ng_otel.runs.summary import NO_SERVER, Summary, summarise


def print_json(summary: Summary) -> None:
    sys.stdout.buffer.write(orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def headline(summary: Summary) -> str:
    """The first line: what was read (rows, and OTLP input's traces: not rows) and what failed;
    the masked share over rows, or over OTLP's verify outcomes, which are what masking masks."""
    s = summary
    parts = []
    if s.rows or not s.traces:
        parts.append(f"[bold]{s.rows:,}[/bold] rows")
    if s.traces:
        parts.append(f"[bold]{s.traces:,}[/bold] traces")
    parts += [f"[bold]{s.failed_rows:,}[/bold] failed", f"[bold]{s.events:,}[/bold] failure events"]
    if s.rows:
        parts.append(f"[bold]{s.masked:,}[/bold] masked ({_share(s.masked, s.rows)} of rows)")
    elif s.verify_outcomes is not None:
        parts.append(f"[bold]{s.masked:,}[/bold] masked ({_share(s.masked, s.verify_outcomes)} of verify outcomes)")
    elif s.masked:
        parts.append(f"[bold]{s.masked:,}[/bold] masked")
    parts.append(f"{s.skipped:,} skipped line(s)")
    return " · ".join(parts)


def render(summary: Summary, console: Console) -> None:
    """The terminal view: kind x boundary, servers, INFRA vs DATA, root causes with their
    reasons, chains, stages, the run's coverage and its short prompt groups."""
    s = summary
    console.print(headline(s))
    for beside in s.found_beside:
        console.print(f"[dim]also read {printable(beside, 500)}: Gym writes it beside the rows named[/dim]")
    if s.events:
        boundaries = [boundary for boundary, _ in s.by_boundary.most_common()]
        table = Table(
            "failure_kind", *map(printable, boundaries), "total", "share", title="failures by kind and boundary"
        )
        for kind, total in s.by_kind.most_common():
            cells = [str(s.kind_boundary.get((kind, b), "") or "") for b in boundaries]
            table.add_row(printable(str(kind), 80), *cells, f"{total:,}", _share(total, s.events))
        console.print(table)
        console.print(_two_columns("failures by server", "server", s.by_server, s.events))
        console.print(_two_columns("INFRA vs DATA", "class", s.by_class, s.events))
        console.print(_two_columns("failures by stage", "stage", s.by_stage, s.events))
    if s.failed_rows:
        roots = Table(
            "root kind", "server", "reason", "count", "share", title="root causes, ranked (one per failed row)"
        )
        for (kind, server, reason), count in s.top_root_causes(10):
            roots.add_row(
                printable(kind, 60),
                printable(server, 40),
                printable(reason, 100),
                f"{count:,}",
                _share(count, s.failed_rows),
            )
        console.print(roots)
        chains = Table("chain (effect ← cause ← root)", "rows", title="most frequent chains")
        for chain, count in s.top_chains(5):
            chains.add_row(" ← ".join(_hop(hop) for hop in chain), f"{count:,}")
        console.print(chains)
    for title, counts in (("retry outcomes", s.retry_outcomes), ("rollout outcomes", s.rollout_outcomes)):
        if counts:  # from OTLP metrics, or ng_otel's own JSON lines with OpenTelemetry off
            console.print(_two_columns(title, "outcome", Counter(counts), sum(counts.values())))
    render_coverage(s, console)
    for where, line in s.skipped_lines:
        console.print(f"[red]{printable(where, 200)}:{line.line}: skipped: {printable(line.reason, 200)}[/red]")
    if s.skipped > len(s.skipped_lines):
        console.print(f"[red]... and {s.skipped - len(s.skipped_lines):,} more skipped line(s)[/red]")


def _hop(hop: tuple[str, str, str]) -> str:
    kind, boundary, server = hop
    where = boundary if server == NO_SERVER else f"{boundary} {server}"
    return f"{printable(kind, 60)} [dim]{printable(where, 60)}[/dim]"


def render_coverage(summary: Summary, console: Console) -> None:
    """The run's account, per agent and in total, and the rollouts no file accounts for."""
    coverage = summary.coverage_total()
    if coverage is None:
        return
    table = Table("agent", *ACCOUNT_KEYS, title="coverage: expected = measured + masked + failed + omitted + unknown")
    for agent, account in coverage["coverage_by_agent"].items():
        table.add_row(printable(agent, 60), *(_figure(account[key]) for key in ACCOUNT_KEYS))
    table.add_row("[bold]total[/bold]", *(f"[bold]{_figure(coverage['coverage'][key])}[/bold]" for key in ACCOUNT_KEYS))
    console.print(table)
    if coverage["unknown_rollouts"] is None:
        console.print("[dim]no materialized inputs beside the rows: expected and unknown are not known[/dim]")
    elif coverage["unknown_count"]:
        shown = coverage["unknown_rollouts"][:20]
        listed = ", ".join(f"task {item['task_index']} rollout {item['rollout_index']}" for item in shown)
        more = coverage["unknown_count"] - len(shown)
        console.print(
            f"[red]{coverage['unknown_count']:,} rollout(s) never finished: {printable(listed, 2000)}"
            + (f" and {more:,} more[/red]" if more else "[/red]")
        )
    if coverage["groups_below_count"]:
        groups = ", ".join(
            f"task {g['task_index']} ({g['valid']} of {g['size']})" for g in coverage["groups_below_min_valid"][:20]
        )
        console.print(
            f"[yellow]{coverage['groups_below_count']:,} prompt group(s) with fewer than {coverage['min_valid']} valid "
            f"(measured, unmasked) members: {printable(groups, 2000)}[/yellow]"
        )


def _figure(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _two_columns(title: str, label: str, counts: Counter[Any], whole: int) -> Table:
    table = Table(label, "count", "share", title=title)
    for key, count in counts.most_common():
        table.add_row(printable(str(key), 80), f"{count:,}", _share(count, whole))
    return table


def summarise_files(files: list[Path], console: Console, min_valid: int = DEFAULT_MIN_VALID) -> Summary:
    """``files`` summarised with a progress bar on ``console`` (exit 2 first, through main's
    one line on stderr, when one cannot be read)."""
    for path in files:
        open_rows(path).close()
    return summarise(files, lambda path: progress_bar(console, "summarising", path.name), min_valid=min_valid)


def summary_command(args: Any, console: Console) -> int:
    """``ng-otel summary``: exit 0 on readable files (skipped lines included), 2 with one line
    on stderr when a file cannot be read."""
    summary = summarise_files(args.files, console if not args.json else Console(stderr=True), args.min_valid)
    if args.json:
        print_json(summary)
    else:
        render(summary, console)
    return 0
