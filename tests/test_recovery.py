"""Recovery telemetry (issue 26, Gym #3182): retry loops' outcomes, rollout outcomes, rollouts
in flight and stalled, and the JSON lines written when OpenTelemetry is off.

Gym's request loop is the real one: ``_request_with_retries`` is taken from the NeMo Gym 0.7.0
wheel (``tools/real-gym.sh wheel`` unzips it) and run against local servers that drop, hang or
fail, through the aiohttp hook and ``ng_otel.gym.request_loop``'s wrapper.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import types
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import NoOpTracerProvider

from ng_otel import NgFailureEvent
from ng_otel.gym import collection_hook, deployment, request_loop
from ng_otel.gym.failures import escaped_failure
from ng_otel.integrations import hooks
from ng_otel.integrations.aiohttp import failure_trace_config
from ng_otel.otel import names, recovery
from ng_otel.otel.jsonl import JsonLines
from ng_otel.otel.recorder import FailureRecorder, get_recorder, install_recorder, is_enabled, observe_failure
from ng_otel.otel.settings import Settings
from ng_otel.runs.chains import groups_from_lines
from ng_otel.runs.inputs import file_lines
from ng_otel.runs.summary import summarise
from ng_otel.testing import capture_failures
from tests.test_upstream_compat import CACHE, VERSION

WHEEL = CACHE / f"wheel-{VERSION}" / "unzipped" / "nemo_gym" / "server_utils.py"


def wheel_source() -> str:
    """Gym's ``server_utils.py``, as shipped (``make test`` unzips the wheel first). A
    checkout without it skips; CI, which must run these, fails instead."""
    if not WHEEL.exists():
        message = f"{WHEEL} is missing: tools/real-gym.sh wheel unzips NeMo Gym {VERSION}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return WHEEL.read_text()


DOCS = Path(__file__).resolve().parents[1] / "docs"


# -- Gym 0.7.0's own request loop, out of the wheel ----------------------------------------------


def gym_server_utils(session: aiohttp.ClientSession) -> types.ModuleType:
    """A module holding the wheel's ``_request_with_retries`` verbatim, its client ``session``."""
    source = wheel_source()
    found = re.search(r"^async def _request_with_retries\(.*?(?=^(?:async )?def |^class )", source, re.S | re.M)
    assert found, "the wheel's server_utils has no _request_with_retries"
    module = types.ModuleType("gym_server_utils")
    module.__dict__.update(
        asyncio=asyncio,
        time=time,
        print_exc=lambda: None,
        Optional=__import__("typing").Optional,
        Unpack=__import__("typing_extensions").Unpack,
        _RequestOptions=dict,
        ClientResponse=aiohttp.ClientResponse,
        ServerDisconnectedError=aiohttp.ServerDisconnectedError,
        ClientOSError=aiohttp.ClientOSError,
        MAX_NUM_TRIES=3,
        _NUM_SERVER_DISCONNECTED_ERROR=0,
        _NUM_CLIENT_OS_ERROR=0,
        DISCONNECTED_CLIENT_OS_PRINT_INTERVAL=100,
        DISCONNECTED_CLIENT_OS_HELP_TEXT="",
        _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY=False,
        _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG=False,
        get_global_aiohttp_client=lambda: session,
        set_server_name=lambda name: None,
        reset_server_name=lambda token: None,
    )
    exec(compile(found[0], str(WHEEL), "exec"), module.__dict__)  # Gym's code, as shipped
    request_loop._wrap(module)
    assert module._request_with_retries._ng_otel_patched
    return module


class Endpoint:
    """A local endpoint: drops the first ``drops`` connections (``None``: all), then answers
    ``status``; ``hang`` never answers."""

    def __init__(self, drops: int | None = 0, status: int = 200, hang: bool = False) -> None:
        self.drops, self.status, self.hang = drops, status, hang
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.hang:
            await asyncio.sleep(1)
        if self.drops is None or self.requests <= self.drops:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response({"ok": self.requests}, status=self.status)


