"""What failed, where, and why, over saved rows and OTLP JSON lines: the figures of
``ng-otel summary`` and ``ng-otel report``, as data.

Rows of both formats (Gym Main's saved reports, NeMo Gym 0.7.0's failure sidecar and judge
rows) are read with ``ng_otel.contract.rows``; OTLP JSON lines (what ``ng-otel demo`` and the
Collector's file exporter write) from their ``ng.failure`` span events and log records. Memory
stays flat on rows of any number; OTLP input keeps one small entry per failure event, because
a cause may be anywhere in the file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, TypeVar

from ng_otel.contract.classify import classify_failure
from ng_otel.contract.rows import class_row_failure, read_row, row_masked, row_terminal
from ng_otel.otel import names
from ng_otel.runs.inputs import SkippedLine, SkippedLines, Wrap, file_lines, formatted_lines
from ng_otel.runs.otlp import NO_TRACE_IDS, otlp_line_failures

SUMMARY_KEYS: Final = (
    "rows",
    "failed_rows",
    "events",
    "by_kind",
    "by_boundary",
    "by_class",
    "root_kinds",
    "masked",
    "skipped",
)
MAX_DISTINCT: Final = 1000
"""Distinct values one figure keeps (kinds, chains, stages); past it new ones count under
``_other``, so a file of endless distinct kinds cannot grow memory."""
MAX_CHAIN_HOPS: Final = 64  # a chain shape longer than this is cut: a shape is for grouping
NO_STAGE: Final = "(none)"

Chain = tuple[tuple[str, str], ...]  # (kind, boundary) from the effect down to its root cause
RowTally = tuple[str, str, str | None, int | None, bool]  # kind, boundary, stage, status, terminal


class _Bounded(Counter[Any]):
    """A counter that folds new keys into ``_other`` once it holds ``MAX_DISTINCT``."""

    def add(self, key: Any, count: int = 1) -> None:
        if key not in self and len(self) >= MAX_DISTINCT:
            key = names.OTHER_KIND
        self[key] += count


_Key = TypeVar("_Key")


def _held(table: dict[_Key, int], key: _Key) -> bool:
    """Count ``key`` in ``table`` when it is there or there is room; ``False`` when the table
    is full and the caller must fold the count into the figures at once."""
    if key in table:
        table[key] += 1
    elif len(table) < MAX_DISTINCT:
        table[key] = 1
    else:
        return False
    return True


class Summary:
    """The figures of one or more files, added line by line."""

    def __init__(self) -> None:
        self.rows = self.failed_rows = self.events = self.masked = 0
        self.by_kind, self.by_boundary, self.by_class = _Bounded(), _Bounded(), _Bounded()
        self.root_kinds, self.by_stage, self.kind_boundary = _Bounded(), _Bounded(), _Bounded()
        self.chains = _Bounded()
        self.over_time = _Bounded()  # unix minute -> events, for OTLP input (rows carry no time)
        self._skipped = SkippedLines()
        self.files: list[str] = []
        self._otlp: dict[str, tuple[str, str, str | None, bool]] = {}  # id -> kind, boundary, cause, recovered
        self._traces: set[str] = set()
        # Hot path: one dict entry per distinct event of a row (RowTally: classified once, by
        # finish), per distinct classified OTLP event, and per distinct (chain, root kind);
        # finish() folds them into the figures.
        self._row_tallies: dict[RowTally, int] = {}
        self._combos: dict[tuple[str, str, str | None, str], int] = {}
        self._rooted: dict[tuple[Chain, str], int] = {}

    # -- adding -------------------------------------------------------------------------

    def add_file(self, path: Path, wrap: Wrap | None = None) -> None:
        """Read one file (rows or OTLP JSON lines, as its first JSON object says)."""
        where = str(path)
        self.files.append(where)
        for item in formatted_lines(file_lines(path, wrap)):
            if isinstance(item, SkippedLine):
                self.skip(where, item)
            elif item[2]:
                self.add_otlp(item[1], item[0], where)
            else:
                self.add_line(item[1], item[0], where)

    @property
    def skipped(self) -> int:
        """Lines that were not rows or OTLP JSON lines of the file's format."""
        return self._skipped.count

    @property
    def skipped_lines(self) -> list[tuple[str, SkippedLine]]:
        """The first ``MAX_LISTED_SKIPPED`` skipped lines, with the file each is in."""
        return self._skipped.listed

    def skip(self, where: str, line: SkippedLine) -> None:
        self._skipped.add(line, where)

    def add_line(self, value: Any, number: int, where: str = "") -> None:
        """One decoded line of saved rows."""
        try:
            # A 0.7.0 failure row is counted from its keys: its derived event id is not needed.
            failure = class_row_failure(value) if isinstance(value, dict) else None
            report = read_row(value) if failure is None else None
        except ValueError as error:
            self.skip(where, SkippedLine(number, str(error)))
            return
        self.rows += 1
        if row_masked(value):
            self.masked += 1
        if failure is not None:
            self.failed_rows += 1
            kind, boundary = failure.kind, failure.boundary
            self._tally((kind, boundary, failure.stage, failure.http_status, row_terminal(value) is True))
            self._root(((kind, boundary),), kind)
            return
        if report is None:
            return
        # _ng_failure_terminal makes the row's own failure DATA (another attempt would not help).
        terminal_id = report.failure_id if row_terminal(value) else None
        tallies = self._row_tallies
        for event_id, record in report.events.items():
            get = record.get
            tally = (
                record["failure_kind"],
                record["boundary"],
                get("stage"),
                get("http_status"),
                event_id == terminal_id,
            )
            if tally in tallies:
                tallies[tally] += 1
            else:
                self._tally(tally)
        if report.failure_id is not None:
            self.failed_rows += 1
            events = report.events
            chain: list[tuple[str, str]] = []
            record = events[report.failure_id]
            while True:
                if len(chain) < MAX_CHAIN_HOPS:
                    chain.append((record["failure_kind"], record["boundary"]))
                cause = record.get("cause_id")
                if cause is None:
                    break
                record = events[cause]
            self._root(tuple(chain), record["failure_kind"])

    def _tally(self, tally: RowTally) -> None:
        if not _held(self._row_tallies, tally):
            self._fold_row_tally(tally, 1)

    def _fold_row_tally(self, tally: RowTally, count: int) -> None:
        kind, boundary, stage, status, terminal = tally
        self._fold((kind, boundary, stage, classify_failure(kind, status, terminal=terminal).value), count)

    def _root(self, chain: Chain, root_kind: str) -> None:
        if not _held(self._rooted, (chain, root_kind)):
            self.chains.add(names.OTHER_KIND)
            self.root_kinds.add(root_kind)

    def _count(self, kind: str, boundary: str, stage: str | None, failure_class: str) -> None:
        key = (kind, boundary, stage, failure_class)
        if not _held(self._combos, key):
            self._fold(key, 1)

    def _fold(self, key: tuple[str, str, str | None, str], count: int) -> None:
        kind, boundary, stage, failure_class = key
        self.events += count
        self.by_kind.add(kind, count)
        self.by_boundary.add(boundary, count)
        self.by_class.add(failure_class, count)
        self.by_stage.add(stage or NO_STAGE, count)
        self.kind_boundary.add((kind, boundary), count)

    def add_otlp(self, value: Any, number: int, where: str = "") -> None:
        """One OTLP JSON line: a trace is a row; each ``ng.failure`` event once, by id."""
        failures, skipped = otlp_line_failures(number, value, self._traces)
        if skipped is not None:
            self.skip(where, skipped)
        for trace_id, attributes, time in failures:
            event_id = str(attributes[names.ID])
            if event_id in self._otlp:
                continue  # the same event as a span event and as a log record
            if trace_id in NO_TRACE_IDS:
                self.rows += 1  # an event outside any trace is a row of its own
            else:
                self._traces.add(trace_id)  # a log record's trace is a row too (spans add theirs)
            kind, boundary = str(attributes[names.KIND]), str(attributes[names.BOUNDARY])
            status = attributes.get(names.HTTP_STATUS)
            failure_class = attributes.get(names.CLASS)
            if failure_class not in ("infra", "data"):
                failure_class = classify_failure(kind, status if isinstance(status, int) else None).value
            stage = attributes.get(names.STAGE)
            self._count(kind, boundary, str(stage) if stage is not None else None, str(failure_class))
            if attributes.get(names.VERIFY_MASKED) is True:
                self.masked += 1
            cause = attributes.get(names.CAUSE_ID)
            cause = cause if isinstance(cause, str) else None  # as show reads it: a list is no cause
            recovered = attributes.get(names.RECOVERED) is True
            self._otlp[event_id] = (kind, boundary, cause, recovered)
            if time:
                self.over_time.add(time // 60_000_000_000)

    def finish(self) -> Summary:
        """Resolve OTLP chains (a cause may come after its effect, or in another trace)."""
        self.rows += len(self._traces - NO_TRACE_IDS)
        self._traces.clear()
        causes = {cause for _, _, cause, _ in self._otlp.values() if cause is not None}
        reached: set[str] = set()
        for event_id, (*_, recovered) in self._otlp.items():
            if event_id not in causes:  # a top: the effect nothing else names as its cause
                # A recovered top is no failed reply, but its causes are reached all the same.
                self._otlp_chain(event_id, reached, counted=not recovered)
        for event_id in self._otlp:
            if event_id not in reached:  # on a cycle of causes that no top leads into
                self._otlp_chain(event_id, reached, counted=True)  # one failed row a cycle
        self._otlp.clear()
        for tally, count in self._row_tallies.items():
            self._fold_row_tally(tally, count)
        self._row_tallies.clear()
        for key, count in self._combos.items():
            self._fold(key, count)
        self._combos.clear()
        for (shape, root), count in self._rooted.items():
            self.chains.add(shape, count)
            self.root_kinds.add(root, count)
        self._rooted.clear()
        return self

    def _otlp_chain(self, event_id: str, reached: set[str], *, counted: bool) -> None:
        """Follow one OTLP event's causes down to its root (stopping where they loop), marking
        each event reached; a counted chain is one failed row."""
        kind, boundary, cause, _ = self._otlp[event_id]
        chain: list[tuple[str, str]] = [(kind, boundary)]
        reached.add(event_id)
        seen = {event_id}
        while cause is not None and cause in self._otlp and cause not in seen:
            seen.add(cause)
            reached.add(cause)
            kind, boundary, cause, _ = self._otlp[cause]
            if len(chain) < MAX_CHAIN_HOPS:
                chain.append((kind, boundary))
        if counted:
            self.failed_rows += 1
            self.root_kinds.add(kind)
            self.chains.add(tuple(chain))

    # -- output -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Exactly ``SUMMARY_KEYS``; each breakdown most frequent first."""
        return {
            "rows": self.rows,
            "failed_rows": self.failed_rows,
            "events": self.events,
            "by_kind": dict(self.by_kind.most_common()),
            "by_boundary": dict(self.by_boundary.most_common()),
            "by_class": dict(self.by_class.most_common()),
            "root_kinds": dict(self.root_kinds.most_common()),
            "masked": self.masked,
            "skipped": self.skipped,
        }

    def top_chains(self, count: int) -> list[tuple[Chain, int]]:
        return [(chain, n) for chain, n in self.chains.most_common(count) if chain != names.OTHER_KIND]


def summarise(paths: Iterable[Path], wrap: Callable[[Path], Wrap | None] | None = None) -> Summary:
    """The figures of ``paths`` together; a file named twice (a glob and its own name, say) is
    read once, so its rows are not counted twice. ``wrap(path)``: how to read each (a
    progress bar)."""
    summary = Summary()
    read: set[tuple[int, int]] = set()
    for path in paths:
        try:
            status = path.stat()
        except OSError:
            status = None  # reading it says what is wrong
        if status is not None:
            if (status.st_dev, status.st_ino) in read:
                continue
            read.add((status.st_dev, status.st_ino))
        summary.add_file(path, wrap(path) if wrap is not None else None)
    return summary.finish()
