"""The failure kinds of files of rows or OTLP JSON lines that are not registered or
namespaced (``ng-otel kinds --check``), as data."""

from __future__ import annotations

import reprlib
from collections import Counter
from pathlib import Path
from typing import Any, Final

from ng_otel.contract.kinds import is_namespaced, is_registered, is_well_formed
from ng_otel.contract.records import ROW_EVENTS
from ng_otel.contract.rows import ROW_FAILURE_CLASS, has_saved_report, read_row
from ng_otel.otel import names
from ng_otel.runs.inputs import SkippedLine, SkippedLines, Wrap, file_lines, formatted_lines
from ng_otel.runs.otlp import otlp_line_failures

UNREGISTERED: Final = "unregistered"
MALFORMED: Final = "malformed"
MAX_LISTED_KINDS: Final = 1000  # distinct bad kinds listed by name, as summary keeps its figures


class KindCheck:
    """The failure kinds of one file of rows or OTLP JSON lines that are not registered or
    namespaced, by (kind, problem), and the lines that could not be checked."""

    def __init__(self) -> None:
        self.kinds: Counter[tuple[str, str]] = Counter()
        self.first_line: dict[tuple[str, str], tuple[str, int]] = {}  # (file, line) where each was first seen
        self.skipped = SkippedLines()
        self._counted_ids: set[str] = set()  # an OTLP event may come twice: a log record, a retried export

    def read(self, path: Path, wrap: Wrap | None = None) -> None:
        """Check one file (rows or OTLP JSON lines, as its first JSON object says)."""
        where = str(path)
        for item in formatted_lines(file_lines(path, wrap)):
            if isinstance(item, SkippedLine):
                self.skipped.add(item, where)
            elif item[2]:
                self._otlp_line(item[0], item[1], where)
            else:
                self._row(item[0], item[1], where)

    def _row(self, number: int, row: Any, where: str) -> None:
        try:
            report = read_row(row)
        except ValueError as error:
            # The kinds a row that does not validate names are still checked; a line whose
            # problem is not a malformed kind could hide any kind, so it is reported too.
            if MALFORMED not in {self._check(number, kind, where) for kind in _saved_kinds(row)}:
                self.skipped.add(SkippedLine(number, str(error)), where)
            return
        for record in report.events.values() if report is not None else ():
            self._check(number, record["failure_kind"], where)

    def _otlp_line(self, number: int, data: dict[str, Any], where: str) -> None:
        failures, skipped = otlp_line_failures(number, data, set())
        if skipped is not None:  # a malformed kind among its events: show and summary skip it too
            self.skipped.add(skipped, where)
        for _, attributes, _ in failures:
            if attributes[names.ID] not in self._counted_ids:
                if self._check(number, attributes[names.KIND], where) is not None:
                    self._counted_ids.add(attributes[names.ID])

    def _check(self, number: int, kind: Any, where: str) -> str | None:
        """Count ``kind`` when it is not registered or namespaced; its problem, or ``None``."""
        if is_registered(kind) or is_namespaced(kind):
            return None
        problem = UNREGISTERED if is_well_formed(kind) else MALFORMED
        key = (kind if isinstance(kind, str) else reprlib.repr(kind), problem)
        if key not in self.kinds and len(self.kinds) >= MAX_LISTED_KINDS:
            key = (names.OTHER_KIND, problem)  # a file of endless distinct kinds: memory stays flat
        self.kinds[key] += 1
        self.first_line.setdefault(key, (where, number))
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
