"""``record_failure`` and ``observe_failure``: Gym failure events as OpenTelemetry signals.

Each event becomes one ``ng.failure`` span event, its ``cause_id`` a span link to the span
where the cause was recorded, and one count in ``ng.failures`` with bounded attributes only.
An event id this process already knows (recorded here, or exported by a callee) is skipped,
so each event is exported and counted exactly once across hops.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import Logger, SeverityNumber, get_logger
from opentelemetry.context import Context
from opentelemetry.metrics import Meter
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    Tracer,
)

from ng_otel._compat import span_room
from ng_otel._version import __version__
from ng_otel.contract.classify import DEFAULT_CLASSIFIER, FailureClassifier
from ng_otel.contract.events import NgFailureEvent
from ng_otel.contract.kinds import FAILURE_KINDS, is_well_formed
from ng_otel.contract.report import FailureReport, failure_report_for
from ng_otel.otel import names
from ng_otel.otel._failure_tally import FailureLabels, failure_tally
from ng_otel.otel._guard import guarded
from ng_otel.otel.attributes import event_attributes
from ng_otel.otel.failure_log import current_failure_log
from ng_otel.otel.jsonl import process_lines
from ng_otel.otel.links import NOT_EXPORTED, LinkIndex, index_entry
from ng_otel.otel.settings import Settings, SettingsError, warn_not_enabled

Failure = NgFailureEvent | FailureReport | BaseException
_MAX_SERIES_CACHED = 4096  # distinct (boundary, kind, status, stage, recovered, terminal) remembered


class KindGuard:
    """Bounds the ``ng.failure.kind`` metric label: a malformed kind is ``_invalid``; after
    ``max_kinds`` distinct unregistered kinds, further new ones are ``_other``. Registered
    kinds are always themselves."""

    def __init__(self, max_kinds: int) -> None:
        self._max_kinds = max_kinds
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def label(self, kind: str) -> str:
        if kind in FAILURE_KINDS or kind in self._seen:
            return kind
        if not is_well_formed(kind):
            return names.INVALID_KIND
        with self._lock:
            if len(self._seen) >= self._max_kinds:
                return names.OTHER_KIND
            self._seen.add(kind)
        return kind


class FailureRecorder:
    """Turns failure records into span events, links, counts and (logs mode) log records."""

    def __init__(
        self,
        tracer: Tracer,
        meter: Meter,
        logger: Logger | None = None,
        settings: Settings | None = None,
        classifier: FailureClassifier = DEFAULT_CLASSIFIER,
    ) -> None:
        self.settings = settings or Settings()
        self.tracer = tracer
        self.index = LinkIndex(self.settings.link_index_size)
        self.kinds = KindGuard(self.settings.max_kinds)
        self.classifier = classifier
        self._series: dict[tuple[Any, ...], tuple[str, FailureLabels]] = {}
        self._series_by: FailureClassifier | None = None  # the classifier _series was computed with
        self._spans = "spans" in self.settings.signals
        self._logger = logger if "logs" in self.settings.signals else None
        self._failures = failure_tally(meter)
        self.meter = meter  # the recovery instruments (ng_otel.otel.recovery) are registered on it too
        self.verify_outcomes = meter.create_counter(
            names.VERIFY_METRIC, unit=names.VERIFY_UNIT, description=names.VERIFY_DESCRIPTION
        )
        self.omitted_reports = meter.create_counter(
            names.OMITTED_METRIC, unit=names.OMITTED_UNIT, description=names.OMITTED_DESCRIPTION
        )
        self.lines = process_lines()  # JSON lines when OpenTelemetry is off (ng_otel.otel.jsonl)

    def record(
        self,
        report: FailureReport,
        span: Span | None = None,
        *,
        own: bool,
        recovered: bool | None = None,
        event_attributes: Mapping[str, Any] | None = None,
        spans: Mapping[str, Span] | None = None,
        terminal: Collection[str] = (),
        count: bool = True,
    ) -> int:
        """Record every event of ``report`` not known yet, causes before effects.

        ``own`` marks ``report.failure_id`` as the span's own failure (``error.type``, status
        ERROR). ``recovered`` forces the recovered attribute; by default an event is recovered
        when it is off the chain of ``report.failure_id``. ``event_attributes`` are added to
        every event (for example ``ng.verify.masked``); ``spans`` puts chosen events on other
        spans than ``span``; ``terminal`` names events an environment decided are terminal
        for their episode (DATA, whatever their kind). ``count=False`` exports the events
        without adding them to ``ng.failures`` (a replay into a backend that already counted
        them live). Returns how many were new.
        """
        target = span if span is not None else trace.get_current_span()
        if recovered is None:
            recovered_ids: Collection[str] = report.recovered_ids()
        else:
            recovered_ids = report.events if recovered else ()
        own_id = report.failure_id if own else None
        on = _Target(target, event_attributes, count)
        targets: dict[int, _Target] = {}
        placed_on: dict[str, _Target] = {}  # this call's events: a cause among them needs no index read
        events_taken = 1 if self._spans else 0  # room an event takes: none when events go to logs only
        recorded = 0
        for record in causes_first(report.events):
            event_id = record["event_id"]
            chosen = spans.get(event_id) if spans else None
            if chosen is None:
                where = on
            elif id(chosen) in targets:
                where = targets[id(chosen)]
            else:
                where = targets[id(chosen)] = _Target(chosen, event_attributes, count)
            flags = (event_id in recovered_ids, event_id == own_id, event_id in terminal)
            if where.recording:
                cause_id = record.get("cause_id")
                # A cause recorded on this very span needs no link: cause_id on the event says it.
                linked = cause_id is not None and placed_on.get(cause_id) is not where
                links = self._links(record, where.context) if linked else []
                # The room is the target's own, read inline: this loop runs once per event.
                if where.events_room >= events_taken and where.links_room >= len(links):
                    # Claimed with the span it goes on, so a concurrent recorder of the same id
                    # skips it; an id known already was recorded here or exported by a callee.
                    if self.index.add(event_id, where.context, where.entry):
                        placed_on[event_id] = where
                        where.events_room -= events_taken
                        where.links_room -= len(links)
                        self._emit(record, where, *flags, links)
                        recorded += 1
                    continue
                if flags[1]:
                    _mark_error(where.span, record["failure_kind"])  # its own failure, though it overflows
            recorded += self._record_late(record, where, *flags)
        return recorded

    def learn_remote(self, report: FailureReport, contexts: Mapping[str, SpanContext] | None) -> bool:
        """Remember events a callee already exported (``X-NG-Failure-Context``), so effects
        here link to their spans and the events are never exported again; an event this
        process already knows keeps the span it knows. ``None`` (the callee's map was omitted)
        marks every event of ``report`` as exported, unlinked. True when that leaves no event
        of ``report`` for this process to export (the map named them all)."""
        events = report.events
        if contexts is None:
            for event_id in events:
                self.index.add(event_id, INVALID_SPAN_CONTEXT)
            return True
        named = 0
        for event_id, context in contexts.items():
            if event_id in events:
                # First word wins: an event recorded here, or learned from the peer that exported
                # it, keeps its span, whatever a later peer's map claims.
                self.index.add(event_id, context)
                named += 1
        return named == len(events)

    def _record_late(
        self, record: Mapping[str, Any], target: _Target, recovered: bool, own: bool, terminal: bool
    ) -> bool:
        """An ended or unsampled span takes no events, and a full one no more (the SDK would
        drop the oldest, root causes first): a short span in the same trace does, with its
        link set at creation. True when the event was recorded now."""
        event_id = record["event_id"]
        if not self.index.add(event_id, INVALID_SPAN_CONTEXT):
            return False
        parent = target.context
        context = trace.set_span_in_context(NonRecordingSpan(parent)) if parent.is_valid else Context()
        links = self._links(record, None)
        span = self.tracer.start_span(names.LATE_SPAN_PREFIX + record["failure_kind"], context=context, links=links)
        try:
            self._emit(record, _Target(span, target.extra, target.counted), recovered, own, terminal, [])
        finally:
            span.end()
        placed = span.get_span_context()
        self.index.set(event_id, placed if placed.is_valid else NOT_EXPORTED)
        return True

    def _links(self, record: Mapping[str, Any], on: SpanContext | None) -> list[Link]:
        """The cause link of ``record`` from the span ``on`` (``None``: a new one)."""
        cause_id = record.get("cause_id")
        if cause_id is None:
            return []
        cause_context = self.index.get(cause_id)
        # A cause recorded on this very span needs no link: cause_id on the event says it.
        if cause_context is None or not cause_context.is_valid or cause_context == on:
            return []
        event_id = record["event_id"]
        attributes = {names.LINK_TYPE: names.LINK_CAUSED_BY, names.ID: event_id, names.CAUSE_ID: cause_id}
        return [Link(cause_context, attributes)]

    def _classified(
        self, boundary: str, kind: str, status: int | None, stage: str | None, recovered: bool, terminal: bool
    ) -> tuple[str, FailureLabels]:
        """The class and the tally series of an event whose combination ``_emit`` found no
        cached answer for: each is computed once (the classifier and the kind guard give a
        combination the same answer every time)."""
        key = (boundary, kind, status, stage, recovered, terminal)
        if self._series_by is not self.classifier or len(self._series) >= _MAX_SERIES_CACHED:
            self._series, self._series_by = {}, self.classifier
        failure_class = self.classifier.classify(kind, status, terminal=terminal).value
        labels = (boundary, self.kinds.label(kind), recovered, failure_class, stage)
        cached = self._series[key] = (failure_class, labels)
        return cached

    def _emit(
        self,
        record: Mapping[str, Any],
        target: _Target,
        recovered: bool,
        own: bool,
        terminal: bool,
        links: list[Link],
    ) -> None:
        span = target.span
        kind = record["failure_kind"]
        stage = record.get("stage")
        status = record.get("http_status")
        if target.counted:
            boundary = record["boundary"]
            cached = self._series.get((boundary, kind, status, stage, recovered, terminal))
            if cached is None or self._series_by is not self.classifier:
                cached = self._classified(boundary, kind, status, stage, recovered, terminal)
            failure_class, labels = cached
        else:
            failure_class, labels = self.classifier.classify(kind, status, terminal=terminal).value, None
        attributes = event_attributes(record)
        attributes[names.RECOVERED] = recovered
        attributes[names.CLASS] = failure_class
        if target.extra:
            attributes.update(target.extra)

        for link in links:
            span.add_link(link.context, link.attributes)
        if self._spans:
            span.add_event(names.EVENT, attributes)
        if own:
            _mark_error(span, kind)

        if labels is not None:
            self._failures.add(labels, target.context)
        lines = self.lines
        if lines is not None and lines.active(self.tracer):
            lines.write(names.EVENT, attributes, target.context)  # the event's attributes, as the span has them
        if self._logger is not None:
            self._logger.emit(
                event_name=names.EVENT,
                body=kind,
                attributes=attributes,
                context=trace.set_span_in_context(span),  # the record's span, current or not
                severity_number=SeverityNumber.WARN if recovered else SeverityNumber.ERROR,
            )


class _Target:
    """The span failures go on, with what every event needs from it computed once."""

    __slots__ = ("context", "counted", "entry", "events_room", "extra", "links_room", "recording", "span")

    def __init__(self, span: Span, extra: Mapping[str, Any] | None = None, counted: bool = True) -> None:
        self.span = span
        self.extra = extra
        self.counted = counted
        self.context = span.get_span_context()
        self.entry = index_entry(self.context)  # the link index's form of it, for each event's claim
        self.recording = span.is_recording()
        room: tuple[float, float] = span_room(span) if self.recording else (0, 0)
        self.events_room, self.links_room = room


def _mark_error(span: Span, kind: str) -> None:
    current = getattr(span, "status", None)
    if current is not None and current.status_code is StatusCode.ERROR:
        return  # someone else decided this span's error (and its error.type) first
    span.set_attribute(names.ERROR_TYPE, kind)
    span.set_status(Status(StatusCode.ERROR, kind))


def causes_first(events: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records ordered so that each cause comes before its effects (reports are acyclic)."""
    if len(events) == 1:
        return list(events.values())  # a failed attempt, a callee's own failure
    done: set[str] = set()
    ordered: list[Mapping[str, Any]] = []
    for event_id in events:
        stack = []
        current: str | None = event_id
        while current is not None and current not in done and current in events:
            done.add(current)
            stack.append(events[current])
            current = events[current].get("cause_id")
        ordered.extend(reversed(stack))
    return ordered


def as_report(failure: Failure) -> FailureReport | None:
    if isinstance(failure, FailureReport):
        return failure
    if isinstance(failure, BaseException):
        return failure_report_for(failure)
    raise TypeError(f"expected an NgFailureEvent, a FailureReport or an exception, not {type(failure).__name__}")


# -- the process-wide recorder ---------------------------------------------------------------


def _enabled_from_env() -> bool:
    # A bad NG_OTEL_* variable leaves everything off, as enable() does, with its warning.
    try:
        return Settings.resolve().enabled
    except SettingsError as error:
        warn_not_enabled(str(error))
        return False


_enabled = _enabled_from_env()
_recorder: FailureRecorder | None = None
_recorder_lock = threading.Lock()


def get_recorder() -> FailureRecorder:
    """The installed recorder, or one bound to the global providers on first use."""
    global _recorder
    if _recorder is None:
        with _recorder_lock:
            if _recorder is None:
                _recorder = FailureRecorder(
                    trace.get_tracer(names.INSTRUMENTATION_SCOPE, __version__),
                    metrics.get_meter(names.INSTRUMENTATION_SCOPE, __version__),
                    get_logger(names.INSTRUMENTATION_SCOPE, __version__),
                    _settings_or_defaults(),
                )
    return _recorder


def _settings_or_defaults() -> Settings:
    try:
        return Settings.resolve()
    except SettingsError:  # changed since start-up: the start-up decision stands
        return Settings()


def install_recorder(recorder: FailureRecorder | None, *, enabled: bool = True) -> None:
    """Make ``recorder`` the process-wide one (``None``: rebuild from globals on next use)."""
    global _recorder, _enabled
    with _recorder_lock:
        _recorder, _enabled = recorder, enabled


def is_enabled() -> bool:
    return _enabled


def record_failure(failure: Failure, *, span: Span | None = None) -> None:
    """Record a failure as the current operation's own: an ``NgFailureEvent``, a
    ``FailureReport`` or any exception with a Gym failure in its explicit chain.

    Events go on ``span`` (default: the current span), the report's own failure marks the span
    ERROR, and the current request's failure log (if any) keeps the report for the reply.
    Never raises.
    """
    if _enabled:
        _record(failure, span, own=True)


def observe_failure(event: Failure, *, attempt: int | None = None) -> None:
    """Record a failure recovered inside the current request (for example a retried model
    attempt): ``recovered=true``, no span status, and kept for the reply's report, where it
    never becomes the ``failure_id``. ``attempt``: the failed attempt's resend count in your
    own retry loop (0 for the first attempt, 1 for the first resend, ...), written as
    ``http.request.resend_count`` (``ng_otel.retry_loop`` also counts the loop's outcome).
    Never raises."""
    if _enabled:
        _record(event, None, own=False, extra=None if attempt is None else {names.RESEND_COUNT: attempt})


@guarded
def _record(failure: Failure, span: Span | None, *, own: bool, extra: Mapping[str, Any] | None = None) -> None:
    report = as_report(failure)
    if report is None:
        return
    get_recorder().record(report, span, own=own, recovered=None if own else True, event_attributes=extra)
    log = current_failure_log()
    if log is not None:
        log.add(report, own=own)
