import logging
import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from ng_otel import record_failure
from ng_otel.contract import failure_report_for
from ng_otel.otel import names
from ng_otel.otel._failure_tally import failure_tally
from ng_otel.otel.recorder import FailureRecorder
from ng_otel.testing import capture_failures
from tests.conftest import model_timeout, three_level


def _points(reader):
    data = reader.get_metrics_data()
    return [
        point
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if metric.name == names.FAILURES_METRIC
        for point in metric.data.data_points
    ]


def test_counts_are_a_monotonic_sum_by_bounded_labels():
    with capture_failures() as telemetry:
        record_failure(three_level())
        record_failure(model_timeout())
    (metric,) = [
        metric
        for resource_metrics in telemetry.metric_reader.get_metrics_data().resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if metric.name == names.FAILURES_METRIC
    ]
    assert metric.data.is_monotonic and metric.unit == names.FAILURES_UNIT
    # The attributes of each series are checked whole in test_recorder; here: one series per
    # label set, and a second failure with the same labels adds to it.
    assert len(telemetry.metric_points()) == 3
    assert telemetry.count(kind="transport_timeout", boundary="model") == 2


def test_a_series_that_grew_carries_its_latest_failure_as_exemplar_and_only_then():
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("first"):
            record_failure(model_timeout())
        with telemetry.tracer.start_as_current_span("second") as second:
            record_failure(model_timeout())
        (point,) = _points(telemetry.metric_reader)
        (exemplar,) = point.exemplars
        context = second.get_span_context()
        assert (exemplar.trace_id, exemplar.span_id) == (context.trace_id, context.span_id)
        (unchanged,) = _points(telemetry.metric_reader)
        assert unchanged.value == 2 and unchanged.exemplars == []


def test_an_unsampled_failure_is_counted_without_an_exemplar():
    with capture_failures() as telemetry:
        with TracerProvider(sampler=ALWAYS_OFF).get_tracer("x").start_as_current_span("dropped"):
            record_failure(model_timeout())
        (point,) = _points(telemetry.metric_reader)
    assert point.value == 1 and point.exemplars == []


def test_recorders_on_one_meter_share_one_series_without_a_duplicate_instrument(caplog):
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("one")
    tracer = TracerProvider().get_tracer("t")
    with caplog.at_level(logging.WARNING):
        first, second = FailureRecorder(tracer, meter), FailureRecorder(tracer, meter)
    first.record(failure_report_for(three_level()), own=True)
    second.record(failure_report_for(three_level()), own=True)
    assert {point.attributes["ng.failure.boundary"]: point.value for point in _points(reader)} == {
        "model": 2,
        "harness": 2,
        "agent": 2,
    }
    assert failure_tally(meter) is first._failures is second._failures
    assert not [record for record in caplog.records if "already" in record.getMessage()]


def test_concurrent_counts_are_exact():
    tally = failure_tally(MeterProvider().get_meter("threads"))
    labels = ("model", "transport_timeout", False, "infra", None)

    def count() -> None:
        for _ in range(10_000):
            tally.add(labels, None)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (observation,) = tally.observe()
    assert observation.value == 80_000
