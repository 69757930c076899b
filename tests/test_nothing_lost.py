"""What the second hardening round closed: each test failed on the code before it."""

import asyncio
import json

import pytest
from fastapi import FastAPI
from opentelemetry import metrics, trace

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel.contract import FailureReport
from ng_otel.contract.report import FailureReport as Report
from ng_otel.integrations import instrument_app
from ng_otel.integrations._exchange import observe_reply
from ng_otel.otel import names
from ng_otel.otel.failure_log import FailureLog
from ng_otel.otel.recorder import FailureRecorder, get_recorder, install_recorder, is_enabled
from ng_otel.testing import capture_failures
from tests.conftest import call


def raising(failure):
    app = FastAPI()

    @app.post("/x")
    async def handler():
        raise failure()

    return instrument_app(app)


@pytest.mark.parametrize("status", [101, 200, 204, 304, 399])
def test_a_failure_with_a_non_error_status_is_answered_as_an_error_with_its_body_and_report(status):
    def failure():
        return NgFailureEvent("verifier_error", "odd status", boundary="resources_server", http_status=status)

    with capture_failures():
        reply_status, headers, body = asyncio.run(call(raising(failure), "/x"))
    assert reply_status == 500
    assert json.loads(body)["failure"]["http_status"] == status  # the record keeps the evidence
    assert FailureReport.from_header(headers["x-ng-failure-report"]).failure_id is not None


class SdkErrorWithBrokenStatus(Exception):
    @property
    def status_code(self):
        raise RuntimeError("the SDK's own property is broken")


def test_a_foreign_cause_whose_status_property_raises_still_gives_the_reply_its_report():
    def failure():
        try:
            raise SdkErrorWithBrokenStatus("upstream said no")
        except SdkErrorWithBrokenStatus as err:
            raise NgFailureEvent("provider_unavailable", "provider down", boundary="model") from err

    def top():
        try:
            failure()
        except NgFailureEvent as error:
            return error

    with capture_failures() as telemetry:
        status, headers, _ = asyncio.run(call(raising(top), "/x"))
    assert status == 500
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert report.events[report.failure_id]["foreign_error"]["message"] == "upstream said no"
    assert telemetry.count() == 1


def a_remote_report():
    try:
        raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    except NgFailureEvent as error:
        return failure_report_for(error)


def test_events_a_callees_context_map_does_not_name_are_exported_by_the_caller():
    report = a_remote_report()
    headers = {names.REPORT_HEADER: report.to_header(), names.CONTEXT_HEADER: "{}"}
    with capture_failures() as telemetry, telemetry.tracer.start_as_current_span("POST /run"):
        observe_reply(headers.get, "harness")
    assert [e["ng.failure.id"] for e in telemetry.failure_events()] == list(report.events)
    assert telemetry.count() == 1


def test_without_an_sdk_provider_a_reply_never_claims_its_events_were_exported():
    # enable() never called: the recorder has the API's no-op tracer, which exports nothing.
    previous, was_enabled = get_recorder(), is_enabled()
    install_recorder(FailureRecorder(trace.NoOpTracer(), metrics.NoOpMeter("test")))
    try:
        app = raising(lambda: NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
        _, headers, _ = asyncio.run(call(app, "/x"))
    finally:
        install_recorder(previous, enabled=was_enabled)
    assert names.REPORT_HEADER.lower() in headers
    assert names.CONTEXT_HEADER.lower() not in headers  # so a caller with an SDK exports them itself


def test_thousands_of_failures_in_one_request_are_merged_in_place_not_copied_per_failure(monkeypatch):
    merges = []
    monkeypatch.setattr(Report, "merge", lambda self, other: merges.append(1) or self)
    log = FailureLog()
    events = []
    for n in range(5_000):
        report = a_remote_report()
        events.append(report.failure_id)
        log.add(report, own=(n == 0))
    assert merges == []
    assert list(log.report.events) == events and log.report.failure_id == events[0]
