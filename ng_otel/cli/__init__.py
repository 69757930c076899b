"""``ng-otel``: the command line.

ng-otel demo                   run the example Gym stack and print its failure chains
ng-otel replay rows.jsonl      saved rollout rows -> telemetry through the OTEL_* exporters
ng-otel receive [--out FILE]   a local OTLP receiver: your servers' failure chains as they arrive
ng-otel show FILE              rows or OTLP JSON lines as failure-chain trees
ng-otel summary FILE...        what failed, where and why: counts by kind, boundary, class, root
ng-otel report FILE... -o F    the summary as one self-contained HTML page of charts and trees
ng-otel kinds [--check FILE]   the shared vocabulary; unregistered or malformed kinds in a file
ng-otel doctor                 what ng_otel would do with this environment, and whether it gets anywhere
"""

from __future__ import annotations

import argparse
import logging
import reprlib
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ng_otel.contract import kinds as kinds_module
from ng_otel.contract.kinds import FAILURE_KINDS, is_namespaced, is_registered, is_well_formed
from ng_otel.contract.records import ROW_EVENTS
from ng_otel.contract.rows import ROW_FAILURE_CLASS, SkippedLine, has_saved_report, read_row
from ng_otel.otel import names

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ng-otel", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the example Gym stack and print its failure chains")
    demo.add_argument("--out", type=Path, default=Path("ng-otel-demo"), help="where rows, telemetry and logs go")
    replay = commands.add_parser("replay", help="saved rollout rows -> telemetry through the OTEL_* exporters")
    replay.add_argument("file", type=Path)
    replay.add_argument("--count", action="store_true", help="add them to ng.failures (a backend that missed the run)")
    replay.add_argument("--timeout", type=float, metavar="SECONDS", help="the final flush may take (default 30)")
    replay.add_argument(
        "--include-live", action="store_true", help="export again what the live run exported (another backend)"
    )
    receive = commands.add_parser("receive", help="a local OTLP receiver: failure chains as they arrive")
    receive.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    receive.add_argument("--grpc-port", type=int, default=4317, help="default 4317; 0 picks a free port")
    receive.add_argument("--http-port", type=int, default=4318, help="default 4318; 0 picks a free port")
    receive.add_argument("--out", type=Path, metavar="FILE", help="append every request as an OTLP JSON line")
    show_parser = commands.add_parser("show", help="rows or OTLP JSON lines as failure-chain trees")
    show_parser.add_argument("file", type=Path, nargs="+")
    show_parser.add_argument("--kind", help="only chains with an event of this failure_kind")
    show_parser.add_argument("--boundary", help="only chains with an event at this boundary")
    show_parser.add_argument("--limit", type=_at_least_zero, metavar="N", help="show at most N chain groups per file")
    show_parser.add_argument("--full-ids", action="store_true", help="whole event ids (what Jaeger searches)")
    summary = commands.add_parser("summary", help="what failed, where and why, in rows or OTLP JSON lines")
    summary.add_argument("files", type=Path, nargs="+", metavar="FILE")
    summary.add_argument("--json", action="store_true", help="one JSON object on stdout")
    report = commands.add_parser("report", help="the summary as one self-contained HTML page")
    report.add_argument("files", type=Path, nargs="+", metavar="FILE")
    report.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html")
    commands.add_parser("doctor", help="what ng_otel would do here: settings, providers, exporters (exit 1: nowhere)")
    kinds = commands.add_parser("kinds", help="the shared failure-kind vocabulary")
    kinds.add_argument(
        "--check",
        type=Path,
        metavar="FILE",
        help="list unregistered or malformed kinds in rows or OTLP JSON lines, and lines it could not check (exit 1)",
    )
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    kind_warnings = logging.getLogger(kinds_module.__name__)
    level = kind_warnings.level
    if args.command in ("show", "summary", "report", "kinds"):
        # They show every kind a file holds: a warning on stderr for each unregistered one
        # (up to 1,024) would only repeat them.
        kind_warnings.setLevel(logging.ERROR)
    try:
        if args.command == "demo":
            from ng_otel.cli.demo import run_demo

            return run_demo(args.out, console)
        if args.command == "replay":
            from ng_otel.cli.replay import replay_file

            return replay_file(
                args.file, console, count=args.count, include_live=args.include_live, flush_seconds=args.timeout
            )
        if args.command == "receive":
            from ng_otel.cli.receive import run_receive

            return run_receive(args.host, args.grpc_port, args.http_port, args.out, console)
        if args.command == "show":
            from ng_otel.cli.show import show_paths

            return show_paths(
                args.file, console, kind=args.kind, boundary=args.boundary, limit=args.limit, full_ids=args.full_ids
            )
        if args.command in ("summary", "report"):
            from ng_otel.cli.summary import summary_command

            if args.command == "report":
                from ng_otel.cli.report import report_problem

                problem = report_problem(args.output, args.files)
                if problem is not None:
                    return usage_error(problem)
            return summary_command(args, console)
        if args.command == "doctor":
            from ng_otel.cli.doctor import run_doctor

            return run_doctor(console)
        return show_kinds(console, args.check)
    except OSError as error:  # a missing file, a folder, no permission: one line, no traceback
        problem = _os_problem(error)
        return usage_error(problem if error.filename is None else f"{error.filename}: {problem}")
    except KeyboardInterrupt:
        return EXIT_FAILED
    finally:
        kind_warnings.setLevel(level)  # main() may run in a caller's process (tests do)


def usage_error(message: str) -> int:
    """``message`` as one line on stderr, control characters replaced; the usage exit status."""
    from ng_otel.cli.show import clean

    sys.stderr.write(f"ng-otel: {clean(message, 1000)}\n")
    sys.stderr.flush()
    return EXIT_USAGE


