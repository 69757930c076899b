"""A span exporter wrapper that counts the failure events a failed export loses.

The SDK's own self-metrics count spans its queue drops and some export errors, but a batch
refused with a retriable status until the deadline is reported as exported. This wrapper
sees every export's result, so a lost ``ng.failure`` event is never silent:
``ng.failures.unexported`` counts them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.metrics import Counter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ng_otel.otel import names


class LossCountingSpanExporter(SpanExporter):
    """Delegates to ``inner``; counts the ``ng.failure`` events of every export by its result:
    a failure adds them to ``lost``, and the running totals (``exported_events``,
    ``failed_events``) tell a caller such as ``ng-otel replay`` what got where it was sent."""

    def __init__(self, inner: SpanExporter, lost: Counter) -> None:
        self._inner = inner
        self._lost = lost
        self._lock = threading.Lock()
        self.exported_events = 0
        self.failed_events = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        events = sum(1 for span in spans for event in span.events if event.name == names.EVENT)
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.exported_events += events
            else:
                self.failed_events += events
        if events and result is not SpanExportResult.SUCCESS:
            self._lost.add(events)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)
