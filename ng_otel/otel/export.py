"""A span exporter wrapper that counts the failure events a failed export loses.

The SDK's own self-metrics count spans its queue drops and some export errors, but a batch
refused with a retriable status until the deadline is reported as exported. This wrapper
sees every export's result, so a lost ``ng.failure`` event is never silent:
``ng.failures.unexported`` counts them.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.metrics import Counter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ng_otel.otel import names


class LossCountingSpanExporter(SpanExporter):
    """Delegates to ``inner``; when an export fails, counts the ``ng.failure`` events in it."""

    def __init__(self, inner: SpanExporter, lost: Counter) -> None:
        self._inner = inner
        self._lost = lost

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            events = sum(1 for span in spans for event in span.events if event.name == names.EVENT)
            if events:
                self._lost.add(events)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)
