"""Hostile input, privacy and concurrency: nothing escapes, nothing leaks, nothing mixes."""

import asyncio
import json
import logging
import sys
import threading

import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from ng_otel import NgFailureEvent, observe_failure, record_failure
from ng_otel.contract import FailureReport, failure_report_for
from ng_otel.contract.events import ForeignError
from ng_otel.integrations import instrument_app
from ng_otel.otel.failure_log import close_failure_log, open_failure_log
from ng_otel.otel.links import decode_context_header
from ng_otel.otel.providers import RepeatLimit
from ng_otel.testing import capture_failures
from tests.conftest import call

SECRET = "sk-live-4f9a1c2e8b7d6a5f-SECRET"


@st.composite
def exception_graphs(draw):
    """Up to 40 exceptions, Gym or foreign, whose __cause__ and __context__ point anywhere,
    cycles included."""
    count = draw(st.integers(1, 40))
    nodes = []
    for index in range(count):
        if draw(st.booleans()):
            nodes.append(
                NgFailureEvent(
                    draw(st.sampled_from(["cancelled", "transport_timeout", "x:y"])),
                    draw(st.text(max_size=50)),
                    boundary="agent",
                )
            )
        else:
            nodes.append(draw(st.sampled_from([ValueError, KeyError, RuntimeError, OSError]))(str(index)))
    for node in nodes:
        if draw(st.booleans()):
            node.__cause__ = nodes[draw(st.integers(0, count - 1))]
        if draw(st.booleans()):
            node.__context__ = nodes[draw(st.integers(0, count - 1))]
    return nodes[draw(st.integers(0, count - 1))]


@settings(max_examples=300, deadline=None)
@given(exception_graphs())
def test_random_exception_graphs_give_valid_acyclic_reports(error):
    report = failure_report_for(error)
    if report is not None:
        again = FailureReport.from_header(report.to_header()) if report.to_header() != '{"omitted":true}' else report
        assert again == report
        assert len(report.chain()) <= len(report)  # terminates: the chain is acyclic


@settings(max_examples=100, deadline=None)
@given(exception_graphs())
def test_recording_random_exception_graphs_never_raises(error):
    with capture_failures() as telemetry:
        record_failure(error)
        observe_failure(error)
    telemetry.assert_exported_once()


def test_a_deep_chain_at_the_recursion_limit_is_recorded():
    depth = sys.getrecursionlimit() * 3
    error = NgFailureEvent("cancelled", "0", boundary="agent")
    for index in range(1, depth):
        wrapper = NgFailureEvent("cancelled", str(index), boundary="agent")
        wrapper.__cause__ = error
        error = wrapper
    with capture_failures() as telemetry:
        record_failure(error)
    assert telemetry.count() == depth


def test_type_names_in_records_are_never_imported(monkeypatch):
    imported = []
    real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
    monkeypatch.setattr(
        "builtins.__import__", lambda name, *a, **k: imported.append(name) or real_import(name, *a, **k)
    )
    record = {
        "event_id": "e",
        "boundary": "model",
        "failure_kind": "judge_failed",
        "failure_reason": "r",
        "foreign_error": {"type": "os.system", "message": "rm -rf /"},
    }
    event = NgFailureEvent.from_record(record)
    report = FailureReport.from_header(json.dumps({"failure_id": "e", "events": {"e": record}}))
    assert event.foreign_error == ForeignError("os.system", "rm -rf /")
    assert report.events["e"]["foreign_error"]["type"] == "os.system"
    assert "os.system" not in imported and "os" not in imported


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_cr_lf_and_non_ascii_never_reach_a_header_unescaped(reason):
    event = NgFailureEvent("judge_failed", reason, boundary="resources_server")
    value = failure_report_for(event).to_header()
    assert value.isascii() and "\r" not in value and "\n" not in value and "\x00" not in value
    assert FailureReport.from_header(value).events[event.event_id]["failure_reason"] == event.failure_reason


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_hostile_context_headers_raise_only_value_error(value):
    try:
        decode_context_header(value)
    except ValueError:
        pass


