"""OTLP JSON lines (what ``ng-otel receive`` and the Collector's file exporter write) read
for their ``ng.failure`` events: span events and log records, tolerant of any shape, each
event's attributes read back into its failure record by ``ng_otel.otel.attributes``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from ng_otel.contract.events import BOUNDARIES, EVENT_ID_RE
from ng_otel.contract.kinds import is_well_formed
from ng_otel.otel import names
from ng_otel.otel.attributes import record_of
from ng_otel.runs.inputs import SkippedLine

__all__ = [
    "INVALID_OTLP_EVENT",
    "NO_TRACE_IDS",
    "OtlpFailure",
    "otlp_failure_events",
    "otlp_line_failures",
    "otlp_counter_points",
    "record_of",
]

NO_TRACE_IDS: Final = frozenset({"", "?", "0" * 32})
"""OTLP JSON's ways of saying "no trace" (a log record outside any span): each such event is a
row, and a tree, of its own."""
INVALID_OTLP_EVENT: Final = "an ng.failure event without a valid id, kind or boundary"


OtlpFailure = tuple[str, dict[str, Any], int]  # trace id, the event's attributes, unix nanoseconds or 0


def otlp_line_failures(
    number: int, data: Mapping[str, Any], traces: set[str]
) -> tuple[list[OtlpFailure], SkippedLine | None]:
    """The ``ng.failure`` events of one OTLP JSON line that a row could hold too, and the line
    as one ``SkippedLine`` when any event could not be read (once, however many)."""
    failures: list[OtlpFailure] = []
    invalid = False
    for trace_id, attributes, unix_nanos in otlp_failure_events(data, traces):
        if attributes is None:
            invalid = True
        else:
            failures.append((trace_id, attributes, unix_nanos))
    return failures, SkippedLine(number, INVALID_OTLP_EVENT) if invalid else None


def otlp_failure_events(data: Mapping[str, Any], traces: set[str]) -> Iterator[tuple[str, dict[str, Any] | None, int]]:
    """(trace id, the event's attributes or ``None`` when it lacks its id, kind or boundary,
    time in unix nanoseconds or 0) for each ``ng.failure`` span event and log record of one
    OTLP JSON line; each span's trace id is added to ``traces``. Tolerant of any shape."""
    for resource_spans in _list(data.get("resourceSpans")):
        service = _attributes(_dict(_dict(resource_spans).get("resource")).get("attributes")).get("service.name", "?")
        for scope_spans in _list(_dict(resource_spans).get("scopeSpans")):
            for span in _list(_dict(scope_spans).get("spans")):
                span = _dict(span)
                trace_id = _trace_id(span)
                traces.add(trace_id)
                for event in _list(span.get("events")):
                    event = _dict(event)
                    if event.get("name") == names.EVENT:
                        yield trace_id, _failure_attributes(event.get("attributes"), service), _time(event)
    if data.get(names.LINE_RECORD) == names.EVENT:  # one of ng_otel's JSON lines: flat attributes
        yield _line_trace_id(data), _line_failure_attributes(data), _line_time(data)
        return
    for resource_logs in _list(data.get("resourceLogs")):
        service = _attributes(_dict(_dict(resource_logs).get("resource")).get("attributes")).get("service.name", "?")
        for scope_logs in _list(_dict(resource_logs).get("scopeLogs")):
            for log in _list(_dict(scope_logs).get("logRecords")):
                log = _dict(log)
                if log.get("eventName") == names.EVENT:
                    yield _trace_id(log), _failure_attributes(log.get("attributes"), service), _time(log)


def _failure_attributes(items: Any, service: Any) -> dict[str, Any] | None:
    """The event's attributes, or ``None`` when its id, kind or boundary is not one a row could
    hold either (so an OTLP line and a row are held to the same names)."""
    return _checked(_attributes(items), service)


def _checked(attributes: dict[str, Any], service: Any) -> dict[str, Any] | None:
    event_id, kind, boundary = (attributes.get(key) for key in (names.ID, names.KIND, names.BOUNDARY))
    if not (
        isinstance(event_id, str)
        and EVENT_ID_RE.fullmatch(event_id)
        and is_well_formed(kind)
        and boundary in BOUNDARIES
    ):
        return None
    attributes["service.name"] = service
    return attributes


def _line_failure_attributes(line: Mapping[str, Any]) -> dict[str, Any] | None:
    """An ``ng.failure`` JSON line's attributes, held to a row's names as an OTLP event's are."""
    attributes = {key: value for key, value in line.items() if isinstance(value, (str, bool, int, float))}
    return _checked(attributes, line.get(names.LINE_SERVICE, "?"))


def _line_trace_id(line: Mapping[str, Any]) -> str:
    trace_id = line.get(names.LINE_TRACE_ID)
    return trace_id if isinstance(trace_id, str) else ""


def _line_time(line: Mapping[str, Any]) -> int:
    value = line.get(names.LINE_TIME)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _time(item: Mapping[str, Any]) -> int:
    try:
        return int(item.get("timeUnixNano", 0))
    except (TypeError, ValueError, OverflowError):  # not a number, NaN, Infinity: no time
        return 0


def _trace_id(item: Mapping[str, Any]) -> str:
    """The item's trace id; "" (no trace) for one that is missing or not a string."""
    trace_id = item.get("traceId")
    return trace_id if isinstance(trace_id, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _attributes(items: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in _list(items):
        value = _dict(_dict(item).get("value"))
        for kind in ("stringValue", "boolValue", "intValue", "doubleValue"):
            if kind in value:
                raw = value[kind]
                if kind == "intValue":
                    try:
                        raw = int(raw) if isinstance(raw, (int, str)) and len(str(raw)) < 20 else None
                    except ValueError:
                        raw = None
                if raw is not None:
                    values[str(_dict(item).get("key", ""))] = raw
    return values


COUNTED_METRICS: Final = frozenset({names.VERIFY_METRIC, names.RETRY_METRIC, names.ROLLOUT_METRIC})
"""The counters the after-the-run readers total: verify, retry and rollout outcomes."""


def otlp_counter_points(data: Mapping[str, Any]) -> Iterator[tuple[str, tuple[Any, ...], int]]:
    """(metric, series, total so far) for each data point of a ``COUNTED_METRICS`` counter in
    one OTLP JSON line: a series is its service, attributes (sorted pairs) and start time, so
    the latest point of a cumulative sum is the series' total. Tolerant of any shape."""
    for resource_metrics in _list(data.get("resourceMetrics")):
        resource = _dict(resource_metrics).get("resource")
        service = _attributes(_dict(resource).get("attributes")).get("service.name", "?")
        for scope_metrics in _list(_dict(resource_metrics).get("scopeMetrics")):
            for metric in _list(_dict(scope_metrics).get("metrics")):
                metric = _dict(metric)
                name = metric.get("name")
                if name not in COUNTED_METRICS:
                    continue
                for point in _list(_dict(metric.get("sum")).get("dataPoints")):
                    point = _dict(point)
                    total = _count_of(point)
                    if total is not None:
                        labels = tuple(sorted(_attributes(point.get("attributes")).items()))
                        yield str(name), (str(service), labels, str(point.get("startTimeUnixNano", ""))), total


def _count_of(point: Mapping[str, Any]) -> int | None:
    raw = point.get("asInt", point.get("asDouble"))
    try:
        value = int(raw) if isinstance(raw, (int, float, str)) and len(str(raw)) < 20 else None
    except (ValueError, OverflowError):
        return None
    return value if value is not None and value >= 0 else None
