"""FailureReportMiddleware driven through the ASGI interface itself (no HTTP client mock)."""

import asyncio
import json
import logging

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ng_otel import NgFailureEvent, observe_failure
from ng_otel.contract import FailureReport
from ng_otel.integrations import instrument_app
from ng_otel.integrations.asgi import FailureReportMiddleware
from ng_otel.otel import recorder as recorder_module
from ng_otel.otel.links import decode_context_header
from ng_otel.testing import capture_failures, internal_errors_logged
from tests.conftest import call


def timeout_failure():
    return NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)


def make_app():
    app = FastAPI()

    @app.post("/ok")
    async def ok():
        return {"ok": True}

    @app.post("/raise")
    async def raise_failure():
        try:
            raise timeout_failure()
        except NgFailureEvent as err:
            raise NgFailureEvent("agent_run_error", "run failed", boundary="agent") from err

    @app.post("/raise-plain")
    async def raise_plain():
        raise KeyError("not a gym failure")

    @app.post("/recovered")
    async def recovered():
        observe_failure(timeout_failure())
        return {"ok": True}

    @app.post("/stream")
    async def stream():
        async def events():
            yield b"data: one\n\n"
            observe_failure(timeout_failure())
            yield b"data: two\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/stream-breaks")
    async def stream_breaks():
        async def events():
            yield b"data: one\n\n"
            raise timeout_failure()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_healthy_reply_carries_no_failure_headers():
    with capture_failures():
        status, headers, _ = asyncio.run(call(instrument_app(make_app()), "/ok"))
    assert status == 200
    assert not any(name.startswith("x-ng-") for name in headers)


def test_escaping_failure_becomes_its_status_json_body_and_both_headers():
    with capture_failures() as telemetry:
        status, headers, body = asyncio.run(call(instrument_app(make_app()), "/raise"))
    assert status == 500
    failure = json.loads(body)["failure"]
    assert failure["failure_kind"] == "agent_run_error"
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert report.failure_id == failure["event_id"]
    assert [r["failure_kind"] for r in report.chain()] == ["agent_run_error", "transport_timeout"]
    contexts = decode_context_header(headers["x-ng-failure-context"])
    assert set(contexts) == set(report.events)
    assert telemetry.count() == 2


def test_a_status_from_the_failure_is_used():
    app = FastAPI()

    @app.post("/x")
    async def handler():
        raise timeout_failure()

    with capture_failures():
        status, _, _ = asyncio.run(call(instrument_app(app), "/x"))
    assert status == 504


def test_a_non_gym_exception_passes_through_untouched():
    with capture_failures() as telemetry, pytest.raises(KeyError):
        asyncio.run(call(FailureReportMiddleware(make_app()), "/raise-plain"))
    assert telemetry.count() == 0


def test_recovered_failure_is_reported_on_a_success_reply_and_never_becomes_failure_id():
    with capture_failures():
        status, headers, _ = asyncio.run(call(instrument_app(make_app()), "/recovered"))
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert status == 200 and report.failure_id is None and len(report.recovered_ids()) == 1


def test_an_exception_handler_of_the_app_still_leads_to_a_report():
    app = make_app()

    @app.exception_handler(NgFailureEvent)
    async def as_bad_gateway(request: Request, error: NgFailureEvent):
        return JSONResponse({"handled": error.failure_kind}, status_code=502)

    with capture_failures() as telemetry:
        status, headers, body = asyncio.run(call(instrument_app(app), "/raise"))
    assert status == 502 and json.loads(body) == {"handled": "agent_run_error"}
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert report.events[report.failure_id]["failure_kind"] == "agent_run_error"
    assert telemetry.count() == 2


def test_a_sync_exception_handler_is_wrapped_too():
    app = make_app()

    def handler(request, error):
        return JSONResponse({"handled": True}, status_code=503)

    app.add_exception_handler(NgFailureEvent, handler)
    with capture_failures():
        status, headers, _ = asyncio.run(call(instrument_app(app), "/raise"))
    assert status == 503 and "x-ng-failure-report" in headers


def test_event_stream_gets_the_report_as_a_final_event():
    with capture_failures():
        status, headers, body = asyncio.run(call(instrument_app(make_app()), "/stream"))
    assert "x-ng-failure-report" not in headers
    text = body.decode()
    assert text.startswith("data: one\n\ndata: two\n\n")
    blocks = [block for block in text.split("\n\n") if block.startswith("event: ")]
    assert [block.split("\n")[0] for block in blocks] == ["event: ng_failure_report", "event: ng_failure_context"]
    report = FailureReport.from_header(blocks[0].split("data: ", 1)[1])
    assert len(report) == 1


