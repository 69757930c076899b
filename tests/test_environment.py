import asyncio
import json

import pytest

from ng_otel import NgFailureEvent
from ng_otel.contract import EpisodeFailure, FailureReport
from ng_otel.gym.episodes import episode_response, handled_episode_failure, record_verify_outcome
from ng_otel.integrations import instrument_app
from ng_otel.otel import names
from ng_otel.otel.failure_log import close_failure_log, open_failure_log
from ng_otel.testing import capture_failures
from tests.conftest import call

IDENTITY = {"episode_id": {"rollout_id": "task-1", "attempt": 0}, "task_id": {"taskset": "s", "task_id": "t"}}


def run_episode(response=None):
    """An environment handling a lost session, then a failing cleanup, inside one request."""
    log = open_failure_log()
    try:
        cause = NgFailureEvent("transport_peer_drop", "sandbox connection reset", boundary="environment")
        try:
            raise cause
        except NgFailureEvent as err:
            lost = handled_episode_failure(
                "session_lost", "session lost", stage="agent", terminal=True, partial={"steps": 2}, cause=err
            )
        late = handled_episode_failure("session_release_failed", "release failed", stage="cleanup", terminal=False)
        answer = episode_response(response if response is not None else {**IDENTITY, "result": {"trajectory": ["a"]}})
        return answer, cause, lost, late, log.report
    finally:
        close_failure_log(log)


def test_episode_response_carries_the_failure_under_failure_and_the_report_beside_it():
    with capture_failures() as telemetry, telemetry.tracer.start_as_current_span("POST /episode"):
        response, cause, lost, late, _ = run_episode()
    assert set(response) == {"episode_id", "task_id", "result", "failure", "failure_report"}
    assert response["result"] is None  # a terminal failure is the answer: exactly one of the two
    assert response["failure"] == {
        "failure_reason": "session lost",
        "terminal": True,
        "failure_kind": "session_lost",
        "stage": "agent",
    }
    assert set(response["failure"]) == set(EpisodeFailure.model_fields)
    report = FailureReport.from_dict(response["failure_report"])
    assert report.failure_id == lost.event_id
    assert set(report.events) == {cause.event_id, lost.event_id, late.event_id}
    assert report.events[lost.event_id]["cause_id"] == cause.event_id
    assert "partial" not in response  # upstream's response and v1 failure reject unknown keys


def test_the_envelope_never_borrows_a_causes_kind():
    with capture_failures():
        response, *_ = run_episode()
    assert response["failure"]["failure_kind"] == "session_lost"  # not transport_peer_drop


def test_an_unkinded_handled_failure_leaves_kind_out_of_the_envelope():
    with capture_failures():
        event = handled_episode_failure("agent_timeout", "slow", stage="agent", terminal=False)
        response = episode_response(IDENTITY)
    assert response["failure"] == {
        "failure_reason": "slow",
        "terminal": False,
        "failure_kind": "agent_timeout",
        "stage": "agent",
    }
    assert FailureReport.from_dict(response["failure_report"]).events.keys() == {event.event_id}


def test_a_result_with_only_a_failed_cleanup_keeps_its_result_and_reports_the_cleanup():
    with capture_failures():
        late = handled_episode_failure("session_release_failed", "release failed", stage="cleanup", terminal=False)
        response = episode_response({**IDENTITY, "result": {"reward": 1.0}})
    assert response["result"] == {"reward": 1.0} and "failure" not in response
    report = FailureReport.from_dict(response["failure_report"])
    assert report.failure_id is None and set(report.events) == {late.event_id}


def test_the_report_can_be_left_out_for_a_response_model_that_does_not_declare_it():
    with capture_failures():
        response, *_ = run_episode({**IDENTITY, "result": None})
    assert "failure_report" in response
    with capture_failures():
        handled_episode_failure("session_lost", "lost", stage="agent", terminal=True)
        bare = episode_response(IDENTITY, with_report=False)
    assert set(bare) == {"episode_id", "task_id", "result", "failure"}


def test_handled_failures_reach_telemetry_once_without_error_status():
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /episode"):
            _, cause, lost, late, _ = run_episode()
    (span,) = telemetry.spans()
    assert span["status"] == "UNSET"
    recovered = {e["ng.failure.id"]: e["ng.failure.recovered"] for e in telemetry.failure_events()}
    assert recovered == {cause.event_id: False, lost.event_id: False, late.event_id: True}
    telemetry.assert_exported_once()
    assert telemetry.count() == 3


def test_a_terminal_episode_failure_is_data_whatever_its_kind_as_nemo_rl_classifies_it():
    with capture_failures() as telemetry:
        _, cause, lost, late, _ = run_episode()
    classes = {e["ng.failure.kind"]: e["ng.failure.class"] for e in telemetry.failure_events()}
    # session_* kinds are infrastructure; the environment's terminal decision makes the
    # episode's own failure DATA, while its cause and the non-terminal cleanup keep their kind's.
    assert classes == {"session_lost": "data", "transport_peer_drop": "infra", "session_release_failed": "infra"}
    assert telemetry.count(kind="session_lost", **{"class": "data"}) == 1


def test_without_a_handled_failure_the_response_is_unchanged():
    assert episode_response({**IDENTITY, "result": {"reward": 1.0}}) == {**IDENTITY, "result": {"reward": 1.0}}


