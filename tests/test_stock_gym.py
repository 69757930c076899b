"""Stock NeMo Gym 0.7.0's failures as events: Gym's own rules (``ng_otel.gym.deployment``,
``ng_otel.gym.failures``, ``ng_otel.gym.collection_hook``) registered with the adapters, in a
FastAPI app wrapped by a catch-all written as Gym's ``setup_exception_middleware`` is, and
with aiohttp clients against real aiohttp servers on 127.0.0.1. The real Gym runs in
``tests/test_real_gym.py``."""

import asyncio
import json
import sys
import types

import aiohttp
import pytest
from aiohttp import web
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ng_otel import NgFailureEvent
from ng_otel.contract import FailureReport
from ng_otel.contract.rows import row_report
from ng_otel.gym import collection_hook, deployment
from ng_otel.gym.failures import escaped_failure, failure_kind_of
from ng_otel.instrumentor import NgOtelInstrumentor, patch_framework
from ng_otel.integrations import FRAMEWORKS, hooks, instrument_app
from ng_otel.integrations.aiohttp import failure_trace_config
from ng_otel.otel import names
from ng_otel.otel.links import decode_context_header
from ng_otel.testing import capture_failures
from tests.conftest import call

CONFIG = """\
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
simpleqa:
  resources_servers:
    simpleqa:
      entrypoint: app.py
"""


@pytest.fixture
def gym_rules():
    """Gym's rules registered as ``opentelemetry-instrument`` registers them; forgotten after."""

    def register(name: str, boundary: str) -> deployment.GymProcess:
        return deployment.install(deployment.GymProcess(name, boundary))

    yield register
    hooks.reset()


@pytest.fixture
def patched_aiohttp():
    """The instrumentor's aiohttp patches (sessions get the trace config, ``raise_for_status``
    keeps what the reply said), undone after."""
    patch_framework(next(framework for framework in FRAMEWORKS if "aiohttp" in framework.distributions))
    yield
    NgOtelInstrumentor()._uninstrument()


# -- which process is which ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "boundary"),
    [("policy_model", "model"), ("simple_agent", "agent"), ("simpleqa", "resources_server"), ("nope", None)],
)
def test_a_gym_server_s_boundary_is_its_server_type_in_gym_s_config(server, boundary):
    process = deployment.gym_process({"NEMO_GYM_CONFIG_PATH": server, "NEMO_GYM_CONFIG_DICT": CONFIG}, ["app.py"])
    assert process == deployment.GymProcess(server, boundary)


def test_gym_s_command_line_processes_are_named_after_their_command():
    env: dict[str, str] = {}
    assert deployment.gym_process(env, ["/venv/bin/gym", "eval", "run", "+x=1"]) == deployment.GymProcess(
        "gym-eval-run", "collection"
    )
    assert deployment.gym_process(env, ["/venv/bin/gym", "env", "start", "+config_paths=[a]"]) == (
        deployment.GymProcess("gym-env-start", None)
    )
    assert deployment.gym_process(env, ["/usr/bin/python", "serve.py"]) is None


def test_ray_s_own_processes_are_told_apart_and_are_no_gym_server():
    worker = ["/venv/bin/python", "/venv/lib/python3.13/site-packages/ray/_private/workers/default_worker.py"]
    assert deployment.is_ray_process(worker)
    assert (
        deployment.gym_process({"NEMO_GYM_CONFIG_PATH": "simple_agent", "NEMO_GYM_CONFIG_DICT": CONFIG}, worker) is None
    )
    assert not deployment.is_ray_process(["/venv/bin/python", "app.py"])


# -- what an escaping exception is ---------------------------------------------------------------


class ClientResponseError(Exception):
    """aiohttp's name: the kind rules match class names, so the test needs no real reply."""

    def __init__(self, status):
        super().__init__(f"{status}, message='Internal Server Error'")
        self.status = status


class ServerDisconnectedError(ConnectionError):
    pass


