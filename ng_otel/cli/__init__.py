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
import importlib
import logging
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from ng_otel.cli._exit import EXIT_FAILED, EXIT_OK, EXIT_USAGE, usage_error
from ng_otel.contract import kinds as kinds_module

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main", "usage_error"]
MIN_VALID_HELP = "list prompt groups with fewer valid (measured, unmasked) rollouts than K (default 2)"
READS_FILES = frozenset({"show", "summary", "report", "kinds"})  # they show every kind a file holds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ng-otel", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the example Gym stack and print its failure chains")
    demo.add_argument("--out", type=Path, default=Path("ng-otel-demo"), help="where rows, telemetry and logs go")
    demo.set_defaults(handler="ng_otel.cli.demo:demo_command")
    replay = commands.add_parser("replay", help="saved rollout rows -> telemetry through the OTEL_* exporters")
    replay.add_argument("file", type=Path)
    replay.add_argument("--count", action="store_true", help="add them to ng.failures (a backend that missed the run)")
    replay.add_argument("--timeout", type=float, metavar="SECONDS", help="the final flush may take (default 30)")
    replay.add_argument(
        "--include-live", action="store_true", help="export again what the live run exported (another backend)"
    )
    replay.set_defaults(handler="ng_otel.cli.replay:replay_command")
    receive = commands.add_parser("receive", help="a local OTLP receiver: failure chains as they arrive")
    receive.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    receive.add_argument("--grpc-port", type=int, default=4317, help="default 4317; 0 picks a free port")
    receive.add_argument("--http-port", type=int, default=4318, help="default 4318; 0 picks a free port")
    receive.add_argument("--out", type=Path, metavar="FILE", help="append every request as an OTLP JSON line")
    receive.set_defaults(handler="ng_otel.cli.receive:receive_command")
    show_parser = commands.add_parser("show", help="rows or OTLP JSON lines as failure-chain trees")
    show_parser.add_argument("file", type=Path, nargs="+")
    show_parser.add_argument("--kind", help="only chains with an event of this failure_kind")
    show_parser.add_argument("--boundary", help="only chains with an event at this boundary")
    show_parser.add_argument("--limit", type=_at_least_zero, metavar="N", help="show at most N chain groups per file")
    show_parser.add_argument("--full-ids", action="store_true", help="whole event ids (what Jaeger searches)")
    show_parser.set_defaults(handler="ng_otel.cli.show:show_command")
    summary = commands.add_parser("summary", help="what failed, where and why, in rows or OTLP JSON lines")
    summary.add_argument("files", type=Path, nargs="+", metavar="FILE")
    summary.add_argument("--json", action="store_true", help="one JSON object on stdout")
    summary.add_argument("--min-valid", type=_at_least_zero, default=2, metavar="K", help=MIN_VALID_HELP)
    summary.set_defaults(handler="ng_otel.cli.summary:summary_command")
    report = commands.add_parser("report", help="the summary as one self-contained HTML page")
    report.add_argument("files", type=Path, nargs="+", metavar="FILE")
    report.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html")
    report.add_argument("--min-valid", type=_at_least_zero, default=2, metavar="K", help=MIN_VALID_HELP)
    report.set_defaults(handler="ng_otel.cli.report:report_command")
    doctor = commands.add_parser(
        "doctor", help="what ng_otel would do here: settings, providers, exporters (exit 1: nowhere)"
    )
    doctor.set_defaults(handler="ng_otel.cli.doctor:doctor_command")
    kinds = commands.add_parser("kinds", help="the shared failure-kind vocabulary")
    kinds.add_argument(
        "--check",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="list unregistered or malformed kinds in rows or OTLP JSON lines, and lines it could not check (exit 1)",
    )
    kinds.set_defaults(handler="ng_otel.cli.kinds:kinds_command")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    kind_warnings = logging.getLogger(kinds_module.__name__)
    level = kind_warnings.level
    if args.command in READS_FILES:
        # They show every kind a file holds: a warning on stderr for each unregistered one
        # (up to 1,024) would only repeat them.
        kind_warnings.setLevel(logging.ERROR)
    try:
        module, name = args.handler.split(":")  # imported when run: each command loads only what it needs
        handler = getattr(importlib.import_module(module), name)
        return int(handler(args, console))
    except OSError as error:  # a missing file, a folder, no permission: one line, no traceback
        problem = _os_problem(error)
        return usage_error(problem if error.filename is None else f"{error.filename}: {problem}")
    except KeyboardInterrupt:
        return EXIT_FAILED
    finally:
        kind_warnings.setLevel(level)  # main() may run in a caller's process (tests do)


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
