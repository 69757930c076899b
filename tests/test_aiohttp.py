"""The aiohttp adapters against real aiohttp servers on 127.0.0.1."""

import asyncio
import json
import os
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel.contract import FailureReport
from ng_otel.integrations.aiohttp import (
    HttpError,
    failure_report_middleware,
    failure_trace_config,
    raise_boundary_failure,
    reply_report,
)
from ng_otel.otel.failure_log import close_failure_log, open_failure_log
from ng_otel.testing import capture_failures


def chain():
    top = NgFailureEvent("judge_failed", "judge down", boundary="resources_server", http_status=502)
    top.__cause__ = NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)
    return top


async def serve(routes, middlewares=()):
    app = web.Application(middlewares=list(middlewares))
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def run(coro):
    return asyncio.run(coro)


def test_peer_without_ng_otel_has_its_events_exported_here_once_and_rebuilt():
    failure = chain()
    report = failure_report_for(failure)

    async def plain_gym_peer(request):
        return web.json_response(
            {"detail": "bad gateway"}, status=502, headers={"X-NG-Failure-Report": report.to_header()}
        )

    async def scenario():
        runner, url = await serve([web.post("/verify", plain_gym_peer)])
        try:
            async with aiohttp.ClientSession(trace_configs=[failure_trace_config()]) as session:
                for _ in range(2):
                    async with session.post(f"{url}/verify") as response:
                        with pytest.raises(NgFailureEvent) as caught:
                            await raise_boundary_failure(response)
            return caught.value
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        raised = run(scenario())
    assert raised.event_id == failure.event_id and raised.__cause__.event_id == failure.__cause__.event_id
    assert raised.http_error.status == 502 and json.loads(raised.http_error.body) == {"detail": "bad gateway"}
    assert isinstance(raised.http_error, HttpError)
    assert sorted(e["ng.failure.kind"] for e in telemetry.failure_events()) == ["judge_failed", "transport_timeout"]
    telemetry.assert_exported_once()


def test_failed_reply_without_report_raises_client_response_error():
    async def no_report(request):
        return web.Response(status=503, text="down")

    async def scenario():
        runner, url = await serve([web.get("/", no_report)])
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                await raise_boundary_failure(response)
        finally:
            await runner.cleanup()

    with capture_failures(), pytest.raises(aiohttp.ClientResponseError) as caught:
        run(scenario())
    assert caught.value.status == 503


def test_successful_reply_returns_and_its_report_feeds_the_request_log():
    recovered = failure_report_for(NgFailureEvent("provider_unavailable", "busy", boundary="model"))

    async def ok(request):
        return web.json_response({"ok": True}, headers={"X-NG-Failure-Report": recovered.to_header()})

    async def scenario():
        runner, url = await serve([web.get("/", ok)])
        log = open_failure_log()
        try:
            async with aiohttp.ClientSession(trace_configs=[failure_trace_config()]) as session:
                async with session.get(url) as response:
                    await raise_boundary_failure(response)
                    assert reply_report(response) == recovered
            return log.report
        finally:
            close_failure_log(log)
            await runner.cleanup()

    with capture_failures():
        report = run(scenario())
    assert set(report.events) == set(recovered.events) and report.failure_id is None


@pytest.mark.parametrize(
    ("headers", "header_name"),
    [
        ({"X-NG-Failure-Report": '{"events": 5}'}, "X-NG-Failure-Report"),
        ({"X-NG-Failure-Report": "x" * 5000}, "X-NG-Failure-Report"),
        ({"X-NG-Failure-Report": FailureReport().to_header(), "X-NG-Failure-Context": "[1]"}, "X-NG-Failure-Context"),
    ],
)
def test_malformed_peer_headers_become_one_protocol_violation(headers, header_name):
    async def hostile(request):
        return web.json_response({"ok": True}, headers=headers)

    async def scenario():
        runner, url = await serve([web.get("/", hostile)])
        try:
            async with aiohttp.ClientSession(trace_configs=[failure_trace_config(boundary="agent")]) as session:
                async with session.get(url) as response:
                    await raise_boundary_failure(response, boundary="agent")
                    return await response.json()
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        assert run(scenario()) == {"ok": True}
    (event,) = telemetry.failure_events()
    assert event["ng.failure.kind"] == "protocol_violation" and event["ng.failure.boundary"] == "agent"
    assert header_name in event["ng.failure.reason"] and len(event["ng.failure.reason"]) <= 2000


def test_server_middleware_answers_an_escaping_failure_with_status_body_and_headers():
    async def failing(request):
        raise chain()

    async def healthy(request):
        return web.json_response({"ok": True})

    async def scenario():
        runner, url = await serve([web.post("/fail", failing), web.get("/ok", healthy)], [failure_report_middleware])
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{url}/fail") as response:
                    failed = (response.status, dict(response.headers), await response.json())
                async with session.get(f"{url}/ok") as response:
                    ok = (response.status, dict(response.headers))
            return failed, ok
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        (status, headers, body), (ok_status, ok_headers) = run(scenario())
    assert status == 502 and body["failure"]["failure_kind"] == "judge_failed"
    report = FailureReport.from_header(headers["X-NG-Failure-Report"])
    assert [r["failure_kind"] for r in report.chain()] == ["judge_failed", "transport_timeout"]
    assert "X-NG-Failure-Context" in headers
    assert ok_status == 200 and "X-NG-Failure-Report" not in ok_headers
    assert telemetry.count() == 2


def test_server_middleware_reads_verify_replies_as_the_asgi_middleware_does():
    masked = {"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed", "failure_reason": "judge 503"}

    async def verify(request):
        return web.json_response(await request.json())

    async def scenario():
        runner, url = await serve(
            [web.post("/verify", verify), web.post("/score", verify)], [failure_report_middleware]
        )
        try:
            async with aiohttp.ClientSession() as session:
                replies = []
                for path in ("/verify", "/score"):
                    async with session.post(f"{url}{path}", json=masked) as response:
                        replies.append((response.status, dict(response.headers), await response.json()))
            return replies
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        (status, headers, body), (_, score_headers, _) = run(scenario())
    assert status == 200 and body == masked  # the reply is the app's own, read and passed on
    report = FailureReport.from_header(headers["X-NG-Failure-Report"])
    assert [record["failure_kind"] for record in report.events.values()] == ["judge_failed"]
    assert "X-NG-Failure-Report" not in score_headers  # only the routes the reader was registered for
    assert telemetry.count("ng.verify.outcomes", kind="judge_failed") == 1


def test_the_client_hook_leaves_the_aiohttp_server_unloaded():
    # Every full garbage collection walks what a process imported: a FastAPI server that only
    # calls out must not pay for aiohttp.web (~4,900 objects), which it never uses.
    code = (
        "import sys, aiohttp, ng_otel, ng_otel.gym;"
        "from ng_otel.integrations.aiohttp import failure_trace_config, raise_boundary_failure;"
        "ng_otel.enable(); aiohttp.ClientSession; failure_trace_config();"
        "print('aiohttp.web' in sys.modules);"
        "from ng_otel.integrations.aiohttp import failure_report_middleware;"
        "print('aiohttp.web' in sys.modules, failure_report_middleware.__name__)"
    )
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split("\n")[:2] == ["False", "True failure_report_middleware"]
