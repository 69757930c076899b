"""The Gym failure contract: standard library, pydantic, typing_extensions and orjson only, so
data tooling can read failure records without a server or telemetry stack. docs/contract.md
says which parts follow released NeMo Gym code, which Gym Main's documentation, and which are
ng_otel's own."""

from ng_otel.contract.classify import (
    FailureClass,
    FailureClassifier,
    classify_failure,
    http_status_is_infra,
)
from ng_otel.contract.events import BOUNDARIES, STAGES, ForeignError, GymFailure, NgFailureEvent, is_gym_failure
from ng_otel.contract.header import MAX_HEADER_BYTES, REPORT_HEADER
from ng_otel.contract.kinds import FAILURE_KINDS, is_namespaced, is_registered, validate_failure_kind
from ng_otel.contract.records import (
    ROW_EVENTS,
    ROW_FAILURE_ID,
    ROW_OMITTED,
    EpisodeFailure,
    EpisodeId,
    InvalidRolloutResult,
    RolloutFailure,
    RolloutFailureRecord,
    StaleRolloutResult,
    VerifyOutcome,
)
from ng_otel.contract.report import FailureReport, failure_report_for, find_boundary_failure, rebuild_failure

__all__ = [
    "BOUNDARIES",
    "FAILURE_KINDS",
    "MAX_HEADER_BYTES",
    "REPORT_HEADER",
    "ROW_EVENTS",
    "ROW_FAILURE_ID",
    "ROW_OMITTED",
    "STAGES",
    "EpisodeFailure",
    "EpisodeId",
    "FailureClass",
    "FailureClassifier",
    "FailureReport",
    "ForeignError",
    "GymFailure",
    "InvalidRolloutResult",
    "NgFailureEvent",
    "RolloutFailure",
    "RolloutFailureRecord",
    "StaleRolloutResult",
    "VerifyOutcome",
    "classify_failure",
    "failure_report_for",
    "find_boundary_failure",
    "http_status_is_infra",
    "is_gym_failure",
    "is_namespaced",
    "is_registered",
    "rebuild_failure",
    "validate_failure_kind",
]
