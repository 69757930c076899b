import pytest
from pydantic import ValidationError

from ng_otel.contract import (
    ROW_EVENTS,
    ROW_FAILURE_ID,
    ROW_OMITTED,
    EpisodeFailure,
    FailureClass,
    FailureClassifier,
    InvalidRolloutResult,
    RolloutFailureRecord,
    StaleRolloutResult,
    VerifyOutcome,
    classify_failure,
    http_status_is_infra,
)
from ng_otel.contract.events import MAX_REASON_CHARS, TRUNCATION_MARKER

FAILURE = {"failure_reason": "session reset failed", "terminal": True, "failure_kind": "session_lost", "stage": "seed"}


def rollout(**extra):
    base = {
        "episode_id": "ep-1",
        "run_id": "run-1",
        "source": "collector",
        "delivery": "possibly_delivered",
        "failure": FAILURE,
    }
    return base | extra


def test_episode_failure_has_exactly_the_four_v1_fields():
    assert set(EpisodeFailure.model_fields) == {"failure_reason", "terminal", "failure_kind", "stage"}
    with pytest.raises(ValidationError):
        EpisodeFailure(**FAILURE, failure_report={})
    long = EpisodeFailure(failure_reason="r" * 5000, terminal=False)
    assert len(long.failure_reason) == MAX_REASON_CHARS and long.failure_reason.endswith(TRUNCATION_MARKER)


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
        {"episode_id": ""},
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


def test_sidecar_class_never_invents_a_kind():
    assert RolloutFailureRecord.model_validate(rollout()).sidecar_failure_class == "session_lost"
    unkinded = rollout(failure={"failure_reason": "?", "terminal": True})
    assert RolloutFailureRecord.model_validate(unkinded).sidecar_failure_class == "unclassified"


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
    assert masked.mask_sample and len(masked.failure_reason) == MAX_REASON_CHARS


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
        (425, True),
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


def test_users_can_override_the_classification():
    strict = FailureClassifier(
        infra_kinds=frozenset({"judge_unparseable"}), infra_kind_prefixes=(), retriable_statuses=frozenset()
    )
    assert strict.classify("judge_unparseable") is FailureClass.INFRA
    assert strict.classify("transport_timeout") is FailureClass.DATA
    assert strict.classify("x", 429) is FailureClass.DATA