async def loop_against(endpoint: Endpoint, **options: Any) -> tuple[Any, BaseException | None]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", endpoint.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/responses"  # type: ignore[union-attr]
    timeout = aiohttp.ClientTimeout(total=options.pop("timeout", None))
    try:
        async with aiohttp.ClientSession(trace_configs=[failure_trace_config()], timeout=timeout) as session:
            module = gym_server_utils(session)
            try:
                response = await module._request_with_retries("POST", url, json={}, **options)
            except Exception as error:
                return None, error
            return response.status, None
    finally:
        await runner.cleanup()


@pytest.fixture
def agent_rules():
    deployment.install(deployment.GymProcess("simple_agent", "agent"))
    yield
    hooks.reset()


def outcomes(telemetry) -> dict[tuple[str, str, str], int]:
    return {
        (p["attributes"][names.BOUNDARY], p["attributes"][names.KIND], p["attributes"][names.RETRY_OUTCOME]): p["value"]
        for p in telemetry.metric_points(names.RETRY_METRIC)
    }


def delays(telemetry) -> list[tuple[dict[str, Any], int, float]]:
    data = telemetry.metric_reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == names.RETRY_DELAY_METRIC:
                    found += [(dict(p.attributes), p.count, p.sum) for p in metric.data.data_points]
    return found


def test_a_healthy_request_is_one_success_without_retry_and_nothing_else(agent_rules):
    with capture_failures() as telemetry:
        status, error = asyncio.run(loop_against(Endpoint()))
        assert (status, error) == (200, None)
        assert outcomes(telemetry) == {("agent", "none", "succeeded_without_retry"): 1}
        assert telemetry.failure_events() == [] and delays(telemetry) == []


def test_gym_s_loop_dropping_twice_then_answering_succeeds_after_retry_with_two_recovered_events(agent_rules):
    with capture_failures() as telemetry:
        status, _ = asyncio.run(loop_against(Endpoint(drops=2), _internal=True))
        assert status == 200
        events = telemetry.failure_events()
        assert [
            (e[names.KIND], e[names.RESEND_COUNT], e[names.RETRY_EXHAUSTED], e[names.RECOVERED]) for e in events
        ] == [
            ("transport_peer_drop", 0, False, True),
            ("transport_peer_drop", 1, False, True),
        ]
        assert outcomes(telemetry) == {("agent", "transport_peer_drop", "succeeded_after_retry"): 1}
        ((attributes, count, total),) = delays(telemetry)
        assert attributes == {names.BOUNDARY: "agent", names.RETRY_OUTCOME: "succeeded_after_retry"}
        assert count == 1 and 1.0 <= total < 5.0  # Gym waits 0.5 s after each of the two drops


def test_a_loop_that_runs_out_of_connection_retries_ends_on_an_exhausted_event_that_the_escape_is_caused_by(
    agent_rules,
):
    with capture_failures() as telemetry:
        _, error = asyncio.run(loop_against(Endpoint(drops=None), _max_connection_retries=2))
        assert isinstance(error, aiohttp.ServerDisconnectedError)
        events = telemetry.failure_events()
        assert [(e[names.RESEND_COUNT], e[names.RETRY_EXHAUSTED], e[names.RECOVERED]) for e in events] == [
            (0, False, True),
            (1, True, False),  # Gym raises on its second dropped connection: the loop's end
        ]
        assert outcomes(telemetry) == {("agent", "transport_peer_drop", "failed_after_retry"): 1}
        assert [attributes[names.RETRY_OUTCOME] for attributes, _, _ in delays(telemetry)] == ["failed_after_retry"]
        report = escaped_failure(error, "agent", "simple_agent")  # what the handler's escape becomes
        own = report.events[report.failure_id]
        assert own["cause_id"] == events[1][names.ID] and own["cause_id"] in report.events