def _os_problem(error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return "no such file"
    if isinstance(error, IsADirectoryError):
        return "is a folder, not a file"
    return error.strerror or str(error)


def _at_least_zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, not {text!r}")
    return value


def show_kinds(console: Console, check: Path | None) -> int:
    if check is None:
        table = Table("failure_kind", "domain", title=f"{len(FAILURE_KINDS)} shared failure kinds")
        for kind in sorted(FAILURE_KINDS):
            table.add_row(kind, kind.split("_", 1)[0])
        console.print(table)
        console.print("An environment's own kind is namespaced: <server>:<kind>.")
        return EXIT_OK
    from ng_otel.cli.show import printable

    found = KindCheck()
    found.read(check, console)
    if found.kinds:
        table = Table("failure_kind", "problem", "count", "first line", title="failure kinds to fix")
        for (kind, problem), count in found.kinds.most_common():
            table.add_row(printable(kind, 80), problem, str(count), str(found.first_line[kind, problem]))
        console.print(table)
        if any(problem == MALFORMED for _, problem in found.kinds):
            console.print(f"{MALFORMED}: not <domain>_<condition> or <server>:<kind>; no backend can label it")
    for line in found.skipped:
        console.print(f"[red]line {line.line}: skipped: {printable(line.reason, 200)}[/red]")
    if found.skipped_count > len(found.skipped):
        console.print(f"[red]... and {found.skipped_count - len(found.skipped)} more skipped line(s)[/red]")
    if found.skipped_count:
        console.print(f"{found.skipped_count} line(s) of {printable(str(check), 500)} could not be checked")
    if found.kinds or found.skipped_count:
        return EXIT_FAILED
    console.print(f"every failure_kind in {printable(str(check), 500)} is registered or namespaced")
    return EXIT_OK


UNREGISTERED, MALFORMED = "unregistered", "malformed"
MAX_LISTED_KINDS = 1000  # distinct bad kinds listed by name, as summary keeps its figures


class KindCheck:
    """The failure kinds of one file of rows or OTLP JSON lines that are not registered or
    namespaced, by (kind, problem), and the lines that could not be checked."""

    def __init__(self) -> None:
        self.kinds: Counter[tuple[str, str]] = Counter()
        self.first_line: dict[tuple[str, str], int] = {}
        self.skipped: list[SkippedLine] = []  # the first MAX_LISTED_BAD
        self.skipped_count = 0
        self._counted_ids: set[str] = set()  # an OTLP event may come twice: a log record, a retried export

    def read(self, path: Path, console: Console) -> None:
        from ng_otel.cli.show import FileFormat, scan_file

        file_format = FileFormat()  # the first JSON object decides, as in show, replay and summary
        for number, value in scan_file(path, console, "checking"):
            if isinstance(value, SkippedLine):
                self.skip(value)
                continue
            misfit = file_format.misfit(value)
            if misfit is not None:
                self.skip(SkippedLine(number, misfit))
            elif file_format.otlp:
                self._otlp_line(number, value)
            else:
                self._row(number, value)

    def skip(self, line: SkippedLine) -> None:
        from ng_otel.cli.show import MAX_LISTED_BAD

        self.skipped_count += 1
        if len(self.skipped) < MAX_LISTED_BAD:
            self.skipped.append(line)

    def _row(self, number: int, row: Any) -> None:
        try:
            report = read_row(row)
        except ValueError as error:
            # The kinds a row that does not validate names are still checked; a line whose
            # problem is not a malformed kind could hide any kind, so it is reported too.
            if MALFORMED not in {self._check(number, kind) for kind in _saved_kinds(row)}:
                self.skip(SkippedLine(number, str(error)))
            return
        for record in report.events.values() if report is not None else ():
            self._check(number, record["failure_kind"])

    def _otlp_line(self, number: int, data: dict[str, Any]) -> None:
        from ng_otel.cli.show import otlp_line_failures

        failures, skipped = otlp_line_failures(number, data, set())
        if skipped is not None:  # a malformed kind among its events: show and summary skip it too
            self.skip(skipped)
        for _, attributes, _ in failures:
            if attributes[names.ID] not in self._counted_ids:
                if self._check(number, attributes[names.KIND]) is not None:
                    self._counted_ids.add(attributes[names.ID])

    def _check(self, number: int, kind: Any) -> str | None:
        """Count ``kind`` when it is not registered or namespaced; its problem, or ``None``."""
        if is_registered(kind) or is_namespaced(kind):
            return None
        problem = UNREGISTERED if is_well_formed(kind) else MALFORMED
        key = (kind if isinstance(kind, str) else reprlib.repr(kind), problem)
        if key not in self.kinds and len(self.kinds) >= MAX_LISTED_KINDS:
            key = (names.OTHER_KIND, problem)  # a file of endless distinct kinds: memory stays flat
        self.kinds[key] += 1
        self.first_line.setdefault(key, number)
        return problem


def _saved_kinds(row: Any) -> list[Any]:
    """The failure kinds a row names, read as ``row_report`` reads them but without validating
    anything: a saved report's events' kinds (the report wins), else 0.7.0's class."""
    if not isinstance(row, dict):
        return []
    if has_saved_report(row):
        events = row.get(ROW_EVENTS)
        records = events.values() if isinstance(events, dict) else ()
        return [record["failure_kind"] for record in records if isinstance(record, dict) and "failure_kind" in record]
    return [row[ROW_FAILURE_CLASS]] if ROW_FAILURE_CLASS in row else []
