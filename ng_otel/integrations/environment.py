"""Failures that are returned, not raised: handled episode failures and verify outcomes.

Seeds: gym-failure-observations.txt (``handled_episode_failure``, the v1 ``EpisodeFailure``
with ``failure_report`` beside it) and gym-pr-2611-mask-sample.txt (``reward``,
``mask_sample``, ``failure_kind``, ``failure_reason`` are orthogonal; a masked sample is a
failure of measurement, not a zero score). Both reach the same telemetry and reports as
raised failures, without an error status on the span: the operation itself succeeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ng_otel.contract.events import NgFailureEvent
from ng_otel.contract.records import EpisodeFailure, VerifyOutcome
from ng_otel.contract.report import FailureReport, failure_report_for
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import current_failure_log
from ng_otel.otel.recorder import get_recorder, is_enabled

VERIFY_OPERATION = "verify"
NO_REASON = "verify named a failure_kind without a failure_reason"


@dataclass(frozen=True)
class HandledFailure:
    """An environment's handled failure with its local decision and evidence, kept apart."""

    event: NgFailureEvent
    terminal: bool
    partial: Any = None


_handled: ContextVar[tuple[HandledFailure, ...]] = ContextVar("ng_otel_handled_failures", default=())


def handled_episode_failure(
    failure_kind: str,
    failure_reason: str,
    *,
    stage: str,
    terminal: bool,
    partial: Any = None,
    boundary: str = "environment",
    http_status: int | None = None,
    operation: str | None = None,
    cause: BaseException | None = None,
) -> NgFailureEvent:
    """Build and record an episode failure the environment handles instead of raising.

    Pass ``cause=err`` inside ``except ... as err`` for the explicit cause. The first terminal
    failure becomes the reply's own failure; later ones (cleanup) are reported beside it. The
    event's fields are validated like any ``NgFailureEvent`` (``ValueError`` for a bad kind or
    stage: a bug at the call site); recording never raises.
    """
    event = NgFailureEvent(
        failure_kind, failure_reason, boundary=boundary, stage=stage, http_status=http_status, operation=operation
    )
    if cause is not None:
        event.__cause__ = cause
    _handled.set((*_handled.get(), HandledFailure(event, terminal, partial)))
    report = failure_report_for(event)
    if report is not None:
        _record_returned(report, decisive=terminal)
    return event


def episode_response(result: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The environment's response after cleanup: ``result`` plus, when a failure was handled,
    the v1 ``episode_failure`` (exactly its four fields, the kind its own, never a cause's),
    ``failure_report`` beside it (late cleanup failures included) and ``partial`` evidence.
    It consumes the handled failures: call it once, after cleanup."""
    response = dict(result or {})
    handled = _handled.get()
    if not handled:
        return response
    _handled.set(())  # the episode is answered: its failures go with this response only
    decisive = next((item for item in handled if item.terminal), handled[0])
    event = decisive.event
    envelope = EpisodeFailure(
        failure_reason=event.failure_reason,
        terminal=decisive.terminal,
        failure_kind=event.failure_kind,
        stage=event.stage,
    )
    response["episode_failure"] = envelope.model_dump(mode="json")
    log = current_failure_log()
    report = log.report if log else _report_of(handled, decisive)
    response["failure_report"] = report.to_dict()
    evidence = [item.partial for item in handled if item.partial is not None]
    if evidence:
        response["partial"] = evidence
    return response


def _report_of(handled: tuple[HandledFailure, ...], decisive: HandledFailure) -> FailureReport:
    # Without a request's failure log (no middleware): the same report the log would hold.
    report = (failure_report_for(decisive.event) if decisive.terminal else None) or FailureReport()
    for item in handled:
        report = report.merge(failure_report_for(item.event) or FailureReport())
    return report


@guarded
def record_verify_outcome(response: Any) -> VerifyOutcome | None:
    """Count one verify response in ``ng.verify.outcomes`` (masked or not, by kind or
    ``none``), and record a named ``failure_kind`` as an ``ng.failure`` event with
    ``ng.verify.masked``. The reward is never a label nor a metric. Returns the outcome read,
    ``None`` for a body that is not a verify response. Call it once per response (the ASGI
    middleware does, on ``/verify``). Never raises."""
    if not is_enabled():
        return None
    try:
        outcome = VerifyOutcome.from_response(response)
    except (TypeError, ValueError):
        return None  # not a verify response: nothing to count, nothing to break
    recorder = get_recorder()
    kind = outcome.failure_kind
    label = recorder.kinds.label(kind) if kind is not None else names.VERIFY_NO_KIND
    recorder.verify_outcomes.add(1, {names.VERIFY_MASKED: outcome.mask_sample, names.KIND: label})
    if kind is not None:
        event = NgFailureEvent(
            kind,
            outcome.failure_reason or NO_REASON,
            boundary="resources_server",
            stage="verification",
            operation=VERIFY_OPERATION,
        )
        report = failure_report_for(event)
        if report is not None:
            _record_returned(report, decisive=True, extra={names.VERIFY_MASKED: outcome.mask_sample})
    return outcome


@guarded
def _record_returned(report: FailureReport, *, decisive: bool, extra: Mapping[str, Any] | None = None) -> None:
    # A returned failure is the reply's own unless one came first; it never marks the span
    # ERROR, because the operation did not fail: it reported a failure.
    log = current_failure_log()
    own = decisive and (log is None or log.report.failure_id is None)
    get_recorder().record(report, own=False, recovered=not own, event_attributes=extra)
    if log is not None:
        log.add(report, own=own)
