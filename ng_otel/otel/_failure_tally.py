"""``FailureTally``: the ``ng.failures`` counts, kept where a failing request can afford them.

A failing reply counts one failure per event, on the request's own time. The SDK's
synchronous ``Counter.add`` costs about 4 µs a call (it copies and cleans the attributes,
builds a measurement and offers it to the exemplar filter); adding one to a dict entry costs
a tenth of that. So the counts live here, and an observable counter reports the totals when a
metric reader collects, off the request path.

Exemplars survive: a series that grew since the last collection reports the span of its
latest failure as the observation's context, which the SDK's exemplar filter turns into an
exemplar (trace id and span id) exactly as it would for ``Counter.add``. A series that did not
grow reports no exemplar, so an exemplar always belongs to its collection interval.

One tally per meter: the SDK keeps the first observable counter registered under a name and
ignores the callbacks of later ones, so every recorder bound to the same meter shares it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from weakref import WeakKeyDictionary

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext

from ng_otel.otel import names

FailureLabels = tuple[str, str, bool, str, "str | None"]
"""(boundary, kind label, recovered, class, stage or None): the bounded attributes of a count."""


class _Series:
    __slots__ = ("count", "latest", "reported")

    def __init__(self, latest: SpanContext | None) -> None:
        self.count = 1
        self.latest = latest  # where the latest failure was recorded: the exemplar
        self.reported = 0  # the count at the last collection


class FailureTally:
    """Thread-safe running totals of ``ng.failures`` by label set."""

    __slots__ = ("_lock", "_series")

    def __init__(self) -> None:
        self._series: dict[FailureLabels, _Series] = {}
        self._lock = threading.Lock()

    def add(self, labels: FailureLabels, span_context: SpanContext | None) -> None:
        """Count one failure; ``span_context`` is where it was recorded (the exemplar)."""
        self._lock.acquire()  # acquire/release, not `with`: half its cost, and this runs per event
        try:
            series = self._series.get(labels)
            if series is None:
                self._series[labels] = _Series(span_context)
            else:
                series.count += 1
                if span_context is not None:
                    series.latest = span_context
        finally:
            self._lock.release()

    def observe(self, options: CallbackOptions | None = None) -> Iterable[Observation]:
        """The observable counter's callback: one cumulative observation per series."""
        with self._lock:
            totals = []
            for labels, series in self._series.items():
                grew = series.count != series.reported
                totals.append((labels, series.count, series.latest if grew else None))
                series.reported = series.count
        return [Observation(count, _attributes(labels), _exemplar_context(latest)) for labels, count, latest in totals]


def _attributes(labels: FailureLabels) -> dict[str, str | bool]:
    boundary, kind, recovered, failure_class, stage = labels
    attributes: dict[str, str | bool] = {
        names.BOUNDARY: boundary,
        names.KIND: kind,
        names.RECOVERED: recovered,
        names.CLASS: failure_class,
    }
    if stage is not None:
        attributes[names.STAGE] = stage
    return attributes


def _exemplar_context(span_context: SpanContext | None) -> Context | None:
    if span_context is None or not span_context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context))


_tallies: WeakKeyDictionary[Meter, FailureTally] = WeakKeyDictionary()
_tallies_lock = threading.Lock()


def failure_tally(meter: Meter) -> FailureTally:
    """The tally behind ``meter``'s ``ng.failures`` observable counter, registered on first use."""
    with _tallies_lock:
        tally = _tallies.get(meter)
        if tally is None:
            tally = _tallies[meter] = FailureTally()
            meter.create_observable_counter(
                names.FAILURES_METRIC,
                callbacks=[tally.observe],
                unit=names.FAILURES_UNIT,
                description=names.FAILURES_DESCRIPTION,
            )
        return tally