def test_other_exceptions_end_a_loop_that_is_not_internal_after_gym_s_three_tries(agent_rules):
    with capture_failures() as telemetry:
        _, error = asyncio.run(loop_against(Endpoint(hang=True), timeout=0.05))
        assert isinstance(error, asyncio.TimeoutError)
        events = telemetry.failure_events()
        assert [(e[names.KIND], e[names.RESEND_COUNT], e[names.RETRY_EXHAUSTED]) for e in events] == [
            ("transport_timeout", 0, False),
            ("transport_timeout", 1, False),
            ("transport_timeout", 2, True),
        ]
        assert outcomes(telemetry) == {("agent", "transport_timeout", "failed_after_retry"): 1}


def test_a_failed_answer_fails_the_operation_without_retry_and_a_first_attempt_raise_is_failed_without_retry(
    agent_rules,
):
    with capture_failures() as telemetry:
        status, _ = asyncio.run(loop_against(Endpoint(status=500)))
        assert status == 500
        _, error = asyncio.run(loop_against(Endpoint(drops=None), _max_connection_retries=1))
        assert error is not None
        assert outcomes(telemetry) == {
            ("agent", "agent_run_error", "failed_without_retry"): 1,  # Gym's loop never retries an answer
            ("agent", "transport_peer_drop", "failed_without_retry"): 1,
        }
        assert [e[names.RETRY_EXHAUSTED] for e in telemetry.failure_events()] == [True]


def test_a_cancelled_loop_has_no_outcome(agent_rules):
    async def cancelled():
        task = asyncio.ensure_future(loop_against(Endpoint(hang=True)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with capture_failures() as telemetry:
        asyncio.run(cancelled())
        assert outcomes(telemetry) == {}


def test_gym_s_retry_rule_is_read_from_the_wheel_s_code():
    source = wheel_source()
    for line in (
        "if _max_connection_retries is not None and retries >= _max_connection_retries:",
        "if _max_connection_retries is not None and num_tries >= _max_connection_retries:",
        "if num_tries >= MAX_NUM_TRIES:",
        "MAX_NUM_TRIES = 3",
    ):
        assert line in source, line
    errors = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
    rule = request_loop.GymRetryRule(False, None, errors)
    assert [rule(TimeoutError()) for _ in range(3)] == [True, True, False]
    rule = request_loop.GymRetryRule(True, None, errors)
    assert all(rule(TimeoutError()) for _ in range(10))  # internal: forever
    rule = request_loop.GymRetryRule(True, 3, errors)
    refused = aiohttp.ClientConnectorError(types.SimpleNamespace(ssl=None, host="h", port=1), OSError(111, "refused"))
    assert [rule(aiohttp.ServerDisconnectedError()), rule(refused), rule(aiohttp.ServerDisconnectedError())] == [
        True,
        True,
        False,
    ]  # one count for both connection errors
    assert request_loop.GymRetryRule(True, None, errors)(asyncio.CancelledError()) is False


# -- a retry loop of your own ---------------------------------------------------------------------


def test_retry_loop_counts_a_user_s_loop_that_succeeds_after_retry():
    with capture_failures() as telemetry:
        with recovery.retry_loop("model") as loop:
            for _ in range(2):
                loop.retry(NgFailureEvent("transport_timeout", "slow", boundary="model"))
        events = telemetry.failure_events()
        assert [(e[names.RESEND_COUNT], e[names.RECOVERED], e[names.RETRY_EXHAUSTED]) for e in events] == [
            (0, True, False),
            (1, True, False),
        ]
        assert outcomes(telemetry) == {("model", "transport_timeout", "succeeded_after_retry"): 1}


def test_retry_loop_records_the_failure_that_ends_it_as_exhausted_and_the_operation_s_own():
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("handler"):
            with pytest.raises(NgFailureEvent):
                with recovery.retry_loop("model") as loop:
                    loop.retry(NgFailureEvent("transport_timeout", "slow", boundary="model"))
                    raise NgFailureEvent("transport_timeout", "slow again", boundary="model")
        last = telemetry.failure_events()[-1]
        assert (last[names.RESEND_COUNT], last[names.RETRY_EXHAUSTED], last[names.RECOVERED]) == (1, True, False)
        (handler,) = [s for s in telemetry.spans() if s["name"] == "handler"]
        assert handler["attributes"][names.ERROR_TYPE] == "transport_timeout"
        assert outcomes(telemetry) == {("model", "transport_timeout", "failed_after_retry"): 1}


def test_observe_failure_takes_the_attempt_number_as_the_resend_count():
    with capture_failures() as telemetry:
        observe_failure(NgFailureEvent("transport_timeout", "slow", boundary="model"), attempt=3)
        (event,) = telemetry.failure_events()
        assert event[names.RESEND_COUNT] == 3 and event[names.RECOVERED] is True


# -- rollout outcomes and rollouts in flight ------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"reward": 1.0}, ("measured", None)),
        ({"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed"}, ("masked", "judge_failed")),
        ({"_ng_failure_class": "judge_failed", "mask_sample": True}, ("failed", "judge_failed")),  # Gym's sidecar
        ({"_ng_failure_class": "agent_run_error"}, ("failed", "agent_run_error")),
        ({"_ng_failure_class": "cancelled", "_ng_no_persist": True}, ("omitted", "cancelled")),
    ],
)
def test_a_rollout_s_outcome_is_the_one_gym_s_collection_gives_it(result, expected):
    assert collection_hook.rollout_outcome(result) == expected


