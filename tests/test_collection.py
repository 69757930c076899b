import pytest

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel.contract import FailureReport
from ng_otel.gym.collection import replay_rows, report_row, row_report
from ng_otel.testing import CapturedTelemetry, capture_failures
from tests.conftest import raise_chain


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


def test_replay_has_the_live_chains_shape_and_links_to_the_live_spans():
    live = CapturedTelemetry()
    cause = NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    with live.tracer.start_as_current_span("model POST /v1/chat"):
        live.recorder.record(failure_report_for(cause), own=True)
    top = raise_chain(cause, NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
    with live.tracer.start_as_current_span("agent POST /run"):
        live.recorder.record(failure_report_for(top), own=True)
    contexts = live.recorder.index.contexts_for([top.event_id, cause.event_id])
    live_row = report_row(failure_report_for(top), contexts=contexts)
    offline = chain()
    rows = [live_row, {"result": "healthy"}, {"_ng_failure_events": 5}, report_row(failure_report_for(offline), {})]
    with capture_failures() as telemetry:
        summary = replay_rows(rows, include_live=True)  # a backend that did not see the live run
    assert (summary.rows, summary.with_failures, summary.events_recorded) == (4, 2, 4)
    assert [(line.line, line.reason) for _, line in summary.skipped.listed] == [
        (3, "invalid failure report: events: Input should be a valid dictionary")
    ]
    spans = {tuple(e["attributes"]["ng.failure.id"] for e in span["events"]): span for span in telemetry.spans()}
    assert set(spans) == {(cause.event_id,), (top.event_id,), (offline.__cause__.event_id, offline.event_id)}
    assert {span["name"] for span in spans.values()} == {"ng.replay"}
    model_span, agent_span = spans[(cause.event_id,)], spans[(top.event_id,)]
    live_spans = {span["name"]: span["context"] for span in live.spans()}
    assert model_span["links"] == [
        {"context": live_spans["model POST /v1/chat"], "attributes": {"ng.link.type": "replay_of"}}
    ]
    caused_by = [link for link in agent_span["links"] if link["attributes"]["ng.link.type"] == "caused_by"]
    assert [link["context"] for link in caused_by] == [model_span["context"]]
    telemetry.assert_linked()
    telemetry.assert_exported_once()


def test_replay_into_the_backend_that_saw_the_run_exports_nothing_the_live_run_exported():
    live = CapturedTelemetry()
    cause = NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    with live.tracer.start_as_current_span("model POST /v1/chat"):
        live.recorder.record(failure_report_for(cause), own=True)
    top = raise_chain(cause, NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
    # Only the model's event was exported live: the agent's is the row's alone.
    live_row = report_row(failure_report_for(top), contexts=live.recorder.index.contexts_for([cause.event_id]))
    with capture_failures() as telemetry:
        summary = replay_rows(
            [
                live_row,
                live_row
                | {
                    "_ng_failure_contexts": {
                        cause.event_id: live_row["_ng_failure_contexts"][cause.event_id],
                        top.event_id: live_row["_ng_failure_contexts"][cause.event_id],
                    }
                },
            ]
        )
    assert (summary.live, summary.events_recorded) == (1, 1)
    (event,) = telemetry.failure_events()
    assert event["ng.failure.id"] == top.event_id  # the live one was linked to, not copied
    (span,) = telemetry.spans()
    (link,) = span["links"]
    live_span = next(s for s in live.spans() if s["name"] == "model POST /v1/chat")
    assert link["context"] == live_span["context"] and link["attributes"]["ng.link.type"] == "caused_by"


def test_replay_of_rows_without_contexts_exports_each_event_once():
    rows = [report_row(failure_report_for(chain()), {}) for _ in range(3)]
    with capture_failures() as telemetry:
        summary = replay_rows(rows + rows, count=True)
    assert summary.events_recorded == 6 and telemetry.count() == 6
    telemetry.assert_exported_once()
    telemetry.assert_linked()
