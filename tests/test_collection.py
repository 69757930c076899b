import pytest

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel.contract import FailureReport
from ng_otel.integrations.collection import replay_rows, report_row, row_report
from ng_otel.testing import CapturedTelemetry, capture_failures
from tests.test_events import raise_chain


def chain():
    return raise_chain(
        NgFailureEvent("transport_timeout", "model timed out", boundary="model"),
        NgFailureEvent("agent_run_error", "run failed", boundary="agent"),
    )


def test_row_keys_round_trip_and_healthy_rows_get_none():
    report = failure_report_for(chain()).merge(FailureReport(omitted=True))
    row = report_row(report, contexts={})
    assert set(row) == {"_ng_failure_events", "_ng_failure_id", "_ng_failure_events_omitted"}
    assert row_report(row) == report
    assert report_row(None) == {} and report_row(FailureReport()) == {}
    assert row_report({"result": 1}) is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"_ng_failure_events": {"a": {"event_id": "a"}}}, "events.a"),
        ({"_ng_failure_events_omitted": "yes"}, "_ng_failure_events_omitted"),
        ({"_ng_failure_id": "missing"}, "failure_id"),
        ([1, 2], "row"),
    ],
)
def test_bad_rows_raise_a_clear_error(row, message):
    with pytest.raises(ValueError, match=message):
        row_report(row)


def test_replay_links_to_live_spans_instead_of_exporting_again():
    live = CapturedTelemetry()
    top = chain()
    with live.tracer.start_as_current_span("POST /run"):
        live.recorder.record(failure_report_for(top), own=True)
    live_contexts = live.recorder.index.contexts_for([top.event_id, top.__cause__.event_id])
    live_row = report_row(failure_report_for(top), contexts=live_contexts)
    offline = chain()
    rows = [live_row, {"result": "healthy"}, {"_ng_failure_events": 5}, report_row(failure_report_for(offline), {})]
    with capture_failures() as telemetry:
        summary = replay_rows(rows)
    assert (summary.rows, summary.with_failures, summary.events_recorded) == (4, 2, 2)
    assert summary.skipped == [(3, "invalid failure report: events: Input should be a valid dictionary")]
    (span,) = telemetry.spans()
    assert span["name"] == "ng.replay"
    assert [e["attributes"]["ng.failure.id"] for e in span["events"]] == [offline.__cause__.event_id, offline.event_id]
    telemetry.assert_linked()


def test_replay_of_rows_without_contexts_exports_each_event_once():
    rows = [report_row(failure_report_for(chain()), {}) for _ in range(3)]
    with capture_failures() as telemetry:
        summary = replay_rows(rows + rows)
    assert summary.events_recorded == 6 and telemetry.count() == 6
    telemetry.assert_exported_once()
    telemetry.assert_linked()
