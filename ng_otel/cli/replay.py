"""``ng-otel replay FILE``: saved rows back into telemetry, and an honest account of it.

Replayed events are not added to ``ng.failures`` unless ``--count`` asks (a backend that saw
the live run counted them then). "Exported" means what the span exporter reported as
exported: an event the exporter failed to send, that the queue dropped, that the SDK's span
limits cut, or that was still queued when the final flush ran out of time counts as failed to
export, and then the exit status is 1.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from opentelemetry import trace
from rich.console import Console

from ng_otel.cli._exit import EXIT_FAILED, EXIT_OK
from ng_otel.otel import names
from ng_otel.otel.export import LossCountingSpanExporter
from ng_otel.runs.inputs import SkippedLine, file_lines, formatted_lines, open_rows

REPLAY_FLUSH_SECONDS: Final = 30.0  # the final flush: what is not exported by then failed


class ExportTally:
    """What the span exporters ``enable()`` built reported: the ``ng.failure`` events in the
    batches they exported and in those they failed to export."""

    def __init__(self, exporters: Sequence[LossCountingSpanExporter]) -> None:
        self._exporters = tuple(exporters)

    @property
    def watching(self) -> int:
        return len(self._exporters)

    @property
    def any_failed(self) -> bool:
        return any(exporter.failed_events for exporter in self._exporters)

    def totals(self) -> tuple[int, int]:
        """(events every exporter exported, events some exporter reported failing)."""
        if not self._exporters:
            return 0, 0
        return min(e.exported_events for e in self._exporters), max(e.failed_events for e in self._exporters)


OTLP_NOT_REPLAYED: Final = "an OTLP JSON line: replay turns rows into telemetry, and a collector has these already"


def replay_file(
    path: Path,
    console: Console,
    *,
    count: bool = False,
    include_live: bool = False,
    flush_seconds: float | None = None,
) -> tuple[int, bool]:
    """Stream the rows through the configured exporters; memory stays flat on any size. The
    final flush takes at most ``flush_seconds`` (default ``REPLAY_FLUSH_SECONDS``). Returns the
    exit status and whether the flush finished."""
    from ng_otel.cli._progress import progress_bar
    from ng_otel.cli._text import printable
    from ng_otel.gym.collection import ReplaySummary, replay_row
    from ng_otel.otel.providers import enable, shutdown, span_exporters

    flush_seconds = REPLAY_FLUSH_SECONDS if flush_seconds is None else flush_seconds
    open_rows(path).close()  # a missing file or a device is a usage error before anything is set up
    if enable("ng-otel-replay") is None:
        sys.stderr.write("ng-otel: telemetry is disabled (NG_OTEL_ENABLED=0 or OTEL_* misconfigured)\n")
        return EXIT_FAILED, True
    tally = ExportTally(span_exporters())
    summary = ReplaySummary()
    pace = _Pace(tally)
    lines = 0
    unlinked_rows, first_unlinked = 0, (0, "")  # rows replayed without their unusable contexts
    try:
        for item in formatted_lines(file_lines(path, progress_bar(console, "replaying", path.name))):
            lines += 1
            if isinstance(item, SkippedLine):
                summary.skip(item.line, item.reason)
                continue
            number, value, otlp = item
            if otlp:  # an OTLP file holds no row to replay
                summary.skip(number, OTLP_NOT_REPLAYED)
                continue
            row, contexts_problem = _without_unusable_contexts(value)
            with_failures = summary.with_failures
            replay_row(row, number, summary, count=count, include_live=include_live)
            if contexts_problem is not None and summary.with_failures > with_failures:
                if not unlinked_rows:
                    first_unlinked = (number, contexts_problem)
                unlinked_rows += 1
            pace.after(summary.with_failures)
    finally:
        flushed = _within(flush_seconds, shutdown)
    exported, failed_by_exporter = tally.totals()
    not_exported = max(summary.events_recorded - exported, 0)

    for _, skipped in summary.skipped.listed:
        console.print(f"[red]line {skipped.line}: skipped: {printable(skipped.reason, 200)}[/red]")
    if summary.skipped.unlisted:
        console.print(f"[red]... and {summary.skipped.unlisted} more skipped line(s)[/red]")
    if unlinked_rows:
        line, reason = first_unlinked
        console.print(
            f"[yellow]{unlinked_rows} row(s) had {names.ROW_CONTEXTS} that could not be used (the first, line {line}: "
            f"{printable(reason, 200)}): their failures were replayed without links to the live run[/yellow]"
        )
    if not_exported:
        console.print(
            f"[red]{_why_not_exported(tally, failed_by_exporter, not_exported, flushed, flush_seconds)}[/red]"
        )
    if summary.live:
        console.print(
            f"{summary.live} event(s) were exported by the live run (their rows say where): linked to, not exported "
            "again (--include-live exports them too, for a backend that did not see the run)"
        )
    if summary.derived:
        console.print(
            f"[yellow]{summary.derived} row(s) hold no ids of the live run (collected without ng_otel): their events "
            "carry ids derived from the rows, which no live event has; where their servers ran with ng_otel, a "
            "backend that saw the run may now hold such a failure under two ids[/yellow]"
        )
    counted = "added to ng.failures" if count else "not added to ng.failures (--count adds them)"
    # A line that is not a row is no row: the rows and the skipped lines add up to the lines.
    console.print(
        f"replayed {lines - summary.skipped_rows} rows: {summary.with_failures} with failures, "
        f"{exported} events exported, {not_exported} failed to export, {summary.skipped_rows} skipped line(s); "
        f"events {counted}"
    )
    return (EXIT_OK if not summary.skipped_rows and not not_exported else EXIT_FAILED), flushed


def _without_unusable_contexts(row: Any) -> tuple[Any, str | None]:
    """``row`` and ``None``, or, when its saved span contexts (``_ng_failure_contexts``) cannot
    be read, a copy without them and why. The contexts only link a replayed event to its live
    span: a row whose contexts are bad still has its failures, so it is replayed unlinked
    rather than skipped."""
    from ng_otel.gym.collection import row_contexts

    if not isinstance(row, dict) or names.ROW_CONTEXTS not in row:
        return row, None
    try:
        row_contexts(row)
    except ValueError as error:
        return {key: value for key, value in row.items() if key != names.ROW_CONTEXTS}, str(error)
    return row, None


def _why_not_exported(tally: ExportTally, failed: int, missing: int, flushed: bool, seconds: float) -> str:
    if not tally.watching:
        return f"{missing} events not exported: no span exporter (OTEL_TRACES_EXPORTER) sends them anywhere"
    reasons = []
    if failed:
        reasons.append(f"the exporter reported {failed} as failed (is the endpoint right, the collector up?)")
    if missing > failed:
        reasons.append(
            f"{missing - failed} never reached it (dropped by the queue or the span limits"
            + ("" if flushed else f", or still queued when the {seconds:g} s flush ended")
            + ")"
        )
    return f"{missing} events not exported: " + "; ".join(reasons)


class _Pace:
    """A replay makes spans faster than any exporter sends them, and the SDK's span queue
    (``OTEL_BSP_MAX_QUEUE_SIZE``) drops what it cannot hold. So every quarter queue of rows
    with failures (a row opens one span, or a few), replay waits until the queue is sent; once
    an export has failed it waits no more (a collector that is down would cost its timeout
    each time), and what the queue then drops is reported as not exported."""

    def __init__(self, tally: ExportTally) -> None:
        try:
            queue_size = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "") or 2048)
        except ValueError:
            queue_size = 2048
        self._every = max(1, queue_size // 4)
        self._next = self._every
        self._tally = tally
        self._flush = getattr(trace.get_tracer_provider(), "force_flush", None)

    def after(self, rows_with_failures: int) -> None:
        if rows_with_failures < self._next:
            return
        self._next = rows_with_failures + self._every
        if self._flush is not None and self._tally.watching and not self._tally.any_failed:
            self._flush()


def _within(seconds: float, work: Callable[[], Any]) -> bool:
    """Run ``work`` for at most ``seconds``; whether it finished."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    threading.Thread(target=run, name="ng-otel-replay-flush", daemon=True).start()
    return done.wait(seconds)


def replay_command(args: Any, console: Console) -> int:
    code, flushed = replay_file(
        args.file, console, count=args.count, include_live=args.include_live, flush_seconds=args.timeout
    )
    if not flushed:
        # The bounded flush ran out and what it did not send is said: the SDK's own shutdown
        # at exit would wait on the held exports as long again (30 s for a metric export).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
