"""``ng-otel kinds``: the shared vocabulary, or (``--check``) the kinds of files to fix."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ng_otel.cli._exit import EXIT_FAILED, EXIT_OK
from ng_otel.cli._progress import progress_bar
from ng_otel.cli._text import printable
from ng_otel.contract.kinds import FAILURE_KINDS
from ng_otel.runs.inputs import open_rows
from ng_otel.runs.kinds import MALFORMED, KindCheck


def kinds_command(args: object, console: Console) -> int:
    files: list[Path] | None = getattr(args, "check", None)
    return show_kinds(console, files) if files else list_kinds(console)


def list_kinds(console: Console) -> int:
    table = Table("failure_kind", "domain", title=f"{len(FAILURE_KINDS)} shared failure kinds")
    for kind in sorted(FAILURE_KINDS):
        table.add_row(kind, kind.split("_", 1)[0])
    console.print(table)
    console.print("An environment's own kind is namespaced: <server>:<kind>.")
    return EXIT_OK


def show_kinds(console: Console, files: list[Path]) -> int:
    """The kinds to fix in ``files`` (exit 1 when there are any, or lines that could not be
    checked); where each was first seen is its line, prefixed by its file when there are several."""
    for path in files:
        open_rows(path).close()  # an unreadable file is main's one line on stderr, exit 2
    found = KindCheck()
    for path in files:
        found.read(path, progress_bar(console, "checking", path.name))
    named = ", ".join(printable(str(path), 500) for path in files)
    several = len(files) > 1
    if found.kinds:
        table = Table("failure_kind", "problem", "count", "first line", title="failure kinds to fix")
        for (kind, problem), count in found.kinds.most_common():
            where, line = found.first_line[kind, problem]
            table.add_row(
                printable(kind, 80), problem, str(count), f"{printable(where, 200)}:{line}" if several else str(line)
            )
        console.print(table)
        if any(problem == MALFORMED for _, problem in found.kinds):
            console.print(f"{MALFORMED}: not <domain>_<condition> or <server>:<kind>; no backend can label it")
    for where, skipped in found.skipped.listed:
        at = f"{printable(where, 200)}:{skipped.line}" if several else f"line {skipped.line}"
        console.print(f"[red]{at}: skipped: {printable(skipped.reason, 200)}[/red]")
    if found.skipped.unlisted:
        console.print(f"[red]... and {found.skipped.unlisted} more skipped line(s)[/red]")
    if found.skipped.count:
        console.print(f"{found.skipped.count} line(s) of {named} could not be checked")
    if found.kinds or found.skipped.count:
        return EXIT_FAILED
    console.print(f"every failure_kind in {named} is registered or namespaced")
    return EXIT_OK
