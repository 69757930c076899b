"""``ng-otel``: the command line.

ng-otel demo                   run the example Gym stack and print its failure chains
ng-otel replay rows.jsonl      saved rollout rows -> telemetry through the OTEL_* exporters
ng-otel show FILE              rows or OTLP JSON lines as failure-chain trees
ng-otel kinds [--check FILE]   the shared vocabulary; unregistered kinds in saved rows
ng-otel doctor                 what ng_otel would do with this environment, and whether it gets anywhere
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ng_otel.contract.kinds import FAILURE_KINDS, is_namespaced, is_registered

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ng-otel", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the example Gym stack and print its failure chains")
    demo.add_argument("--out", type=Path, default=Path("ng-otel-demo"), help="where rows, telemetry and logs go")
    replay = commands.add_parser("replay", help="saved rollout rows -> telemetry through the OTEL_* exporters")
    replay.add_argument("file", type=Path)
    show_parser = commands.add_parser("show", help="rows or OTLP JSON lines as failure-chain trees")
    show_parser.add_argument("file", type=Path)
    show_parser.add_argument("--kind", help="only chains with an event of this failure_kind")
    show_parser.add_argument("--boundary", help="only chains with an event at this boundary")
    commands.add_parser("doctor", help="what ng_otel would do here: settings, providers, exporters (exit 1: nowhere)")
    kinds = commands.add_parser("kinds", help="the shared failure-kind vocabulary")
    kinds.add_argument("--check", type=Path, metavar="FILE", help="list unregistered kinds in saved rows (exit 1)")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        if args.command == "demo":
            from ng_otel.cli.demo import run_demo

            return run_demo(args.out, console)
        if args.command == "replay":
            return replay_file(args.file, console)
        if args.command == "show":
            return show_file(args.file, console, kind=args.kind, boundary=args.boundary)
        if args.command == "doctor":
            from ng_otel.cli.doctor import run_doctor

            return run_doctor(console)
        return show_kinds(console, args.check)
    except FileNotFoundError as error:
        console.print(f"[red]ng-otel: no such file: {error.filename}[/red]")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FAILED


def show_file(path: Path, console: Console, *, kind: str | None = None, boundary: str | None = None) -> int:
    from ng_otel.cli.show import BadLine, groups_from_otlp, groups_from_rows, is_otlp, read_lines, show

    with path.open(encoding="utf-8") as stream:
        lines = read_lines(stream)
        first = next(lines, None)
        if first is None:
            console.print("[dim]empty file[/dim]")
            return EXIT_OK
        everything = itertools.chain([first], lines)
        otlp = not isinstance(first[1], BadLine) and is_otlp(first[1])
        groups = groups_from_otlp(everything) if otlp else groups_from_rows(everything)
        shown, bad = show(groups, console, kind=kind, boundary=boundary)
    console.print(f"{shown} failure chain group(s) shown from {path}")
    for item in bad:
        console.print(f"[red]line {item.line}: skipped: {item.message}[/red]")
    return EXIT_OK


def replay_file(path: Path, console: Console) -> int:
    """Stream the rows through the configured exporters; memory stays flat on any size."""
    from ng_otel.cli.show import BadLine, read_lines
    from ng_otel.gym.collection import ReplaySummary, replay_row
    from ng_otel.otel.providers import enable, shutdown

    if enable("ng-otel-replay") is None:
        console.print("[red]ng-otel: telemetry is disabled (NG_OTEL_ENABLED=0 or OTEL_* misconfigured)[/red]")
        return EXIT_FAILED
    summary = ReplaySummary()
    size = path.stat().st_size
    consumed = 0

    def lines(stream: IO[bytes]) -> Iterator[str]:
        nonlocal consumed
        for raw in stream:
            consumed += len(raw)
            yield raw.decode("utf-8", errors="replace")

    with path.open("rb") as stream, _progress(console) as progress:
        task = progress.add_task("replaying", total=size or None)
        for number, row in read_lines(lines(stream)):
            if isinstance(row, BadLine):
                summary.rows += 1
                summary.skipped.append((number, row.message))
            else:
                replay_row(row, number, summary)
            if number % 1000 == 0:
                progress.update(task, completed=consumed)
        progress.update(task, completed=size)
    shutdown()
    for line, message in summary.skipped[:50]:
        console.print(f"[red]line {line}: skipped: {message}[/red]")
    if len(summary.skipped) > 50:
        console.print(f"[red]... and {len(summary.skipped) - 50} more skipped lines[/red]")
    console.print(
        f"replayed {summary.rows} rows: {summary.with_failures} with failures, "
        f"{summary.events_recorded} events exported, {len(summary.skipped)} skipped"
    )
    return EXIT_OK if not summary.skipped else EXIT_FAILED


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def show_kinds(console: Console, check: Path | None) -> int:
    if check is None:
        table = Table("failure_kind", "domain", title=f"{len(FAILURE_KINDS)} shared failure kinds")
        for kind in sorted(FAILURE_KINDS):
            table.add_row(kind, kind.split("_", 1)[0])
        console.print(table)
        console.print("An environment's own kind is namespaced: <server>:<kind>.")
        return EXIT_OK
    unregistered: Counter[str] = Counter()
    first_line: dict[str, int] = {}
    for number, kind in _kinds_in(check):
        if not is_registered(kind) and not is_namespaced(kind):
            unregistered[kind] += 1
            first_line.setdefault(kind, number)
    if not unregistered:
        console.print(f"every failure_kind in {check} is registered or namespaced")
        return EXIT_OK
    from ng_otel.cli.show import printable

    table = Table("failure_kind", "count", "first line", title="unregistered failure kinds")
    for kind, count in unregistered.most_common():
        table.add_row(printable(kind, 80), str(count), str(first_line[kind]))
    console.print(table)
    return EXIT_FAILED


def _kinds_in(path: Path) -> Iterator[tuple[int, str]]:
    from ng_otel.contract.rows import row_report

    with path.open(encoding="utf-8") as stream:
        for number, text in enumerate(stream, start=1):
            try:
                report = row_report(json.loads(text))
            except ValueError:
                continue
            for record in report.events.values() if report is not None else ():
                yield number, record["failure_kind"]
