import pytest
from pydantic import ValidationError

from ng_otel.contract import (
    ROW_EVENTS,
    ROW_FAILURE_ID,
    ROW_OMITTED,
    EpisodeFailure,
    EpisodeId,
    FailureClass,
    FailureClassifier,
    InvalidRolloutResult,
    RolloutFailure,
    RolloutFailureRecord,
    StaleRolloutResult,
    VerifyOutcome,
    classify_failure,
    http_status_is_infra,
)
from ng_otel.contract.events import MAX_REASON_CHARS
from tests.conftest import FAILURE, rollout


def test_episode_failure_has_exactly_the_four_v1_fields():
    assert set(EpisodeFailure.model_fields) == {"failure_reason", "terminal", "failure_kind", "stage"}
    with pytest.raises(ValidationError):
        EpisodeFailure(**FAILURE, failure_report={})


def test_episode_failure_rejects_a_reason_past_the_bound_instead_of_cutting_it():
    assert EpisodeFailure(failure_reason="r" * MAX_REASON_CHARS, terminal=False)
    with pytest.raises(ValidationError, match="failure_reason"):
        EpisodeFailure(failure_reason="r" * (MAX_REASON_CHARS + 1), terminal=False)


def test_episode_failure_leaves_unset_kind_and_stage_out_of_every_dump():
    bare = EpisodeFailure(failure_reason="lost", terminal=True)
    assert bare.model_dump() == {"failure_reason": "lost", "terminal": True}
    assert bare.model_dump_json() == '{"failure_reason":"lost","terminal":true}'
    assert EpisodeFailure.model_validate(FAILURE).model_dump() == FAILURE


@pytest.mark.parametrize(("given", "read"), [("true", True), (1, True), ("no", False), (0, False)])
def test_episode_failure_takes_lax_booleans_like_upstream(given, read):
    assert EpisodeFailure(failure_reason="r", terminal=given).terminal is read


def test_episode_failure_keeps_an_unregistered_or_malformed_kind():
    assert EpisodeFailure(failure_reason="r", terminal=True, failure_kind="Not A Kind").failure_kind == "Not A Kind"


def test_episode_id_is_an_object_with_a_rollout_id_and_an_attempt():
    episode = EpisodeId(rollout_id="task-3.r_1")
    assert episode.model_dump() == {"rollout_id": "task-3.r_1", "attempt": 0}
    assert episode.capture_key == "task-3.r_1"
    assert EpisodeId(rollout_id="task-3", attempt=2).capture_key == "task-3-a2"


@pytest.mark.parametrize(
    "bad",
    [
        "ep-1",
        {"rollout_id": ""},
        {"rollout_id": "-leading"},
        {"rollout_id": "has space"},
        {"rollout_id": "task-a2"},
        {"rollout_id": "t", "attempt": -1},
        {"rollout_id": "t", "extra": 1},
    ],
)
def test_episode_id_rejects_what_upstream_rejects(bad):
    with pytest.raises(ValidationError):
        EpisodeId.model_validate(bad)


def test_rollout_record_defaults_to_version_one_and_is_frozen():
    record = RolloutFailureRecord.model_validate(rollout())
    assert record.schema_version == 1
    with pytest.raises(ValidationError):
        record.run_id = "other"  # type: ignore[misc]
    assert RolloutFailureRecord.model_validate_json(record.model_dump_json()) == record


@pytest.mark.parametrize(
    "bad",
    [
        {"schema_version": 2},
        {"unknown": 1},
        {"run_id": ""},
        {"episode_id": "ep-1"},
        {"episode_id": {"rollout_id": "ep-1", "attempt": -1}},
        {"http_status": 700},
        {"exception_type": "E" * 2001},
        {"source": "environment", "delivery": "possibly_delivered"},
        {"failure": {**FAILURE, "extra": 1}},
    ],
)
def test_rollout_record_rejects_unknown_fields_versions_and_bad_delivery(bad):
    with pytest.raises(ValidationError):
        RolloutFailureRecord.model_validate(rollout(**bad))


def test_environment_reported_failure_requires_delivery():
    assert RolloutFailureRecord.model_validate(rollout(source="environment", delivery="delivered"))


def test_rollout_failure_is_the_same_record_under_its_released_name():
    assert RolloutFailure is RolloutFailureRecord


def test_sidecar_class_is_the_kind_else_rollout_collections_class_for_the_reporter():
    assert RolloutFailureRecord.model_validate(rollout()).sidecar_failure_class == "session_lost"
    unkinded = {"failure_reason": "?", "terminal": True}
    collector = RolloutFailureRecord.model_validate(rollout(failure=unkinded))
    assert collector.sidecar_failure_class == "agent_request_failed"
    environment = RolloutFailureRecord.model_validate(
        rollout(failure=unkinded, source="environment", delivery="delivered")
    )
    assert environment.sidecar_failure_class == "environment_server_failed"


