"""What the second hardening round closed: each test failed on the code before it."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from opentelemetry import metrics, trace

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel import observe_failure as ng_otel_observe
from ng_otel import record_failure as ng_otel_record
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


def test_a_log_answers_its_first_own_report_as_it_is_and_a_merged_one_after_more_additions():
    own, omitted, callee = a_remote_report(), Report(omitted=True), a_remote_report()
    log = FailureLog()
    log.add(own, own=True)
    assert log.report is own  # built from nothing else: no copy
    log.add(omitted, own=False)
    log.add(callee, own=False)
    assert log.report is not own
    assert list(log.report.events) == [own.failure_id, callee.failure_id]
    assert log.report.failure_id == own.failure_id and log.report.omitted
    later = FailureLog()
    later.add(omitted, own=False)
    later.add(own, own=True)  # not the first: the omission it holds stays
    assert later.report.omitted and later.report.failure_id == own.failure_id


def test_a_closed_log_lets_go_of_its_records_and_takes_no_more():
    # A context copied during the request keeps its log after the request closed: the log
    # must keep nothing there, and a task that outlived the request must add nothing to it.
    from ng_otel.otel.failure_log import close_failure_log, current_failure_log, open_failure_log

    log = open_failure_log()
    log.add(a_remote_report(), own=True)
    log.add(a_remote_report(), own=False)
    assert log and len(log.report.events) == 2 and current_failure_log() is log
    close_failure_log(log)
    assert current_failure_log() is None and not log and log.report.events == {}
    log.add(a_remote_report(), own=False)  # a task that outlived the request
    assert not log and log.report.events == {} and log.last_callee_failure is None


def long_chain(length):
    """``length`` Gym events, each raised from the one before: effect first."""
    error = None
    for n in range(length):
        try:
            raise NgFailureEvent("transport_timeout", f"attempt {n}", boundary="model") from error
        except NgFailureEvent as raised:
            error = raised
    return error


def test_a_chain_longer_than_a_span_keeps_loses_nothing_and_its_root_cause_stays():
    # The SDK keeps 128 events a span (OTEL_SPAN_EVENT_COUNT_LIMIT) and drops the oldest: the
    # root causes. What does not fit goes on short spans in the same trace.
    top = long_chain(200)
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run") as server:
            ng_otel_record(top)
            span_id = server.get_span_context().span_id
    events = telemetry.failure_events()
    report = failure_report_for(top)
    assert sorted(e["ng.failure.id"] for e in events) == sorted(report.events)  # all 200, once each
    (root,) = [r for r in report.events.values() if "cause_id" not in r]
    spans = telemetry.spans()
    server_span = next(s for s in spans if s["name"] == "POST /run")
    assert root["event_id"] in [e["attributes"]["ng.failure.id"] for e in server_span["events"]]
    assert len(server_span["events"]) == 128 and server_span["status"] == "ERROR"
    late = [s for s in spans if s["name"] == "ng.failure transport_timeout"]
    assert len(late) == 72 and all(s["parent"]["span_id"] == span_id for s in late)
    assert all(len(s["links"]) == 1 for s in late)  # each effect still links to its cause's span
    assert telemetry.count() == 200


def test_more_cause_links_than_a_span_takes_go_with_their_events_onto_short_spans():
    # 150 causes a callee exported on spans of its own, each the cause of one local event.
    with capture_failures() as telemetry:
        causes = []
        for n in range(150):
            cause = NgFailureEvent("transport_timeout", f"remote {n}", boundary="model")
            where = trace.SpanContext(n + 1, n + 1, is_remote=True, trace_flags=trace.TraceFlags(1))
            get_recorder().learn_remote(failure_report_for(cause), {cause.event_id: where})
            causes.append(cause)
        with telemetry.tracer.start_as_current_span("POST /run"):
            for cause in causes:
                try:
                    raise NgFailureEvent("agent_run_error", "gave up", boundary="agent") from cause
                except NgFailureEvent as effect:
                    ng_otel_observe(effect)
    links = [link for span in telemetry.spans() for link in span["links"]]
    assert len(links) == 150  # 128 on the span, 22 on short spans
    assert len(telemetry.failure_events()) == 150


def test_a_deeply_nested_context_header_is_a_protocol_violation_and_the_report_survives():
    report = a_remote_report()
    headers = {names.REPORT_HEADER: report.to_header(), names.CONTEXT_HEADER: "[" * 2000 + "]" * 2000}
    with capture_failures() as telemetry, telemetry.tracer.start_as_current_span("POST /run"):
        assert observe_reply(headers.get, "harness") == report
    kinds = [e["ng.failure.kind"] for e in telemetry.failure_events()]
    assert kinds == ["protocol_violation"]  # the peer exported its own events: only the links are lost


def test_a_deeply_nested_verify_reply_passes_through_untouched():
    app = FastAPI()
    nested = "[" * 5000 + "]" * 5000

    @app.post("/verify")
    async def verify():
        from fastapi.responses import Response

        return Response(nested, media_type="application/json")

    with capture_failures() as telemetry:
        status, _, body = asyncio.run(call(instrument_app(app), "/verify"))
    assert status == 200 and body.decode() == nested and telemetry.count(names.VERIFY_METRIC) == 0


def test_a_verify_reply_of_twenty_thousand_chunks_arrives_whole_and_is_counted():
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    text = json.dumps({"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed", "pad": "x" * 20_000})

    @app.post("/verify")
    async def verify():
        return StreamingResponse((c.encode() for c in text), media_type="application/json")

    with capture_failures() as telemetry:
        status, _, body = asyncio.run(call(instrument_app(app), "/verify"))
    assert status == 200 and body.decode() == text
    points = telemetry.metric_points(names.VERIFY_METRIC)
    assert [(p["attributes"][names.VERIFY_MASKED], p["value"]) for p in points] == [(True, 1)]


def test_a_failure_after_a_plain_reply_started_aborts_it_naming_the_kind_never_the_reason():
    from fastapi.responses import StreamingResponse

    from ng_otel.integrations.asgi import ReplyBroken

    app = FastAPI()

    @app.post("/download")
    async def download():
        async def parts():
            yield b"first part"
            raise NgFailureEvent("session_lost", "secret customer data in the reason", boundary="environment")

        return StreamingResponse(parts(), media_type="application/octet-stream")

    with capture_failures() as telemetry, pytest.raises(ReplyBroken) as raised:
        asyncio.run(call(instrument_app(app), "/download"))
    assert str(raised.value) == "session_lost after the reply started" and raised.value.__cause__ is None
    assert "secret" not in repr(raised.value) and telemetry.count() == 1


def test_handled_failures_outside_any_request_stay_bounded_and_keep_the_decisive_one():
    from ng_otel.gym.episodes import MAX_HANDLED_KEPT, _handled, episode_response, handled_episode_failure

    def run():
        first = handled_episode_failure("session_lost", "lost", stage="agent", terminal=True)
        for n in range(MAX_HANDLED_KEPT * 4):
            handled_episode_failure("session_release_failed", f"cleanup {n}", stage="cleanup", terminal=False)
        assert len(_handled.get()) == MAX_HANDLED_KEPT
        response = episode_response({"result": {"x": 1}})
        assert response["failure"]["failure_kind"] == "session_lost"
        assert first.event_id in response["failure_report"]["events"]

    with capture_failures() as telemetry:
        import contextvars

        contextvars.copy_context().run(run)
    assert telemetry.count() == MAX_HANDLED_KEPT * 4 + 1  # every one recorded when handled


SLOW_FLUSH = textwrap.dedent(
    """
    import signal
    import ng_otel
    from opentelemetry import trace

    ng_otel.enable("svc")
    with trace.get_tracer("app").start_as_current_span("POST /run"):
        ng_otel.record_failure(ng_otel.NgFailureEvent("shutdown", "draining", boundary="agent"))
    print("ready", flush=True)
    signal.pause()
    """
)


@contextlib.contextmanager
def flushing_child(script, tmp_path, export_timeout):
    """``script`` in a child process exporting to a collector that accepts the connection and
    never answers: (the child, the collector's socket)."""
    collector = socket.socket()
    collector.bind(("127.0.0.1", 0))
    collector.listen(8)
    collector.settimeout(30)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_"))}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.getsockname()[1]}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TIMEOUT": str(export_timeout),
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
    }
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child, collector
    finally:
        child.kill()
        child.wait()
        collector.close()