def test_collection_s_futures_are_counted_as_they_resolve_by_agent_and_kind():
    completed = types.SimpleNamespace
    module = types.ModuleType("rollout_collection")
    module._materialized_taskset = lambda row: None

    class Helper:
        @staticmethod
        def _dispatch_name(row):
            return row["agent_ref"]["name"]

        def _run_examples_with_metadata(self, rows):
            async def one(row, result):
                return completed(row=row, result=result)

            return iter([one(row, result) for row, result in rows])

    module.RolloutCollectionHelper = Helper
    collection_hook._wrap_outcomes(module)

    async def collect():
        rows = [
            ({"agent_ref": {"name": "simple"}, "_ng_task_index": 0}, {"reward": 1.0}),
            ({"agent_ref": {"name": "simple"}, "_ng_task_index": 1}, {"_ng_failure_class": "agent_run_error"}),
        ]
        return [await future for future in Helper()._run_examples_with_metadata(rows)]

    with capture_failures() as telemetry:
        assert len(asyncio.run(collect())) == 2
        counted = {
            (
                p["attributes"][names.ROLLOUT_AGENT],
                p["attributes"][names.ROLLOUT_OUTCOME],
                p["attributes"][names.KIND],
            ): p["value"]
            for p in telemetry.metric_points(names.ROLLOUT_METRIC)
        }
        assert counted == {("simple", "measured", "none"): 1, ("simple", "failed", "agent_run_error"): 1}


