"""Capture the failure telemetry of code under test, in memory, as plain dicts.

    with capture_failures() as telemetry:
        call_the_code()
    assert telemetry.chain() == ["agent_run_error", "transport_timeout"]

Ids are deterministic (trace and span ids count up from 1) and timestamps are left out of
the dicts, so a whole exported span can be compared with ``==``.

ng_otel remembers a few things for the life of a process: which places have reported an
internal error (each warns once), which unregistered failure kinds it has warned of, the
adapters' rules (``enable()`` registers Gym's) and the recorder. ``fresh_state()`` runs a
block as a fresh process would and puts all of it back after:

    with fresh_state(), caplog.at_level(logging.WARNING, logger="ng_otel"):
        validate_failure_kind("browser_crashed")  # warns, whatever ran before
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanContext

from ng_otel._version import __version__
from ng_otel.contract import kinds
from ng_otel.gym import deployment
from ng_otel.integrations import hooks
from ng_otel.otel import names
from ng_otel.otel._guard import internal_errors_raise, raise_internal_errors, swap_reported
from ng_otel.otel.recorder import FailureRecorder, get_recorder, install_recorder, is_enabled
from ng_otel.otel.settings import Settings


class SequentialIdGenerator(IdGenerator):
    """Trace and span ids 1, 2, 3, ... so exported spans compare equal run after run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trace = 0
        self._span = 0

    def generate_trace_id(self) -> int:
        with self._lock:
            self._trace += 1
            return self._trace

    def generate_span_id(self) -> int:
        with self._lock:
            self._span += 1
            return self._span


def _context(context: SpanContext | None) -> dict[str, int] | None:
    if context is None:
        return None
    return {"trace_id": context.trace_id, "span_id": context.span_id}


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as a plain dict: name, ids, parent, status, attributes, events, links."""
    return {
        "name": span.name,
        "context": _context(span.context),
        "parent": _context(span.parent),
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": event.name, "attributes": dict(event.attributes or {})} for event in span.events],
        "links": [
            {"context": _context(link.context), "attributes": dict(link.attributes or {})} for link in span.links
        ],
    }


class CapturedTelemetry:
    """What the code under test exported: spans, metric points and log records."""

    def __init__(self, signals: str = "spans", max_kinds: int = 200) -> None:
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(
            id_generator=SequentialIdGenerator(), resource=Resource.create({"service.name": "test"})
        )
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        self.log_exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.log_exporter))
        self.tracer = self.tracer_provider.get_tracer("ng_otel.testing")
        self.recorder = FailureRecorder(
            self.tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, __version__),
            self.meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__),
            self.logger_provider.get_logger(names.INSTRUMENTATION_SCOPE, __version__),
            Settings.resolve(signals=signals, max_kinds=max_kinds, environ={}),
        )

    def spans(self) -> list[dict[str, Any]]:
        """Every finished span as a dict (``span_to_dict``), in the order they ended."""
        return [span_to_dict(span) for span in self.span_exporter.get_finished_spans()]

    def failure_events(self) -> list[dict[str, Any]]:
        """Attributes of every exported ``ng.failure`` span event, in export order."""
        return [
            dict(event.attributes or {})
            for span in self.span_exporter.get_finished_spans()
            for event in span.events
            if event.name == names.EVENT
        ]

    def metric_points(self, metric: str = names.FAILURES_METRIC) -> list[dict[str, Any]]:
        """``{"attributes": ..., "value": ...}`` for each point of ``metric``, sorted."""
        data = self.metric_reader.get_metrics_data()
        points = []
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for found in scope_metrics.metrics:
                    if found.name == metric:
                        for point in found.data.data_points:
                            value = getattr(point, "value", None)
                            points.append({"attributes": dict(point.attributes or {}), "value": value})
        return sorted(points, key=lambda point: sorted((k, str(v)) for k, v in point["attributes"].items()))

    def count(self, metric: str = names.FAILURES_METRIC, **attributes: Any) -> int:
        """Sum of ``metric`` over points whose attributes include ``attributes`` (use the
        attribute names with dots replaced: ``kind="transport_timeout"``)."""
        wanted = {f"ng.failure.{key}": value for key, value in attributes.items()}
        return sum(
            int(point["value"])
            for point in self.metric_points(metric)
            if all(point["attributes"].get(key) == value for key, value in wanted.items())
        )

    def log_records(self) -> list[dict[str, Any]]:
        """Logs mode's records: event name, attributes and the span context they carry."""
        return [
            {
                "event_name": item.log_record.event_name,
                "attributes": dict(item.log_record.attributes or {}),
                "trace_id": item.log_record.trace_id,
                "span_id": item.log_record.span_id,
            }
            for item in self.log_exporter.get_finished_logs()
        ]

    def chain(self, event_id: str | None = None) -> list[str]:
        """Kinds along the exported cause chain from ``event_id`` (default: the last event
        that is nobody's cause), effect first, following ``ng.failure.cause_id``."""
        events = {event[names.ID]: event for event in self.failure_events()}
        if event_id is None:
            causes = {event.get(names.CAUSE_ID) for event in events.values()}
            tops = [eid for eid in events if eid not in causes]
            if not tops:
                return []
            event_id = tops[-1]
        kinds = []
        current: str | None = event_id
        while current is not None and current in events:
            kinds.append(events[current][names.KIND])
            current = events[current].get(names.CAUSE_ID)
        return kinds

    def assert_chain(self, *kinds: str) -> list[dict[str, Any]]:
        """Assert that a chain with exactly these kinds, effect first, was recorded; that each
        of its events was exported once; and that each cause on another span is linked.
        Returns the chain's events."""
        events = self.failure_events()
        by_id = {event[names.ID]: event for event in events}
        for top in events:
            chain: list[dict[str, Any]] = []
            current: dict[str, Any] | None = top
            while current is not None and len(chain) <= len(kinds):
                chain.append(current)
                cause = current.get(names.CAUSE_ID)
                current = by_id.get(cause) if cause is not None else None
            if [event[names.KIND] for event in chain] == list(kinds) and current is None:
                self.assert_exported_once()
                self.assert_linked()
                return chain
        found = [self.chain(event[names.ID]) for event in events]
        raise AssertionError(f"no failure chain {list(kinds)}; recorded chains: {found}")

    def assert_exported_once(self) -> None:
        """No ``ng.failure`` event id was exported twice."""
        ids = [event[names.ID] for event in self.failure_events()]
        duplicates = sorted({event_id for event_id in ids if ids.count(event_id) > 1})
        assert not duplicates, f"failure events exported more than once: {duplicates}"

    def assert_linked(self) -> None:
        """Every exported event whose cause was exported on another span links to that span
        (and only to it); a cause on the same span needs no link."""
        where: dict[str, dict[str, Any]] = {}
        for span in self.spans():
            for event in span["events"]:
                if event["name"] == names.EVENT:
                    where[event["attributes"][names.ID]] = span
        for event_id, span in where.items():
            cause_id = next(
                e["attributes"].get(names.CAUSE_ID) for e in span["events"] if e["attributes"].get(names.ID) == event_id
            )
            if cause_id is None or cause_id not in where:
                continue
            targets = [link["context"] for link in span["links"] if link["attributes"].get(names.ID) == event_id]
            cause_context = where[cause_id]["context"]
            expected = [] if cause_context == span["context"] else [cause_context]
            assert targets == expected, f"{event_id} does not link to its cause {cause_id}"