def test_a_second_sigterm_during_a_slow_flush_ends_the_process_at_once(tmp_path):
    # The first SIGTERM's flush waits out the exporter's 60 s timeout; the operator's second
    # SIGTERM must not.
    with flushing_child(SLOW_FLUSH, tmp_path, export_timeout=60) as (child, collector):
        child.send_signal(signal.SIGTERM)
        connection, _ = collector.accept()  # the flush is under way: the exporter is connected
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
        connection.close()


SHUTDOWN_THEN_SIGTERM = SLOW_FLUSH.replace(
    "signal.pause()", "from ng_otel.otel.providers import shutdown\nshutdown()\nprint('shut down', flush=True)"
)


def test_a_sigterm_while_shutdown_flushes_lets_the_flush_finish_then_ends_the_process(tmp_path):
    # The handler used to call shutdown() again, on the thread holding shutdown()'s lock: alive
    # at 40 s against a collector that never answers. Now the flush ends within the exporter's
    # timeout and the process ends as SIGTERM says.
    with flushing_child(SHUTDOWN_THEN_SIGTERM, tmp_path, export_timeout=3) as (child, collector):
        connection, _ = collector.accept()  # shutdown() is flushing: the exporter is connected
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == -signal.SIGTERM
        assert child.stdout.read() == ""  # it ended when the flush did, not after going on
        connection.close()