@pytest.mark.parametrize(
    ("error", "boundary", "kind"),
    [
        (ValueError("bad output"), "agent", "agent_run_error"),
        (ValueError("bad output"), "resources_server", "verifier_error"),
        (ClientResponseError(500), "model", "provider_unavailable"),
        (ClientResponseError(429), "model", "provider_quota_exhausted"),
        (ClientResponseError(504), "agent", "transport_timeout"),
        (ServerDisconnectedError(), "agent", "transport_peer_drop"),
        (ConnectionRefusedError(), "agent", "transport_unreachable"),
        (OSError(24, "Too many open files"), "model", "transport_local_resource"),
        (asyncio.TimeoutError(), "agent", "transport_timeout"),
        (asyncio.CancelledError(), "agent", "cancelled"),
    ],
)
def test_the_kind_is_chosen_from_the_exception_and_status_as_gym_names_them(error, boundary, kind):
    status = getattr(error, "status", None)
    assert failure_kind_of(error, boundary, status) == kind


class Hostile(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")

    @property
    def status(self):
        raise RuntimeError("no status either")


def test_an_exception_whose_str_and_status_raise_or_whose_message_is_huge_is_still_one_bounded_event():
    for error in (Hostile(), ValueError("x" * 5_000_000)):
        report = escaped_failure(error, "agent", "simple_agent")
        (record,) = report.events.values()
        assert report.failure_id == record["event_id"]
        assert record["failure_kind"] == "agent_run_error" and record["http_status"] == 500
        assert len(record["failure_reason"]) <= 2000
        assert len(record["foreign_error"]["message"]) <= 2000


# -- a Gym server's catch-all 500 carries the event ----------------------------------------------


def failing_routes() -> FastAPI:
    """An app whose routes fail as stock Gym handlers do."""
    app = FastAPI()

    @app.post("/v1/responses")
    async def responses():
        raise ValueError("the backend said no")

    @app.post("/cancelled")
    async def cancelled():
        raise asyncio.CancelledError()

    return app


def gym_shaped_app():
    """``failing_routes`` and a healthy one, behind a catch-all written as Gym's."""
    app = failing_routes()

    @app.post("/ok")
    async def ok():
        return {"ok": True}

    @app.middleware("http")
    async def exception_handling_middleware(request: Request, call_next):
        try:
            return await call_next(request)
        except asyncio.CancelledError:
            return JSONResponse(content="Request was cancelled", status_code=500)
        except Exception as e:
            return JSONResponse(content=repr(e), status_code=500)

    return instrument_app(app)


def test_an_exception_gym_s_catch_all_answers_is_one_event_at_the_server_s_boundary_with_its_report(gym_rules):
    gym_rules("policy_model", "model")
    with capture_failures() as telemetry:
        status, headers, body = asyncio.run(call(gym_shaped_app(), "/v1/responses"))
    assert (status, json.loads(body)) == (500, "ValueError('the backend said no')")  # Gym's reply, unchanged
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    (event,) = telemetry.failure_events()
    assert event[names.ID] == report.failure_id
    assert event[names.BOUNDARY] == "model" and event[names.KIND] == "provider_unavailable"
    assert event[names.FOREIGN_TYPE] == "ValueError" and event[names.HTTP_STATUS] == 500
    assert "the backend said no" in event[names.REASON]
    assert report.failure_id in decode_context_header(headers["x-ng-failure-context"])
    assert telemetry.count(kind="provider_unavailable", recovered=False) == 1


def test_a_cancelled_request_is_cancelled_never_a_server_error(gym_rules):
    gym_rules("simple_agent", "agent")
    with capture_failures() as telemetry:
        status, _, _ = asyncio.run(call(gym_shaped_app(), "/cancelled"))
    assert status == 500  # Gym's own answer
    (event,) = telemetry.failure_events()
    assert event[names.KIND] == "cancelled" and names.HTTP_STATUS not in event


def bare_app():
    """``failing_routes`` with no middleware of the app's own: what escapes the router reaches
    ng_otel's report layer directly, and Starlette's error middleware answers."""
    return instrument_app(failing_routes())


def _layers(app):
    asyncio.run(call(app, "/nowhere"))  # builds the stack
    node, found = app.middleware_stack, []
    while node is not None:
        found.append(type(node).__name__)
        node = getattr(node, "app", None)
    return found


def test_with_no_middleware_of_the_app_s_own_what_escapes_the_router_is_recorded_by_the_report_layer(gym_rules):
    gym_rules("simple_agent", "agent")
    assert "RaisedFailureRecorder" in _layers(gym_shaped_app())  # a catch-all would answer it first
    assert "RaisedFailureRecorder" not in _layers(bare_app())  # one layer fewer on every request
    with capture_failures() as telemetry:
        with pytest.raises(ValueError):
            asyncio.run(call(bare_app(), "/v1/responses"))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(call(bare_app(), "/cancelled"))
    escaped, cancelled = telemetry.failure_events()  # each once
    assert escaped[names.FOREIGN_TYPE] == "ValueError" and escaped[names.HTTP_STATUS] == 500
    assert cancelled[names.KIND] == "cancelled"


def test_without_gym_s_rules_a_plain_exception_is_no_event_and_a_healthy_reply_carries_nothing(gym_rules):
    with capture_failures() as telemetry:
        status, _, _ = asyncio.run(call(gym_shaped_app(), "/v1/responses"))
        _, healthy_headers, _ = asyncio.run(call(gym_shaped_app(), "/ok"))
    assert status == 500 and telemetry.failure_events() == []
    assert "x-ng-failure-report" not in healthy_headers


# -- the caller's side: trace context, failed attempts, the callee's failure as cause ------------


async def serve(handler):
    app = web.Application()
    app.add_routes([web.post("/{tail:.*}", handler)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def post_in_a_span_then_outside(telemetry, handler, inside):
    """POST to ``handler`` once per headers of ``inside`` within a server span, then once
    outside any span (a CLIENT span of its own); the server span's context."""
    runner, url = await serve(handler)
    try:
        async with aiohttp.ClientSession(trace_configs=[failure_trace_config()]) as session:
            with telemetry.tracer.start_as_current_span("server") as server:
                for headers in inside:
                    await (await session.post(f"{url}/in", headers=headers)).read()
            await (await session.post(f"{url}/root")).read()
        return server.get_span_context()
    finally:
        await runner.cleanup()


def test_every_request_carries_the_caller_s_trace_context_once(gym_rules):
    gym_rules("simple_agent", "agent")
    seen = []

    async def echo(request):
        seen.append(request.headers.getall("traceparent", []))
        return web.json_response({})

    carrying = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    with capture_failures() as telemetry:
        server = asyncio.run(post_in_a_span_then_outside(telemetry, echo, [{}, carrying]))
    inside, carried, root = seen
    assert inside == [f"00-{server.trace_id:032x}-{server.span_id:016x}-01"]
    assert carried == ["00-" + "1" * 32 + "-" + "2" * 16 + "-01"]  # never a second one
    (client,) = [s for s in telemetry.spans() if s["name"] == "POST"]
    assert root == [f"00-{client['context']['trace_id']:032x}-{client['context']['span_id']:016x}-01"]


def test_a_propagator_of_another_format_carries_the_current_span_and_adds_no_client_span(gym_rules):
    # No traceparent after injecting says nothing about the current span: it is read instead.
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import DefaultSetter, TextMapPropagator

    class OtherFormat(TextMapPropagator):
        def inject(self, carrier, context=None, setter=None):
            span = trace.get_current_span(context).get_span_context()
            if span.is_valid:
                (setter or DefaultSetter()).set(carrier, "x-other-trace", f"{span.trace_id:032x}:{span.span_id:016x}")

        def extract(self, carrier, context=None, getter=None):
            return context

        @property
        def fields(self):
            return {"x-other-trace"}

    gym_rules("simple_agent", "agent")
    seen = []

    async def echo(request):
        seen.append((request.headers.get("x-other-trace"), request.headers.get("traceparent")))
        return web.json_response({})

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(OtherFormat())
    try:
        with capture_failures() as telemetry:
            server = asyncio.run(post_in_a_span_then_outside(telemetry, echo, [{}]))
    finally:
        propagate.set_global_textmap(before)
    inside, root = seen
    assert inside == (f"{server.trace_id:032x}:{server.span_id:016x}", None)
    (client,) = [s for s in telemetry.spans() if s["name"] == "POST"]  # the root request's alone
    assert root == (f"{client['context']['trace_id']:032x}:{client['context']['span_id']:016x}", None)


def test_each_failed_attempt_of_a_retry_loop_is_a_recovered_event_on_a_span_that_ends_with_it(gym_rules):
    gym_rules("simple_agent", "agent")

    async def drop(request):
        request.transport.close()  # a connection-dropping model server
        return web.Response()

    async def retry_loop(telemetry, attempts):
        runner, url = await serve(drop)
        try:
            async with aiohttp.ClientSession(trace_configs=[failure_trace_config()]) as session:
                with telemetry.tracer.start_as_current_span("agent /run"):
                    for _ in range(attempts):  # Gym's _request_with_retries resends the same request
                        with pytest.raises(aiohttp.ServerDisconnectedError):
                            await session.post(f"{url}/v1/responses?key=secret")
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        asyncio.run(retry_loop(telemetry, 3))
        attempts = [s for s in telemetry.spans() if s["name"] == "ng.failure transport_peer_drop"]
        assert [s["attributes"][names.RESEND_COUNT] for s in attempts] == [0, 1, 2]
        events = telemetry.failure_events()
        assert [e[names.RECOVERED] for e in events] == [True, True, True]
        assert {e[names.BOUNDARY] for e in events} == {"agent"}
        assert all(
            "secret" not in e[names.REASON] and "secret" not in s["attributes"][names.URL_FULL]
            for e, s in zip(events, attempts, strict=True)
        )
        assert telemetry.count(kind="transport_peer_drop", recovered=True) == 3


def test_the_caller_s_failure_is_its_own_event_caused_by_the_callee_s_and_linked_to_its_span(
    gym_rules, patched_aiohttp
):
    gym_rules("simple_agent", "agent")
    callee = NgFailureEvent("provider_unavailable", "backend overloaded", boundary="model", http_status=500)
    callee_report = FailureReport({callee.event_id: callee.to_record()}, callee.event_id)
    where = "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"

    async def model(request):
        headers = {
            "X-NG-Failure-Report": callee_report.to_header(),
            "X-NG-Failure-Context": json.dumps({callee.event_id: where}),
        }
        return web.json_response("Hit an exception", status=500, headers=headers)

    async def agent(telemetry):
        runner, url = await serve(model)
        try:
            async with aiohttp.ClientSession() as session:  # the instrumentor gave it the trace config
                with telemetry.tracer.start_as_current_span("agent /run"):
                    response = await session.post(f"{url}/v1/responses")
                    try:
                        response.raise_for_status()  # what Gym's server_utils.raise_for_status calls
                    except aiohttp.ClientResponseError as error:
                        return escaped_failure(error, "agent", "simple_agent")
        finally:
            await runner.cleanup()

    with capture_failures() as telemetry:
        report = asyncio.run(agent(telemetry))
        from ng_otel import record_failure

        with telemetry.tracer.start_as_current_span("agent /run again"):
            record_failure(report)
        own = report.events[report.failure_id]
        assert own["cause_id"] == callee.event_id and own["failure_kind"] == "agent_run_error"
        assert set(report.events) == {own["event_id"], callee.event_id}
        (event,) = telemetry.failure_events()  # the callee's event was exported by the callee: linked, not copied
        assert event[names.ID] == own["event_id"]
        (span,) = [s for s in telemetry.spans() if s["events"]]
        (link,) = span["links"]
        assert link["context"] == {"trace_id": int(where[:32], 16), "span_id": int(where[33:], 16)}


# -- collection's failure rows, live ----------------------------------------------------------


def test_a_collection_failure_row_is_a_live_collection_event_saved_with_the_row_under_the_same_id(monkeypatch):
    module = types.ModuleType(collection_hook.MODULE)

    def _agent_request_failure_row(exc, status):  # Gym 0.7.0's, abridged
        return {
            "_ng_failure_class": "agent_run_error",
            "_ng_failure_type": type(exc).__name__,
            "_ng_failure_http_status": status,
        }

    module._agent_request_failure_row = _agent_request_failure_row
    monkeypatch.setitem(sys.modules, collection_hook.MODULE, module)
    collection_hook.install()
    with capture_failures() as telemetry:
        row = module._agent_request_failure_row(ClientResponseError(500), 500)
    (event,) = telemetry.failure_events()
    assert event[names.BOUNDARY] == "collection" and event[names.KIND] == "agent_run_error"
    saved = row_report(row)
    assert saved.failure_id == event[names.ID] and row["_ng_failure_class"] == "agent_run_error"
    assert row[names.ROW_CONTEXTS][saved.failure_id] != "0" * 32 + "-" + "0" * 16


class FailedReply:
    """What collection's ``raise_for_status`` is handed for a failed ``/run``."""

    def __init__(self, url, status):
        self.url, self.status = url, status


def fake_collection_module(monkeypatch):
    module = types.ModuleType(collection_hook.MODULE)

    async def raise_for_status(response, content=None):  # Gym 0.7.0's, abridged
        if response.status >= 400:
            raise ClientResponseError(response.status)

    module.raise_for_status = raise_for_status
    module._agent_request_failure_row = _agent_request_failure_row
    monkeypatch.setitem(sys.modules, collection_hook.MODULE, module)
    collection_hook.install()
    return module


def _agent_request_failure_row(exc, status):  # Gym 0.7.0's, abridged
    ran = status is not None and status not in (429, 502, 503, 504)
    return {
        "_ng_failure_class": "agent_run_error" if ran else "agent_request_failed",
        "_ng_failure_http_status": status,
    }


@pytest.mark.parametrize(("status", "kind"), [(500, "agent_run_error"), (503, "agent_request_failed")])
def test_a_failed_run_is_a_collection_event_when_checked_even_where_the_run_ends_on_it(monkeypatch, status, kind):
    module = fake_collection_module(monkeypatch)
    with capture_failures() as telemetry:
        with pytest.raises(ClientResponseError) as raised:
            asyncio.run(module.raise_for_status(FailedReply("http://127.0.0.1:1/run", status)))
        (event,) = telemetry.failure_events()  # before any row: a run without a sidecar ends here
        assert (event[names.BOUNDARY], event[names.KIND], event[names.HTTP_STATUS]) == ("collection", kind, status)
        row = module._agent_request_failure_row(raised.value, status)  # with a sidecar, its row saves that event
        assert telemetry.failure_events() == [event]
    assert row["_ng_failure_id"] == event[names.ID] and row["_ng_failure_class"] == kind


def test_a_failed_reply_that_is_no_run_is_no_collection_failure(monkeypatch):
    module = fake_collection_module(monkeypatch)
    with capture_failures() as telemetry:
        with pytest.raises(ClientResponseError):
            asyncio.run(module.raise_for_status(FailedReply("http://127.0.0.1:1/aggregate_metrics", 500)))
    assert telemetry.failure_events() == []


def test_a_judge_failure_the_verify_reply_names_is_caused_by_the_judge_models_reported_failure():
    from ng_otel.gym.episodes import record_verify_outcome
    from ng_otel.integrations._exchange import observe_reply
    from ng_otel.otel.failure_log import close_failure_log, open_failure_log

    judge_model = NgFailureEvent("provider_unavailable", "backend overloaded", boundary="model", http_status=500)
    reply = {
        "X-NG-Failure-Report": FailureReport(
            {judge_model.event_id: judge_model.to_record()}, judge_model.event_id
        ).to_header(),
        "X-NG-Failure-Context": json.dumps({judge_model.event_id: "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"}),
    }
    with capture_failures() as telemetry:
        log = open_failure_log()  # simpleqa's /verify request
        try:
            with telemetry.tracer.start_as_current_span("POST /verify"):
                observe_reply(reply.get, "resources_server")  # the judge model answered 500 with its report
                record_verify_outcome({"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed"})
            report = log.report  # what the /verify reply carries
        finally:
            close_failure_log(log)
        (event,) = telemetry.failure_events()  # the judge model's event was its own to export
        assert event[names.KIND] == "judge_failed" and event[names.CAUSE_ID] == judge_model.event_id
        (span,) = telemetry.spans()
        assert span["links"][0]["context"]["span_id"] == 0xB7AD6B7169203331
        assert report.events[event[names.ID]]["cause_id"] == judge_model.event_id  # the reply's report says so too


def test_a_masked_rows_saved_report_names_the_judge_failure_as_the_rows_own(monkeypatch):
    module = fake_collection_module(monkeypatch)
    judged = NgFailureEvent("judge_failed", "judge down", boundary="resources_server")
    report = FailureReport({judged.event_id: judged.to_record()})  # a successful /run: no failure_id

    class Reply:
        headers = {"X-NG-Failure-Report": report.to_header()}

    async def get_response_json(response):
        return {"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed"}

    module.get_response_json = get_response_json
    collection_hook._wrap(module)
    with capture_failures():
        row = asyncio.run(module.get_response_json(Reply()))
    assert row["_ng_failure_id"] == judged.event_id and judged.event_id in row["_ng_failure_events"]
    assert row_report(row).recovered_ids() == frozenset()  # show and replay read it as the row's own, as it was live