def test_a_stream_broken_by_a_failure_still_ends_with_its_report():
    sent = []
    with capture_failures() as telemetry:
        # Ended with its report, the stream is a complete reply: nothing is raised for the
        # server to log at ERROR with the failure's reason.
        asyncio.run(call(instrument_app(make_app()), "/stream-breaks", sent=sent))
    assert [e["ng.failure.kind"] for e in telemetry.failure_events()] == ["transport_timeout"]
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert bodies[-1].get("more_body", False) is False
    text = b"".join(m.get("body", b"") for m in bodies).decode()
    report_data = text.split("event: ng_failure_report\ndata: ", 1)[1].split("\n", 1)[0]
    report = FailureReport.from_header(report_data)
    assert report.events[report.failure_id]["failure_kind"] == "transport_timeout"


def test_concurrent_requests_never_see_each_others_failures():
    app = FastAPI()

    @app.post("/work")
    async def work(request: Request):
        tag = (await request.json())["tag"]
        await asyncio.sleep(0.001 * (tag % 7))
        if tag % 2:
            observe_failure(NgFailureEvent("transport_timeout", f"request {tag}", boundary="model"))
        await asyncio.sleep(0.001)
        return {"tag": tag}

    async def many():
        wrapped = instrument_app(app)
        return await asyncio.gather(*(call(wrapped, "/work", json.dumps({"tag": tag}).encode()) for tag in range(60)))

    with capture_failures():
        replies = asyncio.run(many())
    for tag, (_status, headers, _) in enumerate(replies):
        if tag % 2:
            report = FailureReport.from_header(headers["x-ng-failure-report"])
            assert [r["failure_reason"] for r in report.events.values()] == [f"request {tag}"]
        else:
            assert "x-ng-failure-report" not in headers


def test_a_context_the_request_leaves_behind_keeps_no_failure_log():
    # A keep-alive connection opened during a request captures the request's context for the
    # connection's life (uvloop's transports do): that copy must not keep the request's
    # failures alive, and a task outliving the request adds to no reply's log.
    import contextvars

    from ng_otel.otel import failure_log

    app = FastAPI()
    left_behind = []

    @app.post("/work")
    async def work():
        observe_failure(timeout_failure())
        left_behind.append(contextvars.copy_context())
        return {"ok": True}

    with capture_failures():
        _status, headers, _ = asyncio.run(call(instrument_app(app), "/work"))
    assert "x-ng-failure-report" in headers  # the log served its reply
    assert left_behind[0].run(failure_log.current_failure_log) is None
    kept = left_behind[0].run(failure_log._current.get)  # what the copy still holds: an emptied log
    assert kept is not None and not kept and kept.report.events == {}


def test_disabled_middleware_is_a_passthrough(monkeypatch):
    with capture_failures() as telemetry:
        monkeypatch.setattr(recorder_module, "_enabled", False)
        status, headers, _ = asyncio.run(call(instrument_app(make_app()), "/recovered"))
    assert status == 200 and "x-ng-failure-report" not in headers and telemetry.count() == 0


def test_switched_off_the_apps_own_error_handling_is_untouched(monkeypatch):
    with capture_failures():
        monkeypatch.setattr(recorder_module, "_enabled", False)
        with pytest.raises(NgFailureEvent):  # no JSON reply invented: the exception is the app's
            asyncio.run(call(instrument_app(make_app()), "/raise"))


@pytest.mark.parametrize("path", ["/raise", "/recovered", "/stream"])
def test_an_internal_error_while_building_the_headers_never_reaches_the_reply(path, monkeypatch, caplog):
    def broken(where):
        raise RuntimeError("bug in ng_otel")

    monkeypatch.setattr("ng_otel.integrations._exchange.encode_recorded_at", broken)
    monkeypatch.setattr("ng_otel.otel._guard._reported", set())  # each case sees its one warning
    with (
        capture_failures() as telemetry,
        caplog.at_level(logging.WARNING, logger="ng_otel"),
        internal_errors_logged(),  # production's behaviour, not the test suite's
    ):
        status, headers, body = asyncio.run(call(instrument_app(make_app()), path))
    assert status == {"/raise": 500, "/recovered": 200, "/stream": 200}[path]
    assert not any(name.startswith("x-ng-") for name in headers)
    assert body and b"ng_failure_report" not in body
    assert telemetry.failure_events(), "the failure itself is still recorded"
    assert "internal error in reply_headers" in caplog.text


def with_catch_all(app):
    """The shape of NeMo Gym 0.7.0's ``setup_exception_middleware``: every exception becomes
    a JSON 500 carrying ``repr(e)``, inside the app, before any outer middleware sees it."""

    @app.middleware("http")
    async def exception_handling_middleware(request: Request, call_next):
        try:
            return await call_next(request)
        except Exception as e:
            return JSONResponse(content=repr(e), status_code=500)

    return app