def test_agent_names_are_bounded_like_kinds():
    guard = recovery.NameGuard(2)
    assert [guard.label(name) for name in ("a", "b", "c", "a")] == ["a", "b", "_other", "a"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gauge(telemetry, metric: str) -> float:
    (point,) = telemetry.metric_points(metric)
    return float(point["value"])


def test_a_rollout_in_flight_past_the_stall_age_is_counted_stalled_and_one_event_until_it_ends():
    clock = Clock()
    previous = recovery.set_in_flight(recovery.RolloutsInFlight(clock))
    try:
        with capture_failures() as telemetry:
            with telemetry.tracer.start_as_current_span("POST") as run_span:
                loop = recovery.RetryLoop("collection")
                loop.span_context = run_span.get_span_context()
            entry = recovery.in_flight().start(loop, stalled_after=3600)
            clock.now += 42
            assert (gauge(telemetry, names.IN_FLIGHT_METRIC), gauge(telemetry, names.OLDEST_AGE_METRIC)) == (1, 42)
            assert gauge(telemetry, names.STALLED_METRIC) == 0
            recovery.in_flight().check(entry)
            recovery.in_flight().check(entry)  # once
            (event,) = telemetry.failure_events()
            assert (event[names.KIND], event[names.BOUNDARY], event[names.ROLLOUT_STALLED]) == (
                "agent_timeout",
                "collection",
                True,
            )
            assert event[names.ROLLOUT_AGE] == 42 and event[names.RECOVERED] is True
            (stalled_span,) = [s for s in telemetry.spans() if s["name"] == "ng.failure agent_timeout"]
            assert stalled_span["context"]["trace_id"] == run_span.get_span_context().trace_id  # the rollout's trace
            assert gauge(telemetry, names.STALLED_METRIC) == 1
            recovery.in_flight().end(entry)
            assert [gauge(telemetry, m) for m in (names.IN_FLIGHT_METRIC, names.OLDEST_AGE_METRIC)] == [0, 0]
            assert gauge(telemetry, names.STALLED_METRIC) == 0  # the alert clears when it ends
    finally:
        recovery.set_in_flight(previous)


def test_the_stall_check_runs_on_the_event_loop_at_the_configured_age():
    async def scenario():
        loop = recovery.RetryLoop("collection")
        recovery.in_flight().start(loop, stalled_after=0.05)
        await asyncio.sleep(0.2)
        recovery.in_flight().end(loop.rollout)

    with capture_failures() as telemetry:
        asyncio.run(scenario())
        assert [e[names.ROLLOUT_STALLED] for e in telemetry.failure_events()] == [True]


# -- JSON lines when OpenTelemetry is off -------------------------------------------------------


@pytest.fixture
def otel_off(tmp_path):
    """A recorder with no SDK tracer (as without providers, or OTEL_SDK_DISABLED=true), whose
    JSON lines go to a file."""
    path = tmp_path / "ng-otel.jsonl"
    recorder = FailureRecorder(
        NoOpTracerProvider().get_tracer("t"), MeterProvider().get_meter("m"), None, Settings.resolve(environ={})
    )
    recorder.lines = JsonLines("auto", str(path))
    previous, was_enabled = get_recorder(), is_enabled()
    install_recorder(recorder)
    yield path
    recorder.lines.close()
    install_recorder(previous, enabled=was_enabled)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_with_opentelemetry_off_each_failure_retry_outcome_and_rollout_outcome_is_one_json_line(otel_off):
    cause = NgFailureEvent("provider_unavailable", "backend overloaded\nsecond line", boundary="model", http_status=500)
    effect = NgFailureEvent("agent_run_error", "x" * 5000, boundary="agent")
    effect.__cause__ = cause
    from ng_otel import record_failure

    record_failure(effect)
    with recovery.retry_loop("model") as loop:
        loop.retry(NgFailureEvent("transport_timeout", "slow", boundary="model"))
    recovery.count_rollout("simple_agent", "failed", "agent_run_error", event_id=effect.event_id)
    lines = read_lines(otel_off)
    assert [line[names.LINE_RECORD] for line in lines] == [
        "ng.failure",
        "ng.failure",
        "ng.failure",
        "ng.retry",
        "ng.rollout",
    ]
    by_id = {line[names.ID]: line for line in lines if line[names.LINE_RECORD] == "ng.failure"}
    assert by_id[effect.event_id][names.CAUSE_ID] == cause.event_id  # ids included
    assert by_id[cause.event_id][names.HTTP_STATUS] == 500 and by_id[cause.event_id][names.CLASS] == "infra"
    assert len(by_id[effect.event_id][names.REASON]) <= 2000  # the reason bounded
    assert len(otel_off.read_bytes().splitlines()) == 5  # a newline in a reason stays inside its line
    retry = lines[3]
    assert (retry[names.RETRY_OUTCOME], retry[names.RESEND_COUNT], retry[names.KIND]) == (
        "succeeded_after_retry",
        1,
        "transport_timeout",
    )
    assert lines[4] == {**lines[4], names.ROLLOUT_OUTCOME: "failed", names.ID: effect.event_id}
    assert all(isinstance(line[names.LINE_TIME], int) for line in lines)


def test_summary_and_show_read_the_json_lines(otel_off):
    from ng_otel import record_failure

    cause = NgFailureEvent("provider_unavailable", "backend overloaded", boundary="model")
    effect = NgFailureEvent("agent_run_error", "run failed", boundary="agent")
    effect.__cause__ = cause
    record_failure(effect)
    recovery.count_rollout("simple_agent", "measured")
    recovery.count_rollout("simple_agent", "failed", "agent_run_error", event_id=effect.event_id)
    with recovery.retry_loop("model") as loop:
        loop.retry(NgFailureEvent("transport_timeout", "slow", boundary="model"))
    figures = summarise([otel_off]).to_json()
    assert (figures["events"], figures["failed_rows"], figures["skipped"]) == (3, 1, 0)  # the retried attempt too
    assert figures["root_kinds"] == {"provider_unavailable": 1}
    # The same facts the metrics would count: each outcome once, from its line.
    assert figures["rollout_outcomes"] == {"measured": 1, "failed": 1}
    assert figures["retry_outcomes"] == {"succeeded_after_retry": 1}
    groups = [set(group.events) for group in groups_from_lines(file_lines(otel_off))]
    assert {cause.event_id, effect.event_id} in groups and len(groups) == 2  # the chain; the retried attempt


def test_with_an_sdk_no_line_is_written_unless_jsonl_is_asked_for(tmp_path):
    with capture_failures() as telemetry:
        auto, always = JsonLines("auto", str(tmp_path / "auto")), JsonLines("jsonl", str(tmp_path / "always"))
        for lines in (auto, always):
            telemetry.recorder.lines = lines
            observe_failure(NgFailureEvent("transport_timeout", "slow", boundary="model"))
            lines.close()
        assert not (tmp_path / "auto").exists()
        (line,) = read_lines(tmp_path / "always")
        assert line[names.LINE_TRACE_ID] and line[names.LINE_SPAN_ID]  # the span it went on


def test_whether_a_line_is_due_is_answered_for_the_tracer_asked_about_whichever_was_asked_before(tmp_path):
    # The answer for a tracer that is no proxy is kept; asking about another tracer in between
    # must not leave the first one's answer standing for it, nor the other's for the first.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    sdk, noop = SdkTracerProvider().get_tracer("t"), NoOpTracerProvider().get_tracer("t")
    proxy = trace.ProxyTracer("t")
    proxied_is_sdk = isinstance(trace.get_tracer_provider(), SdkTracerProvider)
    lines = JsonLines("auto", str(tmp_path / "lines"))
    for tracer, due in [(sdk, False), (noop, True), (sdk, False), (proxy, not proxied_is_sdk), (sdk, False)] * 2:
        assert lines.active(tracer) is due, tracer


def test_the_recovery_names_are_documented():
    text = (DOCS / "conventions.md").read_text()
    for name in (
        names.RETRY_EXHAUSTED,
        names.RETRY_OUTCOME,
        *names.RETRY_OUTCOMES,
        names.RETRY_METRIC,
        names.RETRY_DELAY_METRIC,
        names.ROLLOUT_AGENT,
        names.ROLLOUT_OUTCOME,
        *names.ROLLOUT_OUTCOMES,
        names.ROLLOUT_METRIC,
        names.ROLLOUT_STALLED,
        names.ROLLOUT_AGE,
        names.IN_FLIGHT_METRIC,
        names.OLDEST_AGE_METRIC,
        names.STALLED_METRIC,
        names.LINE_RECORD,
        *names.LINE_RECORDS,
        names.LINE_TIME,
        names.LINE_TRACE_ID,
        names.LINE_SPAN_ID,
        names.ROLLOUT_TASK_INDEX,
        names.ROLLOUT_INDEX,
    ):
        assert f"`{name}`" in text, name


def test_a_json_line_names_the_service_as_the_sdk_reads_the_standard_variables(monkeypatch, tmp_path):
    # OTEL_RESOURCE_ATTRIBUTES values are percent-encoded (the spec's W3C baggage octets).
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=rl,service.name=policy%20model")
    lines = JsonLines("jsonl", str(tmp_path / "lines.jsonl"))
    lines.write(names.EVENT, {names.ID: "e1"})
    lines.close()
    (line,) = read_lines(tmp_path / "lines.jsonl")
    assert line[names.LINE_SERVICE] == "policy model"