def test_a_secret_in_failure_reason_reaches_no_metric_no_other_header_and_no_log_at_info(caplog):
    app = FastAPI()

    @app.post("/run")
    async def run():
        observe_failure(NgFailureEvent("provider_unavailable", f"retry with key {SECRET}", boundary="model"))
        raise NgFailureEvent("agent_run_error", f"token={SECRET}", boundary="agent", http_status=502)

    with caplog.at_level(logging.DEBUG), capture_failures() as telemetry:
        status, headers, body = asyncio.run(call(instrument_app(app), "/run"))
        logging.getLogger("ng_otel").info("after the request")  # the capture works at INFO
    assert status == 502
    assert SECRET in headers["x-ng-failure-report"]  # the report is the one place it may travel
    assert all(SECRET not in value for name, value in headers.items() if name != "x-ng-failure-report")
    for metric in ("ng.failures", "ng.verify.outcomes", "ng.failure_reports.omitted"):
        assert SECRET not in json.dumps(telemetry.metric_points(metric))
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and SECRET in r.getMessage()]
    assert any(SECRET in event["ng.failure.reason"] for event in telemetry.failure_events())  # events keep it


def test_failures_observed_in_concurrent_threads_never_mix():
    reports = {}

    def request(tag):
        log = open_failure_log()
        try:
            for step in range(20):
                observe_failure(NgFailureEvent("transport_timeout", f"{tag}:{step}", boundary="model"))
            reports[tag] = log.report
        finally:
            close_failure_log(log)

    with capture_failures() as telemetry:
        threads = [threading.Thread(target=request, args=(tag,)) for tag in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for tag, report in reports.items():
        assert sorted(r["failure_reason"] for r in report.events.values()) == sorted(f"{tag}:{s}" for s in range(20))
    assert telemetry.count() == 16 * 20


def test_sync_handlers_in_the_threadpool_never_see_each_others_failures():
    app = FastAPI()

    @app.post("/work")
    def work(body: dict):
        observe_failure(NgFailureEvent("transport_timeout", f"request {body['tag']}", boundary="model"))
        return {"tag": body["tag"]}

    async def many():
        wrapped = instrument_app(app)
        return await asyncio.gather(*(call(wrapped, "/work", json.dumps({"tag": t}).encode()) for t in range(40)))

    with capture_failures():
        replies = asyncio.run(many())
    for tag, (_, headers, _) in enumerate(replies):
        report = FailureReport.from_header(headers["x-ng-failure-report"])
        assert [r["failure_reason"] for r in report.events.values()] == [f"request {tag}"]


def test_the_sdks_per_span_queue_full_warning_is_limited_to_one_per_interval(caplog):
    logger = logging.getLogger("ng_otel.test.repeat")
    scheduled = []  # the interval's end, which the test brings about itself
    limit = RepeatLimit(logger, interval=60, schedule=lambda seconds, action: scheduled.append((seconds, action)))
    logger.addFilter(limit)
    try:
        with caplog.at_level(logging.WARNING, logger="ng_otel.test.repeat"):
            for _ in range(1000):
                logger.warning("Queue full, dropping %s.", "span")
            # The repeats are stopped by the level, before any record is built.
            assert not logger.isEnabledFor(logging.WARNING)
            logger.error("an export failed")
            ((seconds, reopen),) = scheduled
            assert seconds == 60
            reopen()
            assert logger.isEnabledFor(logging.WARNING)
            logger.warning("Queue full, dropping %s.", "span")
        scheduled[-1][1]()  # the second interval ends after caplog restored the logger's level
    finally:
        logger.filters.clear()
    assert [r.getMessage() for r in caplog.records] == [
        "Queue full, dropping span.",
        "an export failed",
        "Queue full, dropping span.",
    ]
    assert logger.level == logging.NOTSET  # a level someone else set meanwhile is kept


@pytest.mark.parametrize("size", [10, 10_000, 1_000_000])
def test_oversized_reasons_and_reports_stay_bounded(size):
    event = NgFailureEvent("judge_failed", "r" * size, boundary="model")
    assert len(event.failure_reason) <= 2000
    report = failure_report_for(event)
    for _ in range(50):
        report = report.merge(failure_report_for(NgFailureEvent("cancelled", "q" * 1999, boundary="agent")))
    assert len(report.to_header()) <= 4096
