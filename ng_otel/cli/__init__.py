"""``ng-otel``: the command line.

ng-otel demo                   run the example Gym stack and print its failure chains
ng-otel replay rows.jsonl      saved rollout rows -> telemetry through the OTEL_* exporters
ng-otel receive [--out FILE]   a local OTLP receiver: your servers' failure chains as they arrive
ng-otel show FILE              rows or OTLP JSON lines as failure-chain trees
ng-otel summary FILE...        what failed, where and why: counts by kind, boundary, class, root
ng-otel report FILE... -o F    the summary as one self-contained HTML page of charts and trees
ng-otel kinds [--check FILE]   the shared vocabulary; unregistered kinds in saved rows
ng-otel doctor                 what ng_otel would do with this environment, and whether it gets anywhere
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ng_otel.contract.kinds import FAILURE_KINDS, is_namespaced, is_registered
from ng_otel.contract.rows import read_row

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
    kinds.add_argument("--check", type=Path, metavar="FILE", help="list unregistered kinds in saved rows (exit 1)")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        if args.command == "demo":
            from ng_otel.cli.demo import run_demo

            return run_demo(args.out, console)
        if args.command == "replay":
            from ng_otel.cli.replay import replay_file

            return replay_file(args.file, console, count=args.count, flush_seconds=args.timeout)
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
                from ng_otel.cli.report import output_problem

                problem = output_problem(args.output, args.files)
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

    unregistered: Counter[str] = Counter()
    first_line: dict[str, int] = {}
    for number, kind in _kinds_in(check, console):
        if not is_registered(kind) and not is_namespaced(kind):
            unregistered[kind] += 1
            first_line.setdefault(kind, number)
    if not unregistered:
        console.print(f"every failure_kind in {printable(str(check), 500)} is registered or namespaced")
        return EXIT_OK

    table = Table("failure_kind", "count", "first line", title="unregistered failure kinds")
    for kind, count in unregistered.most_common():
        table.add_row(printable(kind, 80), str(count), str(first_line[kind]))
    console.print(table)
    return EXIT_FAILED


def _kinds_in(path: Path, console: Console) -> Iterator[tuple[int, str]]:
    from ng_otel.cli.show import scan_file

    for number, value in scan_file(path, console, "checking"):
        try:
            report = read_row(value)
        except ValueError:
            continue
        for record in report.events.values() if report is not None else ():
            yield number, record["failure_kind"]