@pytest.mark.parametrize(("value", "handler"), [("1", "flush_then_terminate"), ("0", "the default action")])
def test_the_sigterm_handler_is_a_setting(value, handler):
    script = "import signal, ng_otel\nng_otel.enable('svc')\nh = signal.getsignal(signal.SIGTERM)\n"
    script += "print('the default action' if h is signal.SIG_DFL else h.__name__)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_"))}
    env |= {"NG_OTEL_SIGTERM_FLUSH": value, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == handler, done.stderr


class MeasuredChunk(bytes):
    """A body chunk that counts how often its length is taken."""

    lengths_taken = 0

    def __len__(self):
        MeasuredChunk.lengths_taken += 1
        return super().__len__()


def test_holding_a_verify_reply_takes_each_chunks_length_once_not_once_per_later_chunk():
    from ng_otel.integrations.asgi import FailureReportMiddleware

    chunks = [MeasuredChunk(b" ") for _ in range(2_000)]

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b'{"reward": 1.0}', "more_body": False})

    MeasuredChunk.lengths_taken = 0
    with capture_failures():
        status, _, body = asyncio.run(call(FailureReportMiddleware(app), "/verify"))
    assert status == 200 and body.strip() == b'{"reward": 1.0}'
    assert MeasuredChunk.lengths_taken <= 2 * len(chunks)  # a sum over all held chunks per chunk: ~2,000,000


# -- a report the app set itself, and a peer's claims about our own events ----------------------


def _forwarded_report():
    forwarded = NgFailureEvent("transport_timeout", "the callee's model timed out", boundary="model")
    return forwarded, FailureReport({forwarded.event_id: forwarded.to_record()}, forwarded.event_id)


def test_a_report_the_app_set_itself_joins_ng_otels_in_one_header_on_an_asgi_reply():
    from tests.conftest import call

    forwarded, report = _forwarded_report()
    local = NgFailureEvent("agent_timeout", "a step was retried", boundary="agent")
    app = FastAPI()

    @app.post("/proxy")
    async def proxy():
        ng_otel_observe(local)
        return JSONResponse(
            {"ok": True}, headers={"X-NG-Failure-Report": report.to_header()}
        )  # the callee's, forwarded

    sent = []
    with capture_failures():
        asyncio.run(call(instrument_app(app), "/proxy", sent=sent))
    start = next(m for m in sent if m["type"] == "http.response.start")
    values = [value for name, value in start["headers"] if name.lower() == b"x-ng-failure-report"]
    assert len(values) == 1, values  # aiohttp's headers.get would read the first, stale one
    assert set(FailureReport.from_header(values[0]).events) == {forwarded.event_id, local.event_id}


def test_a_report_the_app_set_itself_joins_ng_otels_in_one_header_on_an_aiohttp_reply():
    import aiohttp
    from aiohttp import web

    from ng_otel.integrations.aiohttp import failure_report_middleware

    forwarded, report = _forwarded_report()
    local = NgFailureEvent("agent_timeout", "a step was retried", boundary="agent")

    async def proxy(request):
        ng_otel_observe(local)
        return web.json_response({"ok": True}, headers={"X-NG-Failure-Report": report.to_header()})

    async def scenario():
        app = web.Application(middlewares=[failure_report_middleware])
        app.add_routes([web.post("/proxy", proxy)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/proxy"
                async with session.post(url) as response:
                    return response.headers.getall("X-NG-Failure-Report")
        finally:
            await runner.cleanup()

    with capture_failures():
        values = asyncio.run(scenario())
    assert len(values) == 1, values
    assert set(FailureReport.from_header(values[0]).events) == {forwarded.event_id, local.event_id}


def test_a_peers_context_map_never_moves_an_event_recorded_here():
    from opentelemetry.trace import SpanContext, TraceFlags

    from ng_otel.otel.links import encode_context_header

    local = NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    report = FailureReport({local.event_id: local.to_record()}, local.event_id)
    forged = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("model POST /v1/responses") as span:
            ng_otel_record(local)
        headers = {
            "X-NG-Failure-Report": report.to_header(),
            "X-NG-Failure-Context": encode_context_header({local.event_id: forged}),
        }
        observe_reply(headers.get, "agent")  # a peer claims our event lives on its span
        assert telemetry.recorder.index.get(local.event_id) == span.get_span_context()
        assert len(telemetry.failure_events()) == 1


def test_a_failed_reply_the_app_passes_through_fails_with_the_callees_failure():
    # Gym's legacy_agent answers /run with the agent's failed reply, headers included: the
    # caller's failure must still be caused by the agent's, not by a report naming none.
    forwarded, report = _forwarded_report()
    recovered = NgFailureEvent("agent_timeout", "a step was retried", boundary="environment")
    app = FastAPI()

    @app.post("/run")
    async def run():
        ng_otel_observe(recovered)
        return JSONResponse("Hit an exception", status_code=500, headers={"X-NG-Failure-Report": report.to_header()})

    sent = []
    with capture_failures():
        asyncio.run(call(instrument_app(app), "/run", sent=sent))
    start = next(m for m in sent if m["type"] == "http.response.start")
    (value,) = [value for name, value in start["headers"] if name.lower() == b"x-ng-failure-report"]
    passed_on = FailureReport.from_header(value)
    assert passed_on.failure_id == forwarded.event_id and set(passed_on.events) == {
        forwarded.event_id,
        recovered.event_id,
    }
