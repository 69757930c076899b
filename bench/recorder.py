"""record_failure vs the bare SDK doing the same work by hand, and the disabled call site.

Targets: one event with one cause link at most 3x the bare SDK (span.add_event with the same
attributes, span.add_link, counter.add); disabled at most 2x an empty function call.
Run: .venv/bin/python bench/recorder.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import per_call_seconds, report
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanLimits, TracerProvider

from ng_otel.contract import NgFailureEvent
from ng_otel.otel import names
from ng_otel.otel import recorder as recorder_module
from ng_otel.otel.recorder import FailureRecorder, install_recorder, record_failure

NUMBER, ROUNDS = 2000, 15


def main() -> bool:
    tracer_provider = TracerProvider(span_limits=SpanLimits(max_events=10**7, max_links=10**7))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracer = tracer_provider.get_tracer("bench")
    recorder = FailureRecorder(tracer, meter_provider.get_meter("ng_otel"))
    install_recorder(recorder)
    counter = meter_provider.get_meter("bare").create_counter(names.FAILURES_METRIC, unit=names.FAILURES_UNIT)

    cause = NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)
    with tracer.start_as_current_span("cause"):
        record_failure(cause)
    cause_context = recorder.index.get(cause.event_id)
    assert cause_context is not None

    def effect() -> NgFailureEvent:
        event = NgFailureEvent("agent_run_error", "run failed", boundary="agent", stage="agent", http_status=500)
        event.__cause__ = cause
        return event

    total = NUMBER * (ROUNDS + 1) + 200
    effects = iter([effect() for _ in range(total)])
    bare_events = iter([effect() for _ in range(total)])
    span = tracer.start_span("request")

    def ours() -> None:
        record_failure(next(effects), span=span)

    def bare() -> None:
        event = next(bare_events)
        attributes = {
            names.ID: event.event_id,
            names.BOUNDARY: event.boundary,
            names.KIND: event.failure_kind,
            names.REASON: event.failure_reason,
            names.RECOVERED: False,
            names.CLASS: "infra",
            names.CAUSE_ID: cause.event_id,
            names.STAGE: "agent",
            names.HTTP_STATUS: 500,
        }
        span.add_link(
            cause_context,
            {names.LINK_TYPE: names.LINK_CAUSED_BY, names.ID: event.event_id, names.CAUSE_ID: cause.event_id},
        )
        span.add_event(names.EVENT, attributes)
        counter.add(
            1,
            {
                names.BOUNDARY: "agent",
                names.KIND: "agent_run_error",
                names.RECOVERED: False,
                names.CLASS: "infra",
                names.STAGE: "agent",
            },
        )

    times = per_call_seconds({"ours": ours, "bare": bare}, number=NUMBER, rounds=ROUNDS)
    ok = report("record_failure, one event + one cause link", times["ours"], times["bare"], target=3.0)

    recorder_module._enabled = False
    event = effect()

    def empty(failure: object, *, span: object = None) -> None:
        return None

    def disabled() -> None:
        record_failure(event)

    def baseline() -> None:
        empty(event)

    times = per_call_seconds({"disabled": disabled, "empty": baseline}, number=200_000, rounds=ROUNDS)
    ok &= report("disabled record_failure vs empty call", times["disabled"], times["empty"], target=2.0, unit="ns")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
