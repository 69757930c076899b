"""The pytest plugin, as a user's own test suite sees it (pytester runs a fresh pytest)."""

pytest_plugins = ["pytester"]

USER_TEST = """
import asyncio
from fastapi import FastAPI
from ng_otel import NgFailureEvent
from ng_otel.integrations import instrument_app


async def call(app, path):
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [], "http_version": "1.1", "scheme": "http", "root_path": "", "server": ("t", 80)}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], sent[0]["headers"], sent[1:]

app = FastAPI()

@app.post("/run")
async def run():
    try:
        raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    except NgFailureEvent as err:
        raise NgFailureEvent("agent_run_error", "run failed", boundary="agent") from err

instrument_app(app)

def test_the_rollout_fails_with_the_model_timeout_as_cause(ng_otel_capture):
    status, _, _ = asyncio.run(call(app, "/run"))
    assert status == 500
    ng_otel_capture.assert_chain("agent_run_error", "transport_timeout")

def test_a_wrong_expectation_fails(ng_otel_capture):
    asyncio.run(call(app, "/run"))
    ng_otel_capture.assert_chain("agent_run_error", "judge_failed")
"""


def test_the_fixture_is_found_through_the_entry_point_and_assert_chain_works(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: no failure chain*judge_failed*recorded chains*"])


def test_assert_chain_checks_links_and_single_export(ng_otel_capture):
    from ng_otel import NgFailureEvent, record_failure

    cause = NgFailureEvent("transport_timeout", "t", boundary="model")
    with ng_otel_capture.tracer.start_as_current_span("model"):
        record_failure(cause)
    top = NgFailureEvent("agent_run_error", "a", boundary="agent")
    top.__cause__ = cause
    with ng_otel_capture.tracer.start_as_current_span("agent"):
        record_failure(top)
    chain = ng_otel_capture.assert_chain("agent_run_error", "transport_timeout")
    assert [event["ng.failure.id"] for event in chain] == [top.event_id, cause.event_id]


def test_the_capture_helper_records_as_production_does_by_default():
    from ng_otel.otel.settings import Settings
    from ng_otel.testing import CapturedTelemetry

    assert CapturedTelemetry().recorder.settings == Settings.resolve(environ={})
