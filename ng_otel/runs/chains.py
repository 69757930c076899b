"""Failure chains read from saved rollout rows or OTLP JSON lines, as groups of records.

Rows stream: one group per row, memory flat on any file. OTLP JSON lines are grouped by trace
(a trace's spans come in many lines), and traces joined by a cause link are one group.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import ROW_ROLLOUT_INDEX, ROW_TASK_INDEX, read_row_failures, row_terminal
from ng_otel.runs.inputs import FormattedLine, SkippedLine, formatted_lines
from ng_otel.runs.otlp import NO_TRACE_IDS, otlp_line_failures, record_of

__all__ = ["FailureGroup", "groups_from_lines", "groups_from_otlp", "groups_from_rows"]


@dataclass
class FailureGroup:
    """The failures of one rollout row or one trace (or traces a cause link joins)."""

    title: str
    events: dict[str, dict[str, Any]]
    failure_id: str | None = None
    omitted: bool = False
    recovered: set[str] = field(default_factory=set)
    services: dict[str, str] = field(default_factory=dict)

    def matches(self, kind: str | None, boundary: str | None) -> bool:
        """Whether an event of the group has ``kind`` and ``boundary`` (``None``: any)."""
        return any(
            (kind is None or record["failure_kind"] == kind) and (boundary is None or record["boundary"] == boundary)
            for record in self.events.values()
        )

    def roots(self) -> list[str]:
        """Effects that nothing here names as its cause, the reply's own failure first."""
        causes = {record.get("cause_id") for record in self.events.values()}
        tops = [event_id for event_id in self.events if event_id not in causes]
        return sorted(tops, key=lambda event_id: (event_id != self.failure_id, event_id in self.recovered))


def groups_from_lines(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | SkippedLine]:
    """The failure groups of a file's decoded lines: one per row of saved rows, one per trace
    (or traces a cause link joins) of OTLP JSON lines, as the file's first JSON object says;
    every other line a ``SkippedLine``."""
    formatted = formatted_lines(lines)
    for item in formatted:
        if isinstance(item, SkippedLine):
            yield item
            continue
        rest = itertools.chain([item], formatted)
        yield from groups_from_otlp(rest) if item[2] else groups_from_rows(rest)
        return


# -- rows ------------------------------------------------------------------------------------


def groups_from_rows(lines: Iterable[FormattedLine | SkippedLine]) -> Iterator[FailureGroup | SkippedLine]:
    for item in lines:
        if isinstance(item, SkippedLine):
            yield item
            continue
        number, row, _ = item
        try:
            report, servers = read_row_failures(row)
        except ValueError as error:
            yield SkippedLine(number, str(error))
            continue
        if report is None or (not report.events and not report.omitted):
            continue
        group = _group_of(_row_title(number, row), report)
        group.services.update(servers)  # the servers a 0.7.0 row's body names, drawn as OTLP's are
        yield group


def _row_title(number: int, row: Mapping[str, Any]) -> str:
    parts = [f"line {number}"]
    for key, label in _TITLE_KEYS:
        value = row.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            parts.append(f"{label} {value}")
    if row_terminal(row):
        parts.append("terminal")
    return " · ".join(parts)


_TITLE_KEYS = (
    ("scenario", "scenario"),
    ("task_id", "task_id"),
    (ROW_TASK_INDEX, "task"),
    (ROW_ROLLOUT_INDEX, "rollout"),
    ("episode_id", "episode_id"),
    ("status", "status"),
    ("trace_id", "trace_id"),
)


def _group_of(title: str, report: FailureReport) -> FailureGroup:
    return FailureGroup(
        title=title,
        events=report.events,  # type: ignore[arg-type]  # read only here
        failure_id=report.failure_id,
        omitted=report.omitted,
        recovered=set(report.recovered_ids()) if len(report.events) > 1 or report.failure_id is None else set(),
    )


# -- OTLP JSON lines -------------------------------------------------------------------------


def groups_from_otlp(lines: Iterable[FormattedLine | SkippedLine]) -> Iterator[FailureGroup | SkippedLine]:
    """One group per trace, from the ``ng.failure`` events of OTLP JSON lines; traces that a
    cause link joins (a cause recorded in another trace) are one group, so one tree."""
    traces: dict[str, FailureGroup] = {}
    where: dict[str, str] = {}  # event id -> trace id
    seen: set[str] = set()
    for item in lines:
        if isinstance(item, SkippedLine):
            yield item
            continue
        number, data, _ = item
        failures, skipped = otlp_line_failures(number, data, seen)
        if skipped is not None:
            yield skipped
        for trace_id, attributes, _ in failures:
            record = record_of(attributes)
            event_id = record["event_id"]
            if trace_id in NO_TRACE_IDS:
                trace_id = f"(none: event {event_id})"  # a key no hex trace id can be
            group = traces.setdefault(trace_id, FailureGroup(title=f"trace {trace_id}", events={}))
            group.events[event_id] = record
            where.setdefault(event_id, trace_id)
            group.services[event_id] = str(attributes["service.name"])
            if record.pop("recovered", False):
                group.recovered.add(event_id)
    yield from _joined(traces, where)


def _joined(traces: dict[str, FailureGroup], where: Mapping[str, str]) -> Iterator[FailureGroup]:
    parent = {trace_id: trace_id for trace_id in traces}

    def find(trace_id: str) -> str:
        while parent[trace_id] != trace_id:
            parent[trace_id] = parent[parent[trace_id]]
            trace_id = parent[trace_id]
        return trace_id

    for trace_id, group in traces.items():
        for record in group.events.values():
            cause_trace = where.get(record.get("cause_id") or "")
            if cause_trace is not None and cause_trace != trace_id:
                parent[find(trace_id)] = find(cause_trace)
    members: dict[str, list[str]] = {}
    for trace_id in traces:
        members.setdefault(find(trace_id), []).append(trace_id)
    for trace_ids in members.values():
        if len(trace_ids) == 1:
            group = traces[trace_ids[0]]
        else:
            group = FailureGroup(title="traces " + " + ".join(trace_ids), events={})
            for trace_id in trace_ids:
                group.events.update(traces[trace_id].events)
                group.services.update(traces[trace_id].services)
                group.recovered |= traces[trace_id].recovered
        if group.events:
            yield group
