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
from ng_otel.runs.inputs import open_rows
from ng_otel.runs.summary import Summary, summarise


def print_json(summary: Summary) -> None:
    sys.stdout.buffer.write(orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(summary: Summary, console: Console) -> None:
    """The terminal view: kind x boundary, INFRA vs DATA, root causes, masked share, stages."""
    s = summary
    console.print(
        f"[bold]{s.rows:,}[/bold] rows · [bold]{s.failed_rows:,}[/bold] failed · [bold]{s.events:,}[/bold] "
        f"failure events · [bold]{s.masked:,}[/bold] masked ({_share(s.masked, s.rows)} of rows) · "
        f"{s.skipped:,} skipped line(s)"
    )
    if s.events:
        boundaries = [boundary for boundary, _ in s.by_boundary.most_common()]
        table = Table(
            "failure_kind", *map(printable, boundaries), "total", "share", title="failures by kind and boundary"
        )
        for kind, total in s.by_kind.most_common():
            cells = [str(s.kind_boundary.get((kind, b), "") or "") for b in boundaries]
            table.add_row(printable(str(kind), 80), *cells, f"{total:,}", _share(total, s.events))
        console.print(table)
        console.print(_two_columns("INFRA vs DATA", "class", s.by_class, s.events))
        console.print(_two_columns("failures by stage", "stage", s.by_stage, s.events))
    if s.failed_rows:
        console.print(
            _two_columns("root causes, ranked (one per failed row)", "root kind", s.root_kinds, s.failed_rows)
        )
        chains = Table("chain (effect ← cause ← root)", "rows", title="most frequent chains")
        for chain, count in s.top_chains(5):
            chains.add_row(
                " ← ".join(f"{printable(k, 60)} [dim]{printable(b, 20)}[/dim]" for k, b in chain), f"{count:,}"
            )
        console.print(chains)
    for where, line in s.skipped_lines:
        console.print(f"[red]{printable(where, 200)}:{line.line}: skipped: {printable(line.reason, 200)}[/red]")
    if s.skipped > len(s.skipped_lines):
        console.print(f"[red]... and {s.skipped - len(s.skipped_lines):,} more skipped line(s)[/red]")


def _two_columns(title: str, label: str, counts: Counter[Any], whole: int) -> Table:
    table = Table(label, "count", "share", title=title)
    for key, count in counts.most_common():
        table.add_row(printable(str(key), 80), f"{count:,}", _share(count, whole))
    return table


def summarise_files(files: list[Path], console: Console) -> Summary:
    """``files`` summarised with a progress bar on ``console`` (exit 2 first, through main's
    one line on stderr, when one cannot be read)."""
    for path in files:
        open_rows(path).close()
    return summarise(files, lambda path: progress_bar(console, "summarising", path.name))


def summary_command(args: Any, console: Console) -> int:
    """``ng-otel summary``: exit 0 on readable files (skipped lines included), 2 with one line
    on stderr when a file cannot be read."""
    summary = summarise_files(args.files, console if not args.json else Console(stderr=True))
    if args.json:
        print_json(summary)
    else:
        render(summary, console)
    return 0