@pytest.mark.parametrize(
    ("response", "masked", "kind", "event"),
    [
        (
            {"reward": 0.0, "mask_sample": True, "failure_kind": "session_lost", "failure_reason": "lost"},
            True,
            "session_lost",
            True,
        ),
        ({"reward": 0.5, "failure_kind": "judge_unparseable"}, False, "judge_unparseable", True),
        ({"reward": 0.0}, False, "none", False),
        ({"reward": 0.0, "mask_sample": True}, True, "none", False),
        ({"reward": 0.0, "mask_sample": 1, "failure_kind": "browser_crashed"}, True, "browser_crashed", True),
        ({"reward": 0, "instance_config": {"mask_sample": True}}, True, "none", False),
        ({"reward": 0.0, "failure_kind": "Not A Kind"}, False, "_invalid", False),
    ],
)
def test_every_verify_response_counts_once_and_a_named_kind_becomes_an_event(response, masked, kind, event):
    with capture_failures() as telemetry:
        outcome = record_verify_outcome(response)
    assert outcome is not None and outcome.mask_sample is masked
    points = telemetry.metric_points("ng.verify.outcomes")
    assert points == [{"attributes": {"ng.verify.masked": masked, "ng.failure.kind": kind}, "value": 1}]
    assert set(points[0]["attributes"]) == names.VERIFY_LABELS
    events = telemetry.failure_events()
    assert len(events) == int(event)
    if event:
        assert events[0]["ng.verify.masked"] is masked
        assert events[0]["ng.failure.boundary"] == "resources_server"
        assert events[0]["ng.failure.stage"] == "verification"
        assert telemetry.count(kind=kind) == 1


def test_a_degraded_but_scored_sample_is_never_recorded_as_masked():
    with capture_failures() as telemetry:
        record_verify_outcome({"reward": 0.7, "mask_sample": False, "failure_kind": "judge_unparseable"})
    assert telemetry.failure_events()[0]["ng.verify.masked"] is False
    assert telemetry.metric_points("ng.verify.outcomes")[0]["attributes"]["ng.verify.masked"] is False


def test_reward_is_never_a_label_or_a_metric():
    with capture_failures() as telemetry:
        for reward in (0.0, 0.25, 1.0):
            record_verify_outcome({"reward": reward})
    (point,) = telemetry.metric_points("ng.verify.outcomes")
    assert point["value"] == 3 and "reward" not in json.dumps(point)
    assert telemetry.metric_points("reward") == []


@pytest.mark.parametrize(
    "hostile",
    [
        None,
        "text",
        5,
        [],
        {"reward": "NaN please"},
        {"reward": 0.0, "mask_sample": "maybe"},
        {"reward": 0.0, "failure_kind": 7},
        {"reward": 0.0, "failure_reason": 7},
    ],
)
def test_bodies_base_verify_response_rejects_never_raise_and_count_nothing(hostile):
    with capture_failures() as telemetry:
        assert record_verify_outcome(hostile) is None
    assert telemetry.metric_points("ng.verify.outcomes") == []


def test_odd_kinds_past_the_guards_limit_are_still_counted_under_other():
    with capture_failures(max_kinds=1) as telemetry:
        for kind in ("odd_one", "odd_two", "odd_three"):
            assert record_verify_outcome({"reward": 0.0, "mask_sample": True, "failure_kind": kind}) is not None
    points = {p["attributes"]["ng.failure.kind"]: p["value"] for p in telemetry.metric_points("ng.verify.outcomes")}
    assert points == {"odd_one": 1, "_other": 2}
    assert len(telemetry.failure_events()) == 3  # events keep the raw kind


def test_huge_reasons_are_bounded_on_the_event():
    with capture_failures() as telemetry:
        record_verify_outcome({"reward": 0.0, "failure_kind": "verifier_error", "failure_reason": "x" * 100_000})
    assert len(telemetry.failure_events()[0]["ng.failure.reason"]) == 2000


def verify_app(path="/verify"):
    from fastapi import FastAPI

    app = FastAPI()

    @app.post(path)
    async def verify(body: dict):
        return body

    return app


def test_the_middleware_records_verify_outcomes_and_reports_them():
    body = json.dumps({"reward": 0.0, "mask_sample": True, "failure_kind": "session_lost"}).encode()
    with capture_failures() as telemetry:
        status, headers, content = asyncio.run(call(instrument_app(verify_app()), "/verify", body))
    assert status == 200 and json.loads(content)["mask_sample"] is True
    report = FailureReport.from_header(headers["x-ng-failure-report"])
    assert [r["failure_kind"] for r in report.events.values()] == ["session_lost"]
    assert telemetry.count("ng.verify.outcomes") == 1


def test_verify_recording_can_be_switched_off_or_pointed_elsewhere():
    body = json.dumps({"reward": 0.0, "mask_sample": True}).encode()
    with capture_failures() as telemetry:
        asyncio.run(call(instrument_app(verify_app(), reply_paths=()), "/verify", body))
        asyncio.run(call(instrument_app(verify_app("/score"), reply_paths=("/score",)), "/score", body))
    assert telemetry.count("ng.verify.outcomes") == 1


def test_a_hostile_verify_reply_passes_through_untouched():
    body = json.dumps({"reward": "nope", "failure_reason": "y" * 50_000}).encode()
    with capture_failures() as telemetry:
        status, headers, content = asyncio.run(call(instrument_app(verify_app()), "/verify", body))
    assert status == 200 and json.loads(content)["reward"] == "nope"
    assert "x-ng-failure-report" not in headers and telemetry.count("ng.verify.outcomes") == 0