@contextmanager
def capture_failures(signals: str = "spans", max_kinds: int = 200) -> Iterator[CapturedTelemetry]:
    """Install an in-memory recorder for the duration of the block, with the rules every
    process of Gym's gets from ``ng_otel.enable()`` (``/verify`` replies are verify
    outcomes), then restore the previous recorder and rules."""
    captured = CapturedTelemetry(signals=signals, max_kinds=max_kinds)
    previous, was_enabled, previous_rules = get_recorder(), is_enabled(), hooks.saved()
    install_recorder(captured.recorder)
    deployment.install_verify_reader()
    try:
        yield captured
    finally:
        hooks.restore(previous_rules)
        install_recorder(previous, enabled=was_enabled)
        captured.tracer_provider.shutdown()
        captured.logger_provider.shutdown()


@contextmanager
def internal_errors_logged() -> Iterator[None]:
    """Within the block, ng_otel's internal errors are logged and skipped as in production,
    even under the pytest plugin (which makes them raise): for tests of that behaviour."""
    previous = internal_errors_raise()
    raise_internal_errors(False)
    try:
        yield
    finally:
        raise_internal_errors(previous)


def reset_state() -> None:
    """Make ng_otel's process-wide memory what a fresh process has: no place has reported an
    internal error yet (each warns once again), no unregistered failure kind has been warned
    of, and the adapters hold no rules. The recorder and whether recording is enabled stay
    (``capture_failures`` installs a recorder, ``enable()`` the process's own)."""
    swap_reported()
    kinds.swap_warned()
    hooks.reset()


@contextmanager
def fresh_state() -> Iterator[None]:
    """``reset_state()`` for the block; after it, everything as it was before: the places that
    had reported, the kinds warned of, the adapters' rules, the recorder and whether recording
    is enabled (``install_recorder(recorder, enabled=False)`` in the block is undone too)."""
    recorder, was_enabled, rules = get_recorder(), is_enabled(), hooks.saved()
    reported, warned = swap_reported(), kinds.swap_warned()
    hooks.reset()
    try:
        yield
    finally:
        hooks.restore(rules)
        install_recorder(recorder, enabled=was_enabled)
        swap_reported(reported)
        kinds.swap_warned(warned)