def test_stale_result_is_an_invalid_result():
    assert issubclass(StaleRolloutResult, InvalidRolloutResult) and issubclass(InvalidRolloutResult, ValueError)


def test_verify_outcome_fields_are_orthogonal_and_plain_zero_is_not_masked():
    assert VerifyOutcome.from_response({"reward": 0.0}).mask_sample is False
    degraded = VerifyOutcome.from_response({"reward": 0.5, "failure_kind": "judge_unparseable", "extra": "kept out"})
    assert degraded.mask_sample is False and degraded.failure_kind == "judge_unparseable"

    class Response:
        reward = 0.0
        mask_sample = True
        failure_kind = "session_lost"
        failure_reason = "x" * 3000

    masked = VerifyOutcome.from_response(Response())
    assert masked.mask_sample and masked.failure_reason == "x" * 3000  # bounded on the event, not here


@pytest.mark.parametrize(
    ("response", "masked"),
    [
        ({"reward": 0.0, "mask_sample": 1}, True),
        ({"reward": 0.0, "mask_sample": "true"}, True),
        ({"reward": 0.0, "instance_config": {"mask_sample": True}}, True),
        ({"reward": 0.0, "instance_config": {"mask_sample": "yes"}}, True),
        ({"reward": 0.0, "mask_sample": None, "instance_config": {"mask_sample": True}}, True),
        ({"reward": 0.0, "mask_sample": False, "instance_config": {"mask_sample": True}}, False),
        ({"reward": 0.0, "mask_sample": True, "instance_config": {"mask_sample": False}}, True),
        ({"reward": 0.0, "instance_config": {"mask_sample": "maybe"}}, False),
        ({"reward": 0.0, "instance_config": "not a mapping"}, False),
    ],
)
def test_top_level_mask_sample_decides_then_the_older_instance_config(response, masked):
    assert VerifyOutcome.from_response(response).mask_sample is masked


@pytest.mark.parametrize(
    "bad",
    [{"reward": "NaN please"}, {"reward": 0.0, "mask_sample": "maybe"}, {"reward": 0.0, "failure_reason": 7}, {}],
)
def test_verify_outcome_rejects_what_base_verify_response_rejects(bad):
    with pytest.raises(ValueError):
        VerifyOutcome.from_response(bad)


def test_verify_outcome_keeps_any_kind_and_warns():
    assert VerifyOutcome.from_response({"reward": 0.0, "failure_kind": "Not A Kind"}).failure_kind == "Not A Kind"


def test_row_keys_are_the_contracts():
    assert (ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED) == (
        "_ng_failure_events",
        "_ng_failure_id",
        "_ng_failure_events_omitted",
    )


@pytest.mark.parametrize(
    ("status", "infra"),
    [
        (500, True),
        (503, True),
        (599, True),
        (408, True),
        (429, True),
        (425, False),
        (400, False),
        (404, False),
        (422, False),
        (200, False),
    ],
)
def test_http_status_is_infra(status, infra):
    assert http_status_is_infra(status) is infra


@pytest.mark.parametrize(
    ("kind", "status", "expected"),
    [
        ("transport_timeout", None, "infra"),
        ("transport_made_up", None, "infra"),
        ("provider_oom_killed", None, "infra"),
        ("session_lost", None, "infra"),
        ("judge_failed", None, "infra"),
        ("cohort_incomplete", None, "infra"),
        ("judge_unparseable", None, "data"),
        ("protocol_violation", None, "data"),
        ("transport:timeout", None, "data"),
        ("agent_run_error", None, "data"),
        ("transport_timeout", 400, "data"),
        ("judge_unparseable", 503, "infra"),
    ],
)
def test_status_decides_when_present_otherwise_the_kind(kind, status, expected):
    assert classify_failure(kind, status) == FailureClass(expected)


def test_a_terminal_episode_failure_is_data_and_an_unkinded_one_is_data():
    assert classify_failure("transport_timeout", 503, terminal=True) is FailureClass.DATA
    assert classify_failure(None) is FailureClass.DATA
    assert classify_failure(None, 503) is FailureClass.INFRA


def test_users_can_override_the_classification():
    strict = FailureClassifier(
        infra_kinds=frozenset({"judge_unparseable"}), infra_kind_prefixes=(), retriable_statuses=frozenset()
    )
    assert strict.classify("judge_unparseable") is FailureClass.INFRA
    assert strict.classify("transport_timeout") is FailureClass.DATA
    assert strict.classify("x", 429) is FailureClass.DATA