def test_a_failure_a_catch_all_middleware_answers_is_recorded_once_on_the_server_span_and_reported():
    app = with_catch_all(make_app())
    with capture_failures() as telemetry:
        tracer = telemetry.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("server"):
            status, headers, body = asyncio.run(call(instrument_app(app), "/raise"))
    assert status == 500 and json.loads(body).startswith("NgFailureEvent('agent_run_error'")  # the app's own
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert [r["failure_kind"] for r in report.chain()] == ["agent_run_error", "transport_timeout"]
    assert set(decode_context_header(headers["x-ng-failure-context"])) == set(report.events)
    (server,) = [span for span in telemetry.spans() if span["name"] == "server"]
    assert [e["attributes"]["ng.failure.kind"] for e in server["events"]] == ["transport_timeout", "agent_run_error"]
    assert server["status"] == "ERROR" and server["attributes"]["error.type"] == "agent_run_error"
    assert telemetry.count() == 2


def test_healthy_replies_are_unchanged_behind_a_catch_all():
    plain = asyncio.run(call(with_catch_all(make_app()), "/ok"))
    with capture_failures():
        observed = asyncio.run(call(instrument_app(with_catch_all(make_app())), "/ok"))
    assert observed == plain


def test_switched_off_the_app_stack_is_left_exactly_as_it_was(monkeypatch):
    app = with_catch_all(make_app())
    with capture_failures():
        monkeypatch.setattr(recorder_module, "_enabled", False)
        status, headers, body = asyncio.run(call(instrument_app(app), "/raise"))
    assert status == 500 and "x-ng-failure-report" not in headers
    handlers = app.middleware_stack
    while handlers is not None and not hasattr(handlers, "_exception_handlers"):
        handlers = getattr(handlers, "app", None)
    assert not any(getattr(h, "_ng_otel_wrapped", False) for h in handlers._exception_handlers.values())
    assert type(handlers.app).__name__ != "RaisedFailureRecorder"


class PrefixStripping:
    """Like NeMo Gym's RolloutContextMiddleware: a pure ASGI middleware that keeps the app it
    wraps as ``_app``."""

    def __init__(self, app):
        self._app = app

    async def __call__(self, scope, receive, send):
        await self._app(scope, receive, send)


def gym_shaped(app):
    app.add_middleware(PrefixStripping)
    return with_catch_all(app)


def test_instrument_app_places_the_layers_around_middleware_added_after_it():
    app = instrument_app(make_app())  # before the app's own middleware, as in a Gym server's setup
    gym_shaped(app)
    with capture_failures() as telemetry:
        status, headers, body = asyncio.run(call(app, "/raise"))
    assert status == 500 and json.loads(body).startswith("NgFailureEvent(")
    assert FailureReport.from_header(headers["x-ng-failure-report"]).failure_id is not None
    assert telemetry.count() == 2


def test_added_by_hand_the_middleware_finds_the_router_through_any_inner_app_attribute():
    app = gym_shaped(make_app())
    app.add_middleware(FailureReportMiddleware)  # last: outermost, as the docs say
    with capture_failures() as telemetry:
        status, headers, _ = asyncio.run(call(app, "/raise"))
    assert status == 500 and "x-ng-failure-report" in headers and telemetry.count() == 2


@pytest.mark.parametrize("key", [500, Exception])
def test_the_apps_own_error_handler_keeps_answering_and_its_reply_carries_the_report(key):
    app = make_app()

    @app.exception_handler(key)
    async def teapot(request: Request, error: Exception):
        return JSONResponse({"answered_by": "the app"}, status_code=418)

    sent = []
    with capture_failures() as telemetry, pytest.raises(NgFailureEvent):  # Starlette re-raises after answering
        asyncio.run(call(instrument_app(app), "/raise", sent=sent))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    assert start["status"] == 418 and b'{"answered_by":"the app"}' in b"".join(m.get("body", b"") for m in sent[1:])
    assert FailureReport.from_header(headers["x-ng-failure-report"]).failure_id is not None
    assert telemetry.count() == 2


@pytest.mark.parametrize("key", [500, Exception])
def test_an_error_handler_that_raises_still_leaves_a_reply_with_the_report(key, caplog):
    app = make_app()

    @app.exception_handler(key)
    async def broken(request: Request, error: Exception):
        raise RuntimeError("the handler has a bug")

    sent = []
    with capture_failures() as telemetry, pytest.raises(NgFailureEvent):  # the failure itself still reaches the server
        asyncio.run(call(instrument_app(app), "/raise", sent=sent))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    # What Starlette's ServerErrorMiddleware and the server answer then, plus the report.
    assert start["status"] == 500 and b"".join(m.get("body", b"") for m in sent[1:]) == b"Internal Server Error"
    assert FailureReport.from_header(headers["x-ng-failure-report"]).failure_id is not None
    assert telemetry.count() == 2
    assert "the app's error handler raised RuntimeError while answering NgFailureEvent" in caplog.text
