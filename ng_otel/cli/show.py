"""Failure chains read from saved rollout rows or OTLP JSON lines, drawn as trees."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import ROW_ROLLOUT_INDEX, ROW_TASK_INDEX, row_report, row_terminal
from ng_otel.otel import names

MAX_SHOWN_REASON = 160  # a tree line is for a glance; the full reason is in the trace


@dataclass
class FailureGroup:
    """The failures of one rollout row or one trace, with where they came from."""

    title: str
    events: dict[str, dict[str, Any]]
    failure_id: str | None = None
    omitted: bool = False
    recovered: set[str] = field(default_factory=set)
    services: dict[str, str] = field(default_factory=dict)

    def matches(self, kind: str | None, boundary: str | None) -> bool:
        return any(
            (kind is None or record["failure_kind"] == kind) and (boundary is None or record["boundary"] == boundary)
            for record in self.events.values()
        )

    def roots(self) -> list[str]:
        """Effects that nothing here names as its cause, the reply's own failure first."""
        causes = {record.get("cause_id") for record in self.events.values()}
        tops = [event_id for event_id in self.events if event_id not in causes]
        return sorted(tops, key=lambda event_id: (event_id != self.failure_id, event_id in self.recovered))


@dataclass
class BadLine:
    line: int
    message: str


def read_lines(stream: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON or BadLine) for each non-blank line."""
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError as error:
            yield number, BadLine(number, f"not JSON: {error.msg} at column {error.colno}")


def groups_from_rows(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | BadLine]:
    for number, row in lines:
        if isinstance(row, BadLine):
            yield row
            continue
        try:
            report = row_report(row)
        except ValueError as error:
            yield BadLine(number, str(error))
            continue
        if report is None or (not report.events and not report.omitted):
            continue
        yield _group_of(_row_title(number, row), report)


def _row_title(number: int, row: Mapping[str, Any]) -> str:
    parts = [f"line {number}"]
    for key, label in _TITLE_KEYS:
        if key in row and isinstance(row[key], (str, int)) and not isinstance(row[key], bool):
            parts.append(f"{label} {row[key]}")
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
        events={event_id: dict(record) for event_id, record in report.events.items()},
        failure_id=report.failure_id,
        omitted=report.omitted,
        recovered=set(report.recovered_ids()),
    )


def groups_from_otlp(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | BadLine]:
    """One group per trace, from the ``ng.failure`` span events of OTLP JSON trace lines."""
    traces: dict[str, FailureGroup] = {}
    for number, data in lines:
        if isinstance(data, BadLine):
            yield data
            continue
        for resource_spans in data.get("resourceSpans", []) if isinstance(data, dict) else []:
            service = _attributes(resource_spans.get("resource", {}).get("attributes", [])).get("service.name", "?")
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    trace_id = span.get("traceId", "?")
                    group = traces.setdefault(trace_id, FailureGroup(title=f"trace {trace_id}", events={}))
                    for event in span.get("events", []):
                        if event.get("name") != names.EVENT:
                            continue
                        record = _record_of(_attributes(event.get("attributes", [])))
                        if record is None:
                            yield BadLine(number, "an ng.failure event without its id, kind or boundary")
                            continue
                        group.events[record["event_id"]] = record
                        group.services[record["event_id"]] = str(service)
                        if record.pop("recovered", False):
                            group.recovered.add(record["event_id"])
    yield from (group for group in traces.values() if group.events)


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    values = {}
    for item in items:
        value = item.get("value", {})
        for kind in ("stringValue", "boolValue", "intValue", "doubleValue"):
            if kind in value:
                values[item.get("key", "")] = int(value[kind]) if kind == "intValue" else value[kind]
    return values


def _record_of(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    if not all(key in attributes for key in (names.ID, names.KIND, names.BOUNDARY)):
        return None
    record = {
        "event_id": str(attributes[names.ID]),
        "boundary": str(attributes[names.BOUNDARY]),
        "failure_kind": str(attributes[names.KIND]),
        "failure_reason": str(attributes.get(names.REASON, "")),
        "recovered": bool(attributes.get(names.RECOVERED, False)),
    }
    for key, name in (("stage", names.STAGE), ("http_status", names.HTTP_STATUS), ("cause_id", names.CAUSE_ID)):
        if name in attributes:
            record[key] = attributes[name]
    return record


def printable(text: str, limit: int = MAX_SHOWN_REASON) -> str:
    """Safe for a terminal: no control characters (no escape sequences), no rich markup."""
    clean = "".join(c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text)
    if len(clean) > limit:
        clean = clean[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"
    return escape(clean)


def _label(group: FailureGroup, record: Mapping[str, Any]) -> str:
    event_id = record["event_id"]
    details = [record["boundary"]]
    if record.get("stage"):
        details.append(f"stage {record['stage']}")
    if record.get("http_status"):
        details.append(str(record["http_status"]))
    if event_id in group.services:
        details.append(group.services[event_id])
    foreign = record.get("foreign_error")
    tail = f"  [dim]via {printable(foreign['type'], 60)}[/dim]" if isinstance(foreign, Mapping) else ""
    mark = " [yellow](recovered)[/yellow]" if event_id in group.recovered else ""
    return (
        f"[bold]{printable(record['failure_kind'], 80)}[/bold]{mark}  {printable(' · '.join(map(str, details)), 120)}"
        f"  [dim]{printable(event_id[:12], 12)}[/dim]\n{printable(record['failure_reason'])}{tail}"
    )


def render(group: FailureGroup) -> Tree:
    tree = Tree(
        f"[cyan]{printable(group.title, 200)}[/cyan]" + ("  [red]report omitted[/red]" if group.omitted else "")
    )
    shown: set[str] = set()
    for root in group.roots():
        node = tree
        current: str | None = root
        while current is not None and current in group.events and current not in shown:
            shown.add(current)
            node = node.add(_label(group, group.events[current]))
            current = group.events[current].get("cause_id")
    if group.omitted and not group.events:
        tree.add("[dim]the reply's report exceeded 4096 bytes; its events are in the traces[/dim]")
    return tree


def show(
    groups: Iterable[FailureGroup | BadLine],
    console: Console,
    *,
    kind: str | None = None,
    boundary: str | None = None,
) -> tuple[int, list[BadLine]]:
    """Print each matching group as a tree; returns (groups shown, bad lines)."""
    shown, bad = 0, []
    for group in groups:
        if isinstance(group, BadLine):
            bad.append(group)
            continue
        if group.matches(kind, boundary) or (kind is None and boundary is None):
            console.print(render(group))
            shown += 1
    return shown, bad


def is_otlp(first: Any) -> bool:
    return isinstance(first, dict) and any(key in first for key in ("resourceSpans", "resourceMetrics", "resourceLogs"))
